"""``AgentTrainer``: one entry point that accepts both rLLM's and AWorld's ways of describing a run."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any, Callable

from training.agents.workflow import Workflow

from training.agents.spec import AgentSpec
from training.config import Config, parse_overrides
from training.log import logger
from training.backends.processor import (
    TrainerProcessor,
    available_processors,
    get_processor_class,
    register_processor,
    unregister_processor,
)
from training.tracking.sinks import MetricSink, MultiSink
from training.rewards import reward_in_file
from training.utils import cuda_device_count, import_object, is_verl_available
from training.errors import ConfigError, Problems, RunSuperseded


def choose_backend(name: str | None) -> str:
    """Resolve ``auto``: verl where CUDA GPUs and verl are present, TRL otherwise."""
    if name not in (None, "auto"):
        return name
    gpus = cuda_device_count()
    if gpus and is_verl_available():
        logger.info("backend=auto chose verl (%d CUDA GPU(s), verl installed)", gpus)
        return "verl"
    reason = "no CUDA GPU" if not gpus else "verl is not installed"
    logger.info("backend=auto chose trl (%s)", reason)
    return "trl"


class AgentTrainer:
    """Train an agent with RL on any registered backend.

    rLLM style::

        AgentTrainer(agent_class=MyAgent, env_class=MyEnv, config={"data.train_batch_size": 8},
                     train_dataset=ds, backend="trl").train()

    rLLM's AgentFlow style (its main branch)::

        AgentTrainer(backend="trl", agent_flow=math_flow, evaluator=math_evaluator, config=config,
                     train_dataset=ds, val_dataset=val).train()

    AWorld style::

        AgentTrainer(agent=spec_or_path, train_dataset="train.csv", reward_func="pkg.mod.reward",
                     config=cfg, run_path="./outputs", train_engine_name="trl").train()

    AWorld's config route: with ``train_dataset``/``test_dataset``/``reward_func`` None, the config's
    ``data.train_files``/``data.val_files`` and ``custom_reward_function.path``/``name`` name them
    (``CONFIG_INPUT_KEYS``).

    Construction validates everything (``check_agent``, ``check_dataset``, ``check_reward``,
    ``check_config``, in that order) so that bad input fails before any training starts.
    """

    def __init__(
        self,
        workflow_class: type[Workflow] | str | None = None,
        workflow_args: dict[str, Any] | None = None,
        agent_class: type | str | None = None,
        env_class: type | str | None = None,
        agent_args: dict[str, Any] | None = None,
        env_args: dict[str, Any] | None = None,
        config: Any = None,
        train_dataset: Any = None,
        val_dataset: Any = None,
        backend: str | None = None,
        agent_run_func: Callable | str | None = None,
        *,
        agent_flow: Any = None,
        evaluator: Any = None,
        agent: Any = None,
        reward_func: Any = None,
        test_dataset: Any = None,
        run_path: str | None = None,
        train_engine_name: str | None = None,
        sinks: list[MetricSink] | None = None,
        should_stop: Callable[[], bool] | None = None,
        may_write: Callable[[], bool] | None = None,
        on_full_disk: str = "fail",
        attempt: int | None = None,
        write_fence: Callable[[Callable[[], None], bool], bool] | None = None,
        kept_checkpoints: Callable[[], set[int]] | None = None,
    ) -> None:
        rllm_agent = any(
            v is not None for v in (workflow_class, agent_class, env_class, agent_run_func, agent_flow, evaluator)
        )
        if agent is not None and rllm_agent:
            raise ValueError(
                "Give the agent either as agent= or as workflow_class/agent_class/env_class/agent_run_func/agent_flow, not both."
            )
        if backend not in (None, "auto") and train_engine_name not in (None, "auto") and backend != train_engine_name:
            raise ValueError(f"backend={backend!r} and train_engine_name={train_engine_name!r} disagree; give one.")
        if val_dataset is not None and test_dataset is not None:
            raise ValueError("val_dataset and test_dataset are the same thing; give one.")

        if agent is None:
            agent = AgentSpec(
                workflow_class=workflow_class,
                workflow_args=workflow_args or {},
                agent_class=agent_class,
                env_class=env_class,
                agent_args=agent_args or {},
                env_args=env_args or {},
                agent_run_func=agent_run_func,
                agent_flow=agent_flow,
                evaluator=evaluator,
            )

        config, run_path = _output_dir_as_run_path(config, run_path)
        config, named = _inputs_named_in_config(config)
        train_dataset = _given_once(train_dataset, named.get("data.train_files"), "train_dataset", "data.train_files")
        test_dataset = _given_once(test_dataset, named.get("data.val_files"), "test_dataset", "data.val_files")
        reward_func = _given_once(reward_func, named.get("reward"), "reward_func", "custom_reward_function.path")
        self.agent = agent
        self.train_dataset = train_dataset
        self.test_dataset = test_dataset if test_dataset is not None else val_dataset
        self.reward_func = reward_func
        self.config = config
        self.run_path = run_path
        self.train_engine_name = choose_backend(train_engine_name or backend)

        processor_cls = get_processor_class(self.train_engine_name)
        self.train_processor: TrainerProcessor = processor_cls(run_path)
        for sink in sinks or []:
            self.train_processor.add_sink(sink)
        if should_stop is not None:
            self.train_processor.add_stop_check(should_stop)
        if may_write is not None:  # a platform's fencing token: asked before every checkpoint and final model
            self.train_processor.add_write_check(may_write)
        # A platform's attempt of the run: checkpoints and the final model are written in the attempt's
        # own folder and published into the run's by a rename that ``write_fence`` lets only the run's
        # owner make (TrainerProcessor.publish).
        self.train_processor.attempt = attempt
        if write_fence is not None:
            self.train_processor.set_write_fence(write_fence)
        # Steps whose published checkpoints the rotation never removes (a platform's aliases name them).
        self.train_processor.kept_checkpoints = kept_checkpoints
        if on_full_disk not in ("fail", "pause"):
            raise ValueError(f"on_full_disk must be 'fail' or 'pause', not {on_full_disk!r}.")
        self.train_processor.on_full_disk = on_full_disk  # a checkpoint that does not fit: see TrainerProcessor.write_files

        try:
            self._check_inputs()
            self.final_config = self.train_processor.check_config(self.config)
        except BaseException:
            self._stop_servers()  # an AWorld agent's MCP servers, started by check_agent
            raise
        # A processor registered by a user (AWorld's contract) may return its own config type.
        named = getattr(getattr(self.final_config, "rllm", None), "backend", None)
        if named is not None and named != self.train_engine_name:
            raise ConfigError(
                "rllm.backend",
                f"names backend {named!r} but this trainer runs {self.train_engine_name!r}; pass backend={named!r} "
                f"to AgentTrainer, or set rllm.backend={self.train_engine_name} (rLLM's rllm/backend=...).",
            )
        self.train_processor.mark_initialized()

    def _check_inputs(self) -> None:
        """The agent, the datasets and the reward, each checked even when one before it failed: a
        wrong dataset and a wrong reward are said together (``Problems``). The config is checked
        only when all three pass, since its checks read them."""
        problems: list[ValueError] = []
        for check, args in ((self.train_processor.check_agent, (self.agent,)),
                            (self.train_processor.check_dataset, (self.train_dataset, self.test_dataset)),
                            (self.train_processor.check_reward, (self.reward_func,))):
            try:
                check(*args)
            except ValueError as exc:
                problems.append(exc)
            except Exception:
                if not problems:
                    raise
                break  # most likely a consequence of the problem before it: that one is said
        if len(problems) == 1:
            raise problems[0]
        if problems:
            raise Problems(problems)

    def train(self) -> Any:
        """Run training; returns what the backend's ``train`` returns (a ``TrainResult`` for built-ins).

        A run that trained but had nothing to learn from (``training.rollouts.outcomes.learning_warnings``)
        is not a failure: its warnings are logged and kept in the result's ``warnings``.
        """
        if not self.train_processor.initialized:
            raise ValueError("The training processor is not initialized; construction must finish before train().")
        failure: BaseException | None = None
        try:
            self._start_servers()
            result = self.train_processor.train()
        except RunSuperseded as exc:
            failure = exc
            raise
        except BaseException as exc:
            failure = exc
            self._publish_records_quietly()  # a failed or interrupted run's records up to its end
            raise
        finally:
            self._close_sinks(failure)
            _close_episode_loop()
            self._stop_servers()
        if hasattr(self.train_processor, "publish_run_files"):  # a processor of the user's own may lack it
            self.train_processor.publish_run_files(wait=True)  # the records of an attempt: published at its end
        if hasattr(result, "ignored_keys"):  # the settings said at construction to change nothing here
            result.ignored_keys = dict(getattr(self.train_processor, "ignored_keys", {}))
        if getattr(result, "stopped", False):  # stopped on request, or to be resumed: not judged
            return result
        warnings = self.train_processor.learning_warnings()
        for warning in warnings:
            logger.warning("%s", warning)
        if hasattr(result, "warnings"):  # a processor registered by a user may return a type of its own
            result.warnings = warnings
        return result

    def _close_sinks(self, failure: BaseException | None) -> None:
        """The run's sinks, where the backend left them open: it failed before its own ``with
        self.sinks`` (its model did not load, a server did not start), or it is a processor of the
        user's own that never closes them. Told how the run ended (``failure``) and closed, so that a
        tracker's run says it failed, a sink's last batch is written and its thread ends with the run.
        A no-op where the backend closed them."""
        sinks = getattr(self.train_processor, "sinks", None)
        if not isinstance(sinks, MultiSink) or sinks.closed:
            return
        if failure is None:
            sinks.close()
        else:
            sinks.__exit__(type(failure), failure, failure.__traceback__)

    def _publish_records_quietly(self) -> None:
        if not hasattr(self.train_processor, "publish_run_files"):
            return
        try:
            self.train_processor.publish_run_files(wait=False)
        except Exception as exc:  # noqa: BLE001 - the run's own error is the one raised
            logger.warning("The run's records were not published: %s", exc)

    async def inference(self, dataset: Any = None) -> Any:
        """The agent on ``dataset`` (default: the test dataset), as AWorld's ``await trainer.inference()``.

        For the built-in backends: an ``EvalResult`` with one row per task (responses, rewards,
        verdicts) and metrics per data source (``test/<source>/reward``, ``pass@1``, ``pass@n``),
        using the run's newest weights (the base model before training). ``evaluate()`` is the
        same without ``await``.
        """
        self._require_initialized()
        if inspect.iscoroutinefunction(self.train_processor.inference):
            return await self.train_processor.inference(dataset)
        # A worker thread, so the processor may run its own event loop.
        return await asyncio.to_thread(self._inference_in_thread, dataset)

    def _inference_in_thread(self, dataset: Any) -> Any:
        try:
            self._start_servers()
            return self.train_processor.inference(dataset)
        finally:
            _close_episode_loop()  # the pool thread's episode loop, not left open behind it
            self._stop_servers()

    def evaluate(self, dataset: Any = None) -> Any:
        """``inference()`` for code that is not async."""
        self._require_initialized()
        if inspect.iscoroutinefunction(self.train_processor.inference):
            return asyncio.run(self.train_processor.inference(dataset))
        try:
            self._start_servers()
            return self.train_processor.inference(dataset)
        finally:
            _close_episode_loop()
            self._stop_servers()

    def _chat_agent(self) -> Any:
        return getattr(self.train_processor, "chat_agent", None)

    def _start_servers(self) -> None:
        """An AWorld agent's MCP servers: started at construction, again for a later train or inference."""
        agent = self._chat_agent()
        if agent is not None and hasattr(agent, "start_servers"):
            agent.start_servers()

    def _stop_servers(self) -> None:
        """Stop an AWorld agent's MCP servers (at the end of training or inference, or of a failed construction)."""
        agent = self._chat_agent()
        if agent is not None and hasattr(agent, "stop_servers"):
            agent.stop_servers()

    def _require_initialized(self) -> None:
        if not self.train_processor.initialized:
            raise ValueError("The training processor is not initialized; construction must finish first.")

    def request_stop(self) -> None:
        """Stop after the current step (from another thread, e.g. a cancel request)."""
        self.train_processor.request_stop()

    @staticmethod
    def register_processor(train_engine_name: str, train_type: type[TrainerProcessor]) -> None:
        register_processor(train_engine_name, train_type)

    @staticmethod
    def unregister_processor(train_engine_name: str) -> None:
        unregister_processor(train_engine_name)

    @staticmethod
    def available_processors() -> list[str]:
        return available_processors()


def _close_episode_loop() -> None:
    """Close this thread's episode loop (``training.rollouts.episode_runner``), imported only once it may exist."""
    import sys

    runner_module = sys.modules.get("training.rollouts.episode_runner")
    if runner_module is not None:
        runner_module.close_episode_loop()


def _output_dir_as_run_path(config: Any, run_path: str | None) -> tuple[Any, str]:
    """A config dict written for TRL (AWorld's TRL runs) names the run's folder ``output_dir``: it is
    the run path when ``run_path`` is not given (default ``runs``), and must agree with it when it is."""
    if not (isinstance(config, dict) and "output_dir" in config):
        return config, run_path or "runs"
    output_dir = config["output_dir"]
    if run_path is not None and Path(str(output_dir)).resolve() != Path(run_path).resolve():
        raise ConfigError("output_dir", f"is {output_dir!r} but run_path is {run_path!r}: both name the run's folder; give one.")
    return {key: value for key, value in config.items() if key != "output_dir"}, str(output_dir)


# verl's keys that name a run's inputs. AWorld's AgentTrainer takes the datasets and the reward
# there when its arguments are None; here they become those arguments, and leave the config.
# (On the platform a member's config may not set them: the registry chooses the inputs.)
CONFIG_INPUT_KEYS = ("data.train_files", "data.val_files", "custom_reward_function.path", "custom_reward_function.name")


def _inputs_named_in_config(config: Any) -> tuple[Any, dict[str, Any]]:
    """The config without ``CONFIG_INPUT_KEYS`` (also verl's newer ``reward.custom_reward_function.*``),
    and what they name, loaded: ``data.train_files``/``data.val_files`` as datasets, the reward file's
    function as ``reward``. Keys left empty (as AWorld's own configs leave them) name nothing.
    A config without them is returned as it is."""
    if config is None or isinstance(config, Config):
        return config, {}
    flat = parse_overrides(config)
    named = {_input_key(key): value for key, value in flat.items() if _input_key(key) in CONFIG_INPUT_KEYS}
    if not named:
        return config, {}
    given = {key: value for key, value in named.items() if value not in (None, "", [])}
    # A null stays: the config says it is not given (training.config.names), as for verl's other placeholders.
    rest = {key: value for key, value in flat.items() if _input_key(key) not in CONFIG_INPUT_KEYS or value is None}
    for key, value in given.items():
        logger.info("config: %s=%r", key, value)
    loaded: dict[str, Any] = {}
    for key in ("data.train_files", "data.val_files"):
        if key in given:
            # brings in HF datasets (a second of imports): only where a run loads data, not with `import training`
            from training.data import load_data_files

            loaded[key] = load_data_files(given[key], what=key)
    path, name = given.get("custom_reward_function.path"), given.get("custom_reward_function.name")
    if name is not None and path is None:
        raise ConfigError(
            "custom_reward_function.name",
            f"names function {name!r} but custom_reward_function.path names no file; give the path of the .py file "
            "that defines it (or pass reward_func=).",
        )
    if path is not None:
        loaded["reward"] = _reward_in_config(str(path), None if name is None else str(name))
    return rest, loaded


def _input_key(key: str) -> str:
    """A key as ``CONFIG_INPUT_KEYS`` name it: Hydra's ``+`` and verl's newer ``reward.`` section dropped."""
    key = key.removeprefix("+")
    return key.removeprefix("reward.") if key.startswith("reward.custom_reward_function.") else key


def _reward_in_config(path: str, name: str | None) -> Any:
    """The function verl's ``custom_reward_function`` names: ``name`` in the file at ``path`` (verl's
    ``compute_score`` signature, or any other the reward loader knows); without a name, the file's
    reward function as ``reward_func='file.py'`` finds it (``compute_score`` first, as verl)."""
    if not path.endswith(".py"):
        raise ConfigError("custom_reward_function.path", f"is {path!r}, not a Python file; give the path of the .py file that defines the reward function.")
    if not Path(path).is_file():
        raise ConfigError(
            "custom_reward_function.path",
            f"file {path} does not exist (a relative path is read from {Path.cwd()}); give the path of the .py file "
            "that defines the reward function, or pass reward_func=.",
        )
    if name is None:
        try:
            return reward_in_file(path)
        except ValueError as exc:
            raise ConfigError("custom_reward_function.path", f"{str(exc).removeprefix('reward_func: ')} Or name it in custom_reward_function.name.") from exc
    try:
        function = import_object(f"{path}:{name}", what="reward function")
    except ValueError as exc:
        raise ConfigError("custom_reward_function.name", f"{exc} Set custom_reward_function.name to the function's name in {path}.") from exc
    if not callable(function):
        raise ConfigError("custom_reward_function.name", f"{name!r} in {path} is a {type(function).__name__}, not a function.")
    return function


def _given_once(argument: Any, from_config: Any, argument_name: str, key: str) -> Any:
    """An input given as an argument or in the config, refused when given both ways (which would win is a guess)."""
    if from_config is None:
        return argument
    if argument is not None:
        raise ConfigError(key, f"names the run's {argument_name.replace('_', ' ')} and so does {argument_name}=; give one.")
    return from_config
