"""What the built-in backends share: turning user input into validated, loaded objects.

A backend subclasses ``BuiltinProcessor`` and implements ``train``; it may add checks of its
own in ``check_backend`` (called at the end of ``check_config``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy
import yaml

from training.agents.base import build_agent, build_env

from training.agents.spec import AgentSpec
from training.compat.aworld.agents import Agent as ChatAgent
from training.compat.aworld.agents import chat_agent_from
from training.errors import MissingField
from training.types import Action
from training.config import Config
from training.data import dataset_to_tasks, load_dataset, require_columns, require_rows
from training.errors import ConfigError, ProgramsRefused
from training.rollouts.outcomes import ColumnReads, columns_the_reward_lacks, learning_warnings
from training.backends.keys import check_refused, say_without_effect
from training.backends.processor import TrainerProcessor
from training.rewards import RewardFunction, load_reward
from training.agents.sdk.run_func import check_task_fields
from training.tracking.episodes import ParquetEpisodeSink
from training.tracking.sinks import ConsoleSink, JsonlSink
from training.tracking.system_metrics import SystemMetrics
from training.tracking.trackers import tracker_sinks
from training.rollouts.validation import run_inference
from training.threads import DaemonThreadExecutor

logger = logging.getLogger("training")

# How long the check before training waits for an environment's first step (tools, services): short,
# since a platform's check of a run (training.platform.probe) has a time limit of its own.
PROBE_STEP_TIMEOUT_S = 5.0


@dataclass
class TrainResult:
    """What ``AgentTrainer.train()`` returns for the built-in backends."""

    run_path: str
    steps: int
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None
    stopped: bool = False
    # A run that trained but had nothing to learn from (its reward the same at every step), with the
    # likely cause: not a failure, but never to be read as a success without them.
    warnings: list[str] = field(default_factory=list)
    # Settings given that change nothing on this backend, as config.yaml records them: key -> {value, why}.
    ignored_keys: dict[str, dict[str, Any]] = field(default_factory=dict)


class BuiltinProcessor(TrainerProcessor):
    """Validation shared by the built-in backends; see ``TrainerProcessor`` for the call order."""

    name = "builtin"

    def __init__(self, run_path: str) -> None:
        super().__init__(run_path)
        self.agent_spec: AgentSpec | None = None
        self.chat_agent: ChatAgent | None = None  # an AWorld-style chat agent, when given one
        self.train_dataset = None
        self.train_source: Any = None
        self.test_dataset = None
        self.reward_spec: Any = None
        self.reward_fn: RewardFunction | None = None
        self.reward_lacks: list[str] = []  # columns the reward looked for in the first row and did not find
        self.config: Config | None = None
        # Settings given that change nothing on this backend: key -> {value, why} (training.backends.keys).
        self.ignored_keys: dict[str, dict[str, Any]] = {}

    # -- the four checks -------------------------------------------------------------------
    # Whether a chat agent's tools run in this process (its MCP servers' connections live here).
    tools_in_process = True

    def check_agent(self, agent: Any) -> None:
        self.chat_agent = chat_agent_from(agent)
        if self.chat_agent is not None and self.chat_agent.mcp:
            if not self.tools_in_process:
                raise ValueError(
                    f"agent {self.chat_agent.name!r}: mcp_servers: on the {self.name} backend the agent's episodes run in "
                    "other processes, which cannot reach MCP servers started by this one. Train it on trl, or give the "
                    "tools as Python functions (tool_names).")
            self.chat_agent.start_servers()  # their tools' schemas are part of the prompt: listed now
        spec = self.chat_agent.to_spec() if self.chat_agent is not None else AgentSpec.coerce(agent)
        self.agent_spec = spec.validate()

    def check_dataset(self, dataset: Any = None, test_dataset: Any = None) -> None:
        self.train_source = dataset
        self.train_dataset = load_dataset(dataset, split="train", what="train_dataset")
        if self.train_dataset is None:
            raise ValueError("train_dataset: a training dataset is needed (a Dataset, a list of dicts, a file path or a registered name).")
        self.test_dataset = load_dataset(test_dataset, split="test", what="test_dataset")
        # A chat agent's environment needs the config's prompt key: it is probed in check_config.
        if self.agent_spec is not None and self.agent_spec.kind == "agent_env" and self.chat_agent is None:
            self._probe_agent_and_env(dataset_to_tasks(self.train_dataset.select(range(1)))[0])

    def check_reward(self, reward_func: Any = None) -> None:
        self.reward_spec = reward_func
        self.reward_fn = load_reward(reward_func)
        if self.reward_fn is None and self.agent_spec is not None and self.agent_spec.kind == "single_turn":
            raise ValueError(
                "reward_func: a single-turn task needs a reward function (a callable, an import path, "
                "or a built-in name such as 'exact_match')."
            )
        if self.reward_fn is None and self.chat_agent is not None:
            raise ValueError(
                f"reward_func: the chat agent {self.chat_agent.name!r} needs a reward function to score its "
                "answers (a callable, an import path, a file path such as 'reward/score.py', or a built-in name)."
            )
        if self.reward_fn is not None and self.agent_spec is not None and self.agent_spec.kind == "agent_flow":
            raise ValueError(
                f"reward_func: an agent_flow's episodes are scored by its evaluator, so reward function "
                f"{self.reward_fn.name} would never be called. Leave reward_func out."
            )
        if self.reward_fn is not None and self.agent_spec is not None and self.agent_spec.kind == "agent_env" and self.chat_agent is None:
            raise ValueError(
                f"reward_func: an agent_class/env_class run is scored by its environment's step rewards, so "
                f"reward function {self.reward_fn.name} would never be called. Leave reward_func out, or have "
                f"the environment call it (e.g. through env_args)."
            )

    def check_config(self, config: Any = None) -> Config:
        self.config = Config.build(config, base={**self.default_overrides(), **self._chat_agent_keys()})
        data = self.config.data
        if (data.answer_key, data.prompt_key) != ("ground_truth", "prompt") and self.reward_spec is not None:
            self.reward_fn = load_reward(self.reward_spec, answer_key=data.answer_key, prompt_key=data.prompt_key)
        first_task = dataset_to_tasks(self.train_dataset.select(range(1)))[0]
        if self.chat_agent is not None:
            self.agent_spec = self.chat_agent.to_spec(self.reward_fn, data.prompt_key).validate()
            self._probe_agent_and_env(first_task)
        else:
            self._apply_rllm_keys(first_task)
        if self.agent_spec.run_func_style == "kwargs":
            check_task_fields(self.agent_spec.agent_run_func, first_task)
        if self.agent_spec.kind == "single_turn":
            require_columns(
                self.train_dataset, [data.prompt_key], "train_dataset",
                hint="Rename the column or set data.prompt_key=<column>.",
            )
        if self.reward_fn is not None and (self.agent_spec.kind == "single_turn" or self.chat_agent is not None):
            reads = ColumnReads(first_task)
            try:
                self.reward_fn.probe(reads)
            except ValueError:
                if self.reward_fn.style != "verl":  # only verl's form reads the answer column itself
                    raise
                require_columns(
                    self.train_dataset, [data.answer_key], "train_dataset",
                    hint="Rename the column or set data.answer_key=<column>.",
                )
                raise
            self.reward_lacks = columns_the_reward_lacks(self.reward_fn, reads)
            if self.reward_lacks:  # often optional (a fallback column): a flat reward makes it the likely cause
                logger.info("reward function %s looked for column(s) %s, which the first row of train_dataset does not "
                            "have", self.reward_fn.name, ", ".join(map(repr, self.reward_lacks)))
        require_rows(self.train_dataset, data.train_batch_size, "train_dataset", self.train_source, "data.train_batch_size")
        self.check_backend(self.config)
        check_refused(self.name, self.config)
        self.ignored_keys = say_without_effect(self.name, self.config)
        self.write_config()
        return self.config

    def learning_warnings(self) -> list[str]:
        """``TrainerProcessor.learning_warnings``, naming the reward and the columns it looked for and
        the rows lack as the likely cause."""
        return learning_warnings(
            self.reward_trace, getattr(self.reward_fn, "name", None), self.reward_lacks,
            self.train_dataset.column_names, self.config.data.answer_key,
        )

    def inference(self, dataset: Any = None):
        """The agent on ``dataset`` (default: the test dataset) with the run's newest weights:
        an ``EvalResult`` of per-row results and per-data-source metrics (``test/<source>/...``)."""
        return run_inference(self, dataset)

    # -- hooks for backends ----------------------------------------------------------------
    def default_overrides(self) -> dict[str, Any]:
        """Backend defaults layered under the user's overrides."""
        return {}

    def check_backend(self, config: Config) -> None:
        """Backend-specific checks of the final config (e.g. hardware)."""

    def _chat_agent_keys(self) -> dict[str, Any]:
        """What a chat agent's model config sets (model, temperature, turns), logged as applied."""
        keys = self.chat_agent.training_keys() if self.chat_agent is not None else {}
        for key, value in keys.items():
            logger.info("agent %s sets %s=%r (the run's config wins where it sets the key too)", self.chat_agent.name, key, value)
        return keys

    def _apply_rllm_keys(self, first_task: dict) -> None:
        """rLLM's ``rllm.agent.agent_args`` / ``rllm.env.env_args`` / ``rllm.workflow.workflow_args``
        join the spec's arguments (probed again when they change an agent and env), and
        ``rllm.workflow.use_workflow`` is checked against what was given."""
        rllm = self.config.rllm
        if rllm.workflow.use_workflow and self.agent_spec.kind not in ("workflow", "agent_env"):
            raise ConfigError(
                "rllm.workflow.use_workflow",
                "is true but no workflow_class (or agent_class and env_class) was given; give one, or set it to false.",
            )
        if rllm.disable_thinking:
            raise ConfigError(
                "rllm.disable_thinking",
                "is not implemented here: chat templates are rendered as the tokenizer defines them. Set it to "
                "false, or give a tokenizer whose template does not think.",
            )
        merged = self.agent_spec.with_config_args(self.config)
        if merged is not self.agent_spec:
            self.agent_spec = merged
            if merged.kind == "agent_env":
                self._probe_agent_and_env(first_task)

    # -- helpers ---------------------------------------------------------------------------
    def attach_default_sinks(self, trackers_elsewhere: tuple[str, ...] = ()) -> None:
        """The sinks named in ``trainer.logger``, beside those the caller added, and the system
        metrics sampler. ``trackers_elsewhere``: trackers the backend's own engine writes to."""
        names = self.config.trainer.logger
        if "console" in names:
            self.sinks.add(ConsoleSink(self.config.trainer.total_training_steps))
        if "jsonl" in names or "file" in names:  # in the attempt's folder, published with each checkpoint
            self.sinks.add(JsonlSink(self.seed_run_files()))
        # The run folder keeps every episode, unless the caller's sinks keep them elsewhere (the platform's store).
        if self.config.trainer.log_episodes and not self.sinks.stores_episodes:
            self.sinks.add(ParquetEpisodeSink(self.run_path))
        for sink in tracker_sinks(self.config, self.path, skip=trackers_elsewhere):
            self.sinks.add(sink)
        if self.config.trainer.system_metrics_interval > 0:
            self.sinks.add_source(SystemMetrics(self.config.trainer.system_metrics_interval).start())

    def write_config(self) -> Path:
        """The final config, with the agent, reward and backend, as ``config.yaml`` in the run directory."""
        self.path.mkdir(parents=True, exist_ok=True)
        document = {
            "backend": self.name,
            "agent": self.chat_agent.describe() if self.chat_agent is not None else self.agent_spec.describe(),
            "reward": getattr(self.reward_fn, "name", None),
            "ignored_keys": self.ignored_keys,
            **self.config.to_dict(),
        }
        target = self.attempt_dir() / "config.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(document, sort_keys=False))
        self.publish_run_files(("config.yaml",))
        return self.path / "config.yaml"

    def _probe_agent_and_env(self, task: dict) -> None:
        """Build one agent and one environment from the first row and play one turn, as the rollouts
        will (reset both, ``update_from_env`` with the first observation, ``update_from_model`` on a
        model reply, then ``env.step`` with its action), so that a misspelt ``agent_args`` key, a
        broken env, an agent that breaks rLLM's contract (an ``update_from_model`` that returns no
        action: the env would get ``step(None)`` every turn and every episode would score 0) or an env
        that breaks it (a ``step`` that raises, or returns anything but ``(observation, reward, done,
        info)``) fails before training. The reply is empty text, which a model can always write.
        ``step`` may call tools or services, or wait on them: it gets ``PROBE_STEP_TIMEOUT_S``, and a
        step that takes longer, or starts a program where this process refuses them, is logged as
        skipped. A chat agent's environment is ours, its step the reward's call: not played. An
        environment that starts programs (an MCP server) where this process refuses them (a run's
        check) is built when the run starts instead. Errors name the arguments, never their values
        (an administrator's server arguments; they may hold what the person checking must not see)."""
        spec = self.agent_spec
        name = spec.agent_class.__name__
        try:
            agent = build_agent(spec.agent_class, spec.agent_args)
            agent.reset()
        except Exception as exc:
            raise ValueError(
                f"agent_class {name} could not be built with agent_args {_names(spec.agent_args)} and reset: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        try:
            env = build_env(spec.env_class, task, spec.env_args)
            observation, info = env.reset()
        except ProgramsRefused as exc:
            logger.info("env_class %s not built here: %s", spec.env_class.__name__, exc)
            return
        except MissingField as exc:
            raise ValueError(f"train_dataset {_describe(self.train_source)}: {exc}") from exc
        except KeyError as exc:
            missing = exc.args[0] if exc.args else None
            if isinstance(missing, str) and missing not in task and missing not in spec.env_args:
                raise ValueError(
                    f"train_dataset {_describe(self.train_source)} has no field {missing!r}, which env_class "
                    f"{spec.env_class.__name__} needs in every row (the rows have: {', '.join(map(str, task))}). "
                    "Choose a dataset made for this environment, or an agent made for this dataset."
                ) from exc
            raise self._env_error(task, exc) from exc
        except Exception as exc:
            raise self._env_error(task, exc) from exc
        try:
            action = self._probe_one_turn(agent, observation, info)
            if self.chat_agent is None:
                self._probe_step(env, action)
        finally:
            env.close()

    def _probe_one_turn(self, agent: Any, observation: Any, info: dict) -> None:
        spec = self.agent_spec
        agent_name, env_name = spec.agent_class.__name__, spec.env_class.__name__
        try:
            agent.update_from_env(observation, 0.0, False, info)
            action = agent.update_from_model("")
        except Exception as exc:
            raise ValueError(
                f"agent_class {agent_name} failed its first turn on the first row (update_from_env with the "
                f"environment's first observation, then update_from_model with an empty model reply, which a "
                f"model can write): {type(exc).__name__}: {exc}"
            ) from exc
        taken = action.action if isinstance(action, Action) else action
        if taken is None:
            raise ValueError(
                f"agent_class {agent_name}.update_from_model returned {action!r} for a model reply: it must "
                f"return the action to take (rLLM's contract: return Action(action=...)); env_class {env_name} "
                "would get step(None) every turn and every episode would score 0."
            )
        return taken

    def _probe_step(self, env: Any, action: Any) -> None:
        """``env.step(action)`` within ``PROBE_STEP_TIMEOUT_S``, its return checked against rLLM's contract."""
        spec = self.agent_spec
        agent_name, env_name = spec.agent_class.__name__, spec.env_class.__name__
        try:
            played = DaemonThreadExecutor("probe-env-step").submit(env.step, action)
        except RuntimeError as exc:  # no thread to bound the step with (a process that refuses them): not played
            logger.info("env_class %s.step not checked here: %s", env_name, exc)
            return
        try:
            returned = played.result(timeout=PROBE_STEP_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            logger.warning("env_class %s.step did not return within %gs on the first row (it may wait on tools or "
                           "services): its check before training was skipped", env_name, PROBE_STEP_TIMEOUT_S)
            return
        except ProgramsRefused as exc:
            logger.info("env_class %s.step not checked here: %s", env_name, exc)
            return
        except Exception as exc:
            raise ValueError(
                f"env_class {env_name}.step raised on the first row, given the action {_short(action)} that "
                f"agent_class {agent_name}.update_from_model returned for an empty model reply (which a model can "
                f"write): {type(exc).__name__}: {exc}"
            ) from exc
        problem = _step_problem(returned)
        if problem is not None:
            raise ValueError(
                f"env_class {env_name}.step returned {_short(returned)} on the first row: {problem}. It must return "
                "(observation, reward, done, info), rLLM's contract: reward a number, done a bool, info a dict."
            )

    def _env_error(self, task: dict, exc: Exception) -> ValueError:
        spec = self.agent_spec
        return ValueError(
            f"env_class {spec.env_class.__name__} could not be built and reset from the first row of "
            f"train_dataset (fields {', '.join(map(str, task))}) with env_args {_names(spec.env_args)}: "
            f"{type(exc).__name__}: {exc}"
        )


def _step_problem(returned: Any) -> str | None:
    """What in an ``env.step`` return breaks rLLM's contract, or None."""
    if not isinstance(returned, (tuple, list)) or len(returned) != 4:
        size = f"{len(returned)} values" if isinstance(returned, (tuple, list)) else f"a {type(returned).__name__}"
        return f"{size}, not the 4 of (observation, reward, done, info)"
    _, reward, done, info = returned
    if not _is_number(reward):  # the episode loop adds float(reward) up
        return f"its reward is {_short(reward)}, not a number"
    if not (isinstance(done, (bool, numpy.bool_)) or (isinstance(done, numbers.Integral) and done in (0, 1))):
        return f"its done is {_short(done)}, not a bool"
    if info is not None and not isinstance(info, dict):
        return f"its info is {_short(info)}, not a dict"
    return None


def _is_number(value: Any) -> bool:
    if isinstance(value, (str, bytes)) or value is None:
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _names(args: dict) -> str:
    return "(" + ", ".join(map(str, args)) + ")" if args else "(none)"


def _describe(source: Any) -> str:
    """A dataset as the user gave it: its name or path, else what it is."""
    return repr(source) if isinstance(source, (str, Path)) else f"({type(source).__name__})"
