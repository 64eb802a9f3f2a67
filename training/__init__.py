"""AgentTrainer: train LLM agents with reinforcement learning on any backend.

    from training import AgentTrainer
    AgentTrainer(agent_class=MyAgent, env_class=MyEnv, train_dataset=tasks,
                 config={"actor_rollout_ref.model.path": "tiny-char"}).train()

``import training as rllm`` gives rLLM's ``rllm.rollout`` / ``rllm.evaluator`` decorators (its
AgentFlow API). ``training.AgentConfig`` is AWorld's agent config; rLLM's ``AgentConfig`` (what
an AgentFlow is called with) is ``training.types.AgentConfig``.
"""

from training.agents.flow import evaluator, rollout
from training.agents.base import BaseAgent, BaseEnv
from training.agents.spec import AgentSpec
from training.compat.aworld.agents import Agent, AgentConfig, ModelConfig
from training.compat.aworld.tools import be_tool
from training.config import Config
from training.errors import ConfigError, TerminationEvent
from training.compat.rllm.environments import MultiTurnEnvironment, SingleTurnEnvironment
from training.backends.processor import TrainerProcessor, register_processor, unregister_processor
from training.rewards import RewardFunction, code_reward_fn, countdown_reward_fn, f1_reward_fn, math_reward_fn, search_reward_fn
from training.compat.rllm.agents import SEARCH_SYSTEM_PROMPT, TOOL_SYSTEM_PROMPT, CompetitionCodingAgent, MathAgent, MCPToolAgent, ToolAgent
from training.compat.rllm.tools import MultiTool, PythonInterpreter, Tool, ToolOutput, tool_registry
from training.tracking.sinks import ConsoleSink, JsonlSink, MetricSink
from training.compat.rllm.tool_env import ToolEnvironment
from training.trainer import AgentTrainer
from training.types import (
    Action,
    Episode,
    EvalOutput,
    ModelOutput,
    RewardOutput,
    Signal,
    Step,
    Task,
    TerminationReason,
    Trajectory,
)
from training.agents.workflow import CumulativeWorkflow, RolloutEngine, SimpleWorkflow, SingleTurnWorkflow, Workflow

# The name tables that backends and trackers own, registered with the config as they are imported
# (training.config.names): TRL's GRPOConfig names, verl's keys, trainer.logger's names.
from training.backends.trl import names as _trl_names  # noqa: F401
from training.backends.verl import names as _verl_names  # noqa: F401
from training.tracking import trackers as _trackers  # noqa: F401
from training.compat.rllm.sft import AgentSFTTrainer

__all__ = [
    "Action",
    "Agent",
    "be_tool",
    "AgentConfig",
    "AgentExecutionEngine",
    "AgentSFTTrainer",
    "AgentWorkflowEngine",
    "AsyncAgentExecutionEngine",
    "AgentSpec",
    "AgentTrainer",
    "BaseAgent",
    "BaseEnv",
    "CompetitionCodingAgent",
    "Config",
    "ConfigError",
    "ConsoleSink",
    "CumulativeWorkflow",
    "Episode",
    "EvalOutput",
    "JsonlSink",
    "MathAgent",
    "MCPConnectionManager",
    "MCPEnvironment",
    "MCPTool",
    "MCPToolAgent",
    "MetricSink",
    "ModelConfig",
    "ModelOutput",
    "MultiTool",
    "MultiTurnEnvironment",
    "OpenAIEngine",
    "DatasetRegistry",
    "RewardFunction",
    "RewardOutput",
    "RolloutEngine",
    "PythonInterpreter",
    "SEARCH_SYSTEM_PROMPT",
    "Signal",
    "SimpleWorkflow",
    "SingleTurnEnvironment",
    "SingleTurnWorkflow",
    "Step",
    "TOOL_SYSTEM_PROMPT",
    "Task",
    "TerminationEvent",
    "TerminationReason",
    "Tool",
    "ToolAgent",
    "ToolEnvironment",
    "ToolOutput",
    "Trajectory",
    "TrainerProcessor",
    "Workflow",
    "evaluator",
    "code_reward_fn",
    "compute_pass_at_k",
    "countdown_compute_score",
    "countdown_reward_fn",
    "current_base_url",
    "evaluate_math",
    "extract_answer",
    "extract_answer_text",
    "extract_boxed_answer",
    "f1_reward_fn",
    "get_chat_client",
    "get_chat_client_async",
    "grade_answer_mathd",
    "grade_answer_sympy",
    "math_reward_fn",
    "search_reward_fn",
    "session",
    "trajectory",
    "register_processor",
    "rollout",
    "save_trajectories",
    "tool_registry",
    "unregister_processor",
]


_ENGINES = ("AgentExecutionEngine", "AsyncAgentExecutionEngine", "AgentWorkflowEngine", "OpenAIEngine", "compute_pass_at_k",
            "save_trajectories")
_MCP = ("MCPConnectionManager", "MCPEnvironment", "MCPTool")
_SDK = ("current_base_url", "get_chat_client", "get_chat_client_async", "session", "trajectory")
_EVALUATORS = ("countdown_compute_score", "evaluate_math", "extract_answer", "extract_answer_text", "extract_boxed_answer",
               "grade_answer_mathd", "grade_answer_sympy")


def __getattr__(name: str):
    # rLLM's DatasetRegistry lives with the datasets code, which imports HF datasets: loaded on first use.
    if name == "DatasetRegistry":
        from training.data import DatasetRegistry  # brings in datasets: imported on first use

        return DatasetRegistry
    if name in _ENGINES:  # rLLM's inference engines import the openai client: loaded on first use
        from training.compat.rllm import engines  # brings in torch: imported on first use

        return getattr(engines, name)
    if name in _MCP:  # rLLM's MCP environment needs the mcp SDK (an optional dependency): loaded on first use
        from training.compat.rllm import mcp_env  # brings in mcp: imported on first use

        return getattr(mcp_env, name)
    if name in _SDK:  # rLLM's SDK helpers import the openai client: loaded on first use
        from training import sdk

        return getattr(sdk, name)
    if name in _EVALUATORS:  # the math graders import sympy: loaded on first use
        from training import evaluators

        return getattr(evaluators, name)
    if name == "AgentSFTTrainer":  # TRL is imported when training starts; the module is light, but kept apart

        return AgentSFTTrainer
    raise AttributeError(f"module 'training' has no attribute {name!r}")
