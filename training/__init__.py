"""AgentTrainer: train LLM agents with reinforcement learning on any backend.

    from training import AgentTrainer
    AgentTrainer(agent_class=MyAgent, env_class=MyEnv, train_dataset=tasks,
                 config={"actor_rollout_ref.model.path": "tiny-char"}).train()
"""

from training.agents import AgentSpec, BaseAgent, BaseEnv, Workflow
from training.chat_agent import Agent, AgentConfig, ModelConfig
from training.config import Config, ConfigError
from training.processor import TrainerProcessor, register_processor, unregister_processor
from training.sinks import ConsoleSink, JsonlSink, MetricSink
from training.trainer import AgentTrainer
from training.types import Action, Episode, RewardOutput, Step, TerminationReason, Trajectory

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
    "RewardOutput",
    "Step",
    "TerminationReason",
    "Trajectory",
    "TrainerProcessor",
    "Workflow",
    "register_processor",
    "unregister_processor",
]
