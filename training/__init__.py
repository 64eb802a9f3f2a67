"""AgentTrainer: train LLM agents with reinforcement learning on any backend.

    from training import AgentTrainer
    AgentTrainer(agent_class=MyAgent, env_class=MyEnv, train_dataset=tasks,
                 config={"actor_rollout_ref.model.path": "tiny-char"}).train()
"""

from training.agents import AgentSpec, BaseAgent, BaseEnv
from training.chat_agent import Agent, AgentConfig, ModelConfig
from training.config import Config, ConfigError
from training.environments import MultiTurnEnvironment, SingleTurnEnvironment
from training.processor import TrainerProcessor, register_processor, unregister_processor
from training.rewards import RewardFunction, math_reward_fn
from training.sinks import ConsoleSink, JsonlSink, MetricSink
from training.trainer import AgentTrainer
from training.types import Action, Episode, ModelOutput, RewardOutput, Step, TerminationReason, Trajectory
from training.workflow import RolloutEngine, SimpleWorkflow, TerminationEvent, Workflow

__all__ = [
    "Action",
    "Agent",
    "AgentConfig",
    "AgentSpec",
    "AgentTrainer",
    "BaseAgent",
    "BaseEnv",
    "Config",
    "ConfigError",
    "ConsoleSink",
    "Episode",
    "JsonlSink",
    "MetricSink",
    "ModelConfig",
    "ModelOutput",
    "MultiTurnEnvironment",
    "DatasetRegistry",
    "RewardFunction",
    "RewardOutput",
    "RolloutEngine",
    "SimpleWorkflow",
    "SingleTurnEnvironment",
    "Step",
    "TerminationEvent",
    "TerminationReason",
    "Trajectory",
    "TrainerProcessor",
    "Workflow",
    "math_reward_fn",
    "register_processor",
    "unregister_processor",
]


def __getattr__(name: str):
    # rLLM's DatasetRegistry lives with the datasets code, which imports HF datasets: loaded on first use.
    if name == "DatasetRegistry":
        from training.data import DatasetRegistry

        return DatasetRegistry
    raise AttributeError(f"module 'training' has no attribute {name!r}")
