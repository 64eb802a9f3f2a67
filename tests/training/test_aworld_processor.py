"""AWorld's custom-processor example, as its documentation writes it: only the import lines are
changed to this project's modules."""

from typing import Any, Callable, Union

from datasets import Dataset

from training import Agent, AgentTrainer, TrainerProcessor
from training.log import logger


class MyFrameworkTrainer(TrainerProcessor):
    """My custom training framework adapter."""

    def __init__(self, run_path: str):
        super().__init__(run_path)
        self.framework_config = None

    def train(self):
        logger.info("Starting training with MyFramework...")
        # Your training logic:
        # - Load data
        # - Initialize model
        # - Training loop
        # - Save checkpoints
        logger.info("Training completed!")

    def check_agent(self, agent: Union[str, Agent]):
        if isinstance(agent, str):
            logger.info(f"Loading agent from {agent}")
            # ... loading logic
        else:
            logger.info("Validating Agent object")
            # ... validation logic

    def check_dataset(self,
                      dataset: Union[str, Dataset] = None,
                      test_dataset: Union[str, Dataset] = None):
        if dataset:
            if isinstance(dataset, str):
                logger.info(f"Loading dataset from {dataset}")
                # ... loading logic
            else:
                logger.info("Validating dataset format")
                # ... validation logic
        if test_dataset:
            # similar handling
            pass

    def check_reward(self, reward_func: Union[str, Callable[..., Any]] = None):
        if reward_func:
            if isinstance(reward_func, str):
                logger.info(f"Loading reward function from {reward_func}")
                # ... loading logic
            elif callable(reward_func):
                logger.info("Validating reward function")
                # ... validation logic
            else:
                raise ValueError("Reward func must be callable or file path")

    def check_config(self, config: Union[str, Any] = None):
        if config is None:
            config = self.get_default_config()
        elif isinstance(config, str):
            logger.info(f"Loading config from {config}")
            # ... loading logic
        self.framework_config = config
        return config

    @staticmethod
    def get_default_config():
        return {
            'learning_rate': 1e-4,
            'batch_size': 32,
            'epochs': 10,
            'warmup_steps': 1000,
        }


def test_example_registers_validates_and_trains(caplog, tmp_path):
    AgentTrainer.register_processor('my_framework', MyFrameworkTrainer)
    try:
        with caplog.at_level("INFO", logger="training"):
            trainer = AgentTrainer(agent="path/to/agent_config.yaml", train_dataset="train.csv",
                                   reward_func=lambda task, response: 1.0, run_path=str(tmp_path),
                                   train_engine_name='my_framework')
            trainer.train()
    finally:
        AgentTrainer.unregister_processor('my_framework')
    messages = [r.getMessage() for r in caplog.records]
    checks = ["Loading agent from path/to/agent_config.yaml", "Loading dataset from train.csv",
              "Validating reward function", "Starting training with MyFramework...", "Training completed!"]
    assert [m for m in messages if m in checks] == checks  # check_* ran in AWorld's order, then train
    assert trainer.final_config == MyFrameworkTrainer.get_default_config()
    assert trainer.train_processor.run_path == str(tmp_path)


def test_reward_of_the_wrong_kind_fails_at_construction():
    AgentTrainer.register_processor('my_framework', MyFrameworkTrainer)
    try:
        try:
            AgentTrainer(agent="a.yaml", reward_func=42, train_engine_name='my_framework')
        except ValueError as error:
            assert "Reward func must be callable or file path" in str(error)
        else:
            raise AssertionError("a reward of the wrong kind was accepted")
    finally:
        AgentTrainer.unregister_processor('my_framework')


def test_a_processor_without_inference_says_so(tmp_path):
    AgentTrainer.register_processor('my_framework', MyFrameworkTrainer)
    try:
        trainer = AgentTrainer(agent="a.yaml", run_path=str(tmp_path), train_engine_name='my_framework')
        try:
            trainer.evaluate()
        except NotImplementedError as error:
            assert "MyFrameworkTrainer training processor does not implement inference()" in str(error)
        else:
            raise AssertionError("inference() of a processor without one did not raise")
    finally:
        AgentTrainer.unregister_processor('my_framework')
