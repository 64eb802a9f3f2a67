"""The ``swift`` backend: ms-swift's own GRPO trainer, in an environment of its own.

ms-swift pins ``trl<1.0`` and ``datasets<4.8.5``, so it cannot share the platform's environment.
The backend declares the interpreter its training process runs in (``trainer.python``; default
``.venv-swift/bin/python`` next to the library, built by ``make swift-env``). Validation runs here
like any backend's; ``train`` writes the job (dataset as JSONL, the reward by name or path, ms-swift
arguments) under ``<run>/swift/`` and starts ``training.backends.swift.child`` in that interpreter,
which trains through ms-swift's ``rlhf_main`` and reports each logged step back on stdout. A stop
request is passed on through a file and honoured after the current step.

Importing ms-swift, TRL and torch costs that process about 8 CPU-seconds. Where ``SWIFT_WARM_PROCESS``
names a warm process of the default interpreter (``start_warm_process``: ms-swift imported once), the
training process is forked from it instead, as the platform's own children are from a worker's
(``training.isolation.forkserver``); where it cannot serve (none there, another interpreter, an
environment its imports read differently) the process starts plain.

Single-turn tasks, and agent + environment classes through ms-swift's multi-turn hook
(``multi_turn_scheduler``: ``swift_child.agent_env_scheduler`` plays our turn loop inside ms-swift's
rollout, one ``rllm.agent.max_tokens_per_turn`` reply per turn, at most ``rllm.agent.max_steps``
turns, the episode's reward the sum of the environment's). The classes must be importable by path
and their arguments JSON, since the training process builds them again. Workflows and run
functions are refused at construction: ms-swift's hook sees one conversation per episode.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from training.backends.base import BuiltinProcessor, TrainResult
from training.backends.swift.child import PLAIN_TEMPLATE, PREFIX
from training.config import Config
from training.errors import ConfigError, DiskFull
from training.data import dataset_to_tasks
from training.isolation import forkserver
from training.isolation.interpreters import import_problem
from training.log import logger
from training.rollouts.models import TINY_MODEL
from training.rollouts.outcomes import OutcomeMonitor
from training.tracking.episodes import keep_for_store
from training.algorithms.recipes import refuse_recipe_keys
from training.backends.processor import free_space
from training.rollouts import outcomes

PROJECT_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_PYTHON = PROJECT_ROOT / ".venv-swift" / "bin" / "python"
PLAIN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
STOP_GRACE_SECONDS = 60
# The address of a warm process of ``DEFAULT_PYTHON`` (``start_warm_process``), when there is one.
WARM_PROCESS_ADDRESS = "SWIFT_WARM_PROCESS"
CHILD_MODULE = "training.backends.swift.child"
# What the training process imports, and for long: ms-swift's GRPO entry point and its hooks.
PRELOAD = ("torch", "swift.arguments:RLHFArguments", "swift.pipelines.train.rlhf:rlhf_main",
           "swift.rollout.multi_turn:MultiTurnScheduler", "swift.callbacks:callbacks_map", "swift.rewards.orm:ORM", CHILD_MODULE)
# ms-swift's metric names -> the dashboard's.
SWIFT_METRIC_NAMES = {
    "reward": "reward", "reward_std": "reward_std", "loss": "loss", "kl": "kl", "entropy": "entropy",
    "grad_norm": "grad_norm", "learning_rate": "lr", "completions/mean_length": "response_length",
    "completions/clipped_ratio": "clipped_ratio", "frac_reward_zero_std": "frac_reward_zero_std",
    "step_time": "step_time", "epoch": "epoch", "num_turns": "turns",
}


def _metric_name(key: str) -> str:
    """The dashboard's name of one of ms-swift's metrics (ours, termination/..., pass as they are)."""
    if key.startswith("termination/"):
        return key
    return SWIFT_METRIC_NAMES.get(key, f"swift/{key}")


def swift_python(config: Config | str | Path | None = None) -> Path:
    """The interpreter of the training process: ``trainer.python`` (or a path given as such), else ``.venv-swift``."""
    configured = config.trainer.python if isinstance(config, Config) else config
    if not configured:
        return DEFAULT_PYTHON
    path = Path(configured)
    return path if path.is_absolute() else PROJECT_ROOT / path  # relative to the checkout, not the caller's cwd


# What the training process imports, checked in its interpreter (the admin's status, the run form):
# imported (light), and found (torch and trl take seconds to import).
CHILD_MODULES = ("swift", "training.backends.swift.child")
CHILD_PACKAGES = ("trl", "torch")


def environment_problem(python: Path) -> str | None:
    """Whether ``python`` imports ms-swift and our child module and has trl and torch, asked of that
    interpreter in a short isolated subprocess (cached for a while; see ``training.isolation.interpreters``)."""
    return import_problem(python, CHILD_MODULES, hint="build it with `make swift-env`", present=CHILD_PACKAGES)


def start_warm_process(address: Path) -> subprocess.Popen:
    """Start a warm process of the default interpreter at ``address`` (its folder is made private) and
    name it in ``SWIFT_WARM_PROCESS`` for this process and those it starts. It listens once ms-swift is
    imported (seconds); a training process asked for before starts plain. It ends with this process."""
    process = forkserver.launch(DEFAULT_PYTHON, address, (CHILD_MODULE,), _child_env(), PROJECT_ROOT, preload=PRELOAD)
    os.environ[WARM_PROCESS_ADDRESS] = str(address)
    return process


class _ForkedTrainingProcess:
    """A training process forked by the warm process, with the pipes and calls of the
    ``subprocess.Popen`` it replaces: ``stdin``, ``stdout`` (text), ``poll``, ``terminate``, ``returncode``."""

    def __init__(self, child: forkserver.ForkedChild, stdin: int, stdout: int) -> None:
        self._child = child
        self.pid = child.pid
        self.stdin = os.fdopen(stdin, "w")
        self.stdout = os.fdopen(stdout, "r")

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    def poll(self) -> int | None:
        return self._child.poll()

    def terminate(self) -> None:
        if self._child.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def _start_training_process(python: Path, job: Path, log: Any) -> subprocess.Popen | _ForkedTrainingProcess:
    """``python -m training.backends.swift.child <job>`` with pipes to and from it, forked from the warm
    process where one serves (``SWIFT_WARM_PROCESS``), else started plain."""
    env = _child_env()
    address = os.environ.get(WARM_PROCESS_ADDRESS)
    if address and python != DEFAULT_PYTHON:
        logger.info("the swift training process starts plain: the warm process runs %s, this run %s", DEFAULT_PYTHON, python)
    elif address:
        to_child, from_parent = os.pipe()
        from_child, to_parent = os.pipe()
        try:
            child = forkserver.start(address, CHILD_MODULE, [str(job)], env, PROJECT_ROOT, stdin=to_child, stdout=to_parent, stderr=log)
        except forkserver.NotServed as refused:
            logger.info("the swift training process starts plain: %s", refused)
            for fd in (to_child, from_parent, from_child, to_parent):
                os.close(fd)
        else:
            os.close(to_child)
            os.close(to_parent)
            return _ForkedTrainingProcess(child, from_parent, from_child)
    return subprocess.Popen([str(python), "-m", CHILD_MODULE, str(job)], cwd=PROJECT_ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # The library from this checkout and the caller's own modules (rewards by import path).
    paths = [str(PROJECT_ROOT), os.getcwd(), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("HF_HUB_OFFLINE", "1")  # a local model directory: nothing to download
    env["PYTHONUNBUFFERED"] = "1"
    return env


class SwiftProcessor(BuiltinProcessor):
    name = "swift"
    own_interpreter = True

    def default_overrides(self) -> dict[str, Any]:
        return {"trainer.cpu_threads": 1}

    @classmethod
    def environment_status(cls, config: Any = None) -> dict[str, str | None]:
        return {"environment": environment_problem(swift_python(config)), "credentials": None}

    def check_backend(self, config: Config) -> None:
        problem = self.environment_status(config)["environment"]
        if problem:
            raise ValueError(f"backend: the swift backend cannot run here: {problem}")
        if self.agent_spec.kind not in ("single_turn", "agent_env") or self.chat_agent is not None:
            kind = "a chat agent" if self.chat_agent is not None else f"a {self.agent_spec.kind} agent"
            raise ValueError(
                f"agent: the swift backend trains single-turn tasks and agent_class/env_class pairs (through "
                f"ms-swift's multi-turn scheduler); this is {kind}, which that hook cannot run. Use the trl or verl backend."
            )
        if config.actor_rollout_ref.rollout.n < 2:
            raise ConfigError("actor_rollout_ref.rollout.n", "GRPO compares episodes of one prompt; use 2 or more.")
        if config.trainer.nnodes != 1:
            raise ConfigError("trainer.nnodes", "the swift backend runs on one machine here; leave it at 1.")
        if config.algorithm.adv_estimator != "grpo":
            raise ConfigError("algorithm.adv_estimator", "ms-swift computes GRPO advantages itself; leave it at grpo or use the trl or verl backend.")
        refuse_recipe_keys(config, "swift")
        refuse_model_code(config.actor_rollout_ref.model)
        model = config.actor_rollout_ref.model
        if model.lora_rank and model.exclude_modules is not None:
            raise ConfigError("actor_rollout_ref.model.exclude_modules", "ms-swift's LoRA takes no list of layers to leave "
                              "out; name the layers to adapt in target_modules instead, or use the trl or verl backend.")
        if model.tokenizer_path and model.tokenizer_path != model.path:
            raise ConfigError("actor_rollout_ref.model.tokenizer_path", "ms-swift loads the tokenizer from the model's own "
                              "directory; leave it unset here, or use the trl or verl backend.")
        agent_loop = config.rllm.agent
        if self.agent_spec.kind == "agent_env" and agent_loop.retries > 0:
            raise ConfigError("rllm.agent.retries", "the swift backend does not retry an episode inside ms-swift's rollout "
                              "(an error ends it and counts against trainer.max_episode_error_rate); leave it at 0.")
        if self.agent_spec.kind == "agent_env" and agent_loop.overlong_filter:
            raise ConfigError("rllm.agent.overlong_filter", "ms-swift trains every episode it generates; the swift backend "
                              "cannot leave overlong ones out. Set it to false, or use the trl backend.")
        if config.trainer.test_freq > 0:
            raise ConfigError("trainer.test_freq", "the swift backend does not score a test dataset during training; "
                              "set it to -1, or use the trl or verl backend.")
        if self.test_dataset is not None:
            logger.warning("the swift backend does not score the test dataset (no val/ metrics); it trains on train_dataset only")
        if self.agent_spec.kind == "agent_env":
            self.agent_reference()
        else:
            self.reward_reference()

    def agent_reference(self) -> dict[str, Any]:
        """The agent and environment as the training process can build them again: import paths, JSON arguments."""
        spec = self.agent_spec
        reference: dict[str, Any] = {}
        for name in ("agent_class", "env_class"):
            cls = getattr(spec, name)
            if cls.__module__ == "__main__" or "<" in cls.__qualname__:
                raise ValueError(
                    f"{name}: the swift backend trains in its own interpreter, so {cls.__qualname__} must be importable "
                    "(defined in a module, given as pkg.mod.Class or path/to/file.py:Class), not defined in __main__ or a function."
                )
            module = sys.modules.get(cls.__module__)
            if cls.__module__.startswith("_user_") and getattr(module, "__file__", None):  # loaded from path/to/file.py
                reference[name] = f"{module.__file__}:{cls.__qualname__}"
            else:
                reference[name] = f"{cls.__module__}.{cls.__qualname__}"
        for name in ("agent_args", "env_args"):
            try:
                reference[name] = json.loads(json.dumps(getattr(spec, name)))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{name}: the swift backend passes these to its own interpreter as JSON, and they are not ({exc}).") from exc
        return reference

    def reward_reference(self) -> str:
        """The reward as the training process can load it again: a name or an import/file path."""
        spec = self.reward_spec
        if isinstance(spec, str):
            return spec
        module, qualname = getattr(spec, "__module__", None), getattr(spec, "__qualname__", "")
        if module and module != "__main__" and "<" not in qualname:
            return f"{module}.{qualname}"
        raise ValueError(
            "reward_func: the swift backend trains in its own interpreter, so give the reward as a built-in name, "
            "an import path (pkg.mod.fn) or a file path (path/to/file.py:fn), not an object defined here."
        )

    # -- training --------------------------------------------------------------------------
    def train(self) -> TrainResult:
        self.attach_default_sinks()
        with self.sinks:
            return self._train()

    def _train(self) -> TrainResult:
        job = self.write_job()
        python = swift_python(self.config)
        log_path = self.attempt_dir() / "swift" / "process.log"
        logger.info("training with swift in %s: %d steps", python, self.config.trainer.total_training_steps)
        with open(log_path, "ab") as log:
            child = _start_training_process(python, job, log)
            events: list[dict] = []
            self._refusal: Exception | None = None
            reader = threading.Thread(target=self._read_events, args=(child, events), daemon=True)
            reader.start()
            stop_sent_at = None
            while child.poll() is None:
                time.sleep(0.2)
                if stop_sent_at is None and self.should_stop():
                    Path(self._stop_file).write_text("stop")
                    stop_sent_at = time.monotonic()
                    logger.info("stop requested; the swift process stops after its current step")
                if stop_sent_at is not None and time.monotonic() - stop_sent_at > STOP_GRACE_SECONDS:
                    child.terminate()
            reader.join(timeout=10)
        if self._refusal is None:
            self._publish(None)  # those held back while the owner could not be told
        if self._refusal is not None:  # a checkpoint the run's owner refused: nothing of it is reported
            raise self._refusal
        failed = next((e for e in events if e["event"] == "failed"), None)
        if failed is not None:  # the checks every backend makes, made in the training process

            kind = getattr(outcomes, failed["kind"], None)
            kind = kind if isinstance(kind, type) and issubclass(kind, outcomes.TrainingFailed) else outcomes.TrainingFailed
            raise kind(failed["summary"], failed.get("traceback", ""))
        if child.returncode != 0:
            tail = log_path.read_text(errors="replace")[-3000:]
            if "No space left on device" in tail:  # ms-swift's process writes the checkpoints

                output = Path(json.loads(job.read_text())["swift_args"]["output_dir"])
                raise DiskFull(28, f"The disk is full: the swift training process could not write in {output} "
                                   f"({free_space(output)} free on its disk). Free space there and run it again.")
            raise RuntimeError(f"the swift training process ({python}) failed with exit code {child.returncode}:\n{tail}")
        done = next((e for e in events if e["event"] == "done"), {})
        steps = int(done.get("result", {}).get("global_step", self._last_step))
        checkpoint = done.get("result", {}).get("last_model_checkpoint")
        if checkpoint and (self.checkpoint_dir() / Path(checkpoint).name).is_dir():  # as published
            checkpoint = str(self.checkpoint_dir() / Path(checkpoint).name)
        stopped = stop_sent_at is not None and steps < self.config.trainer.total_training_steps
        OutcomeMonitor(self.config.trainer.max_episode_error_rate).check_finished(steps, stopped)
        logger.info("training %s after %d steps; model at %s", "stopped" if stopped else "finished", steps, checkpoint)
        return TrainResult(run_path=self.run_path, steps=steps, metrics=dict(self._last_metrics), checkpoint=checkpoint, stopped=stopped)

    def _read_events(self, child: subprocess.Popen, events: list[dict]) -> None:
        self._last_step, self._last_metrics = 0, {}
        for line in child.stdout:
            if not line.startswith(PREFIX):
                continue
            event = json.loads(line[len(PREFIX):])
            if event["event"] == "episodes":  # not kept in ``events``: a run's episodes would pile up there
                trainer = self.config.trainer
                self.sinks.store_episodes(event["step"], keep_for_store(
                    event["records"], trainer.log_episodes_fraction, trainer.log_episodes_per_step,
                    trainer.seed + event["step"] * 2))
                continue
            events.append(event)
            if event["event"] == "metrics":
                metrics = {_metric_name(k): v for k, v in event["metrics"].items()}
                self._last_step, self._last_metrics = event["step"], metrics
                self.sinks.log_metrics(event["step"], metrics)
                self.sinks.log_episodes(event["step"], event.get("samples", []))
            elif event["event"] == "may_save":
                self._answer_may_save(child, event["step"])
            elif event["event"] == "checkpoint" and self._refusal is None:
                self._publish(Path(event["path"]), event["step"])

    def _publish(self, folder: Path | None, step: int | None = None) -> None:
        """Publish a checkpoint ms-swift saved in this attempt's folder into the run's (while this attempt
        owns the run: ``TrainerProcessor.publish_checkpoint``); a refusal stops the training process."""
        if self.attempt is None:  # saved in the run's folder already, after the may_save check
            if folder is not None:
                self.sinks.log_checkpoint(step, folder)
            return
        try:
            self.publish_checkpoint(folder)
        except Exception as exc:  # noqa: BLE001 (re-raised from train once the process has stopped; a reader
            self._refusal = exc    # thread that died here would leave the child waiting for its may_save answer)
            Path(self._stop_file).write_text("stop")

    def _answer_may_save(self, child: subprocess.Popen, step: int) -> None:
        """The training process asks before writing a checkpoint: asked of the write checks here
        (``check_may_write``), answered on its stdin. A refusal (or a check that failed) stops it."""
        try:
            self.check_may_write(f"the checkpoint of step {step}")
        except Exception as exc:  # noqa: BLE001 (re-raised from train once the process has stopped)
            self._refusal = exc
        try:
            child.stdin.write("no\n" if self._refusal is not None else "yes\n")
            child.stdin.flush()
        except OSError:
            pass  # it is gone already

    def write_job(self) -> Path:
        cfg = self.config
        workdir = self.attempt_dir() / "swift"  # the attempt's own: a stale attempt's job never replaces the owner's
        workdir.mkdir(parents=True, exist_ok=True)
        self._stop_file = workdir / "stop"
        self._stop_file.unlink(missing_ok=True)
        key = cfg.data.prompt_key
        multi_turn = self.agent_spec.kind == "agent_env"
        with open(workdir / "train.jsonl", "w") as rows:
            for task in dataset_to_tasks(self.train_dataset):
                if multi_turn:  # the scheduler puts the agent's first messages in place of this one
                    messages = [{"role": "user", "content": "(the environment's first observation)"}]
                else:
                    prompt = task[key]
                    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
                rows.write(json.dumps({**task, "messages": messages}, default=str) + "\n")
        model, extra = self._model(workdir)
        actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
        # ms-swift saves in this attempt's own folder; each checkpoint is published into the run's (_publish),
        # and a resumed attempt starts from the newest published one.
        output = self.attempt_checkpoint_dir()
        resume = _latest_checkpoint(self.checkpoint_dir()) if cfg.trainer.resume_mode == "auto" else None
        save_freq = cfg.trainer.save_freq if cfg.trainer.save_freq > 0 else cfg.trainer.total_training_steps
        lora = cfg.actor_rollout_ref.model.lora_rank
        swift_args = {
            "rlhf_type": "grpo", "model": model, **extra,
            "dataset": [str(workdir / "train.jsonl")], "output_dir": str(output), "add_version": False,
            "tuner_type": "lora" if lora else "full", **(swift_lora_args(cfg) if lora else {}),
            "num_generations": rollout.n, "per_device_train_batch_size": cfg.data.train_batch_size * rollout.n,
            "max_steps": cfg.trainer.total_training_steps, "learning_rate": actor.optim.lr,
            "lr_scheduler_type": actor.optim.lr_scheduler_type, "warmup_steps": actor.optim.lr_warmup_steps,
            "weight_decay": actor.optim.weight_decay, "max_grad_norm": actor.grad_clip,
            "beta": actor.kl_loss_coef if actor.use_kl_loss else 0.0, "epsilon": actor.clip_ratio,
            "num_iterations": actor.ppo_epochs, "temperature": rollout.temperature, "top_p": rollout.top_p,
            "top_k": rollout.top_k if rollout.top_k > 0 else -1,  # ms-swift's "off" is -1
            "max_completion_length": cfg.rllm.agent.max_tokens_per_turn if multi_turn else cfg.data.max_response_length,
            **({"max_turns": cfg.rllm.agent.max_steps} if multi_turn else {}),
            "max_length": cfg.data.max_prompt_length + cfg.data.max_response_length,
            "logging_steps": cfg.trainer.log_freq, "save_strategy": "steps", "save_steps": save_freq,
            # its own folder keeps its newest (the published ones are hard links; the run's keep max_checkpoints)
            "save_total_limit": 1 if self.attempt is not None else cfg.trainer.max_checkpoints or None,
            "seed": cfg.trainer.seed,
            "dataset_shuffle": cfg.data.shuffle, "report_to": ["none"], "use_vllm": False,
            "check_model": False,  # else ms-swift asks ModelScope's hub whether the model is the latest, sending the run's settings
            "torch_dtype": cfg.actor_rollout_ref.model.dtype, "dataloader_num_workers": 0,
            "gradient_checkpointing": cfg.actor_rollout_ref.model.enable_gradient_checkpointing,
            "scale_rewards": "group" if cfg.algorithm.norm_adv_by_std_in_grpo else "none",
            **({"resume_from_checkpoint": resume} if resume else {}),
        }
        job = {
            "reward": None if multi_turn else self.reward_reference(),
            "agent": self.agent_reference() if multi_turn else None, "answer_key": cfg.data.answer_key, "prompt_key": key,
            "stop_file": str(self._stop_file), "cpu_threads": cfg.trainer.cpu_threads, "swift_args": swift_args,
            "max_episode_error_rate": cfg.trainer.max_episode_error_rate,
            "log_episodes": cfg.trainer.log_episodes and self.sinks.stores_episodes,
            "trajectory_timeout": cfg.rllm.agent.trajectory_timeout if multi_turn else None,
        }
        target = workdir / "job.json"
        target.write_text(json.dumps(job, indent=1))
        return target

    def _model(self, workdir: Path) -> tuple[str, dict[str, Any]]:
        """The model directory or hub id, with ms-swift's model type and template where it cannot guess them."""
        model = self.config.actor_rollout_ref.model
        if model.path != TINY_MODEL:
            return model.path, {"use_hf": True}  # hub ids from Hugging Face's hub and cache, as the other backends load them
        from training.rollouts.tiny import build_char_tokenizer, save_tiny_model  # brings in torch: imported on first use

        target = save_tiny_model(self.path / "base_model", layers=model.tiny_layers, hidden_size=model.tiny_hidden_size, seed=self.config.trainer.seed)
        tokenizer = build_char_tokenizer()
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE  # ms-swift renders prompts through a chat template
        tokenizer.save_pretrained(target)
        # The tiny model is a Qwen2; its template renders the messages' text as our engine does.
        return str(target), {"model_type": "qwen2", "template": PLAIN_TEMPLATE}


def refuse_model_code(model: Any) -> None:
    """ms-swift loads every model with ``trust_remote_code=True`` (it has no setting to turn that
    off), so a model that ships its own code is refused unless ``trust_remote_code`` allows it: the
    model's files are looked at here (a local directory, or a hub id's files in the local cache)."""
    if model.trust_remote_code or model.path == TINY_MODEL:
        return
    why = ("the swift backend cannot keep a model's own code from running (ms-swift always loads models with "
           "trust_remote_code=True), so it trains only models that ship none unless actor_rollout_ref.model."
           "trust_remote_code allows it (on the platform, an administrator marks the model trusted)")
    directory = Path(model.path)
    if not directory.is_dir():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model.path, "config.json")
        if not isinstance(cached, str):
            raise ConfigError("actor_rollout_ref.model.path", f"{model.path} is not a directory and not in the local model "
                              f"cache, so its files cannot be checked for code; {why}.")
        directory = Path(cached).parent
    code = sorted(p.name for p in directory.glob("*.py"))
    try:
        auto_map = json.loads((directory / "config.json").read_text()).get("auto_map")
    except (OSError, ValueError):
        auto_map = None
    if code or auto_map:
        shipped = ", ".join(code) if code else f"config.json auto_map {auto_map}"
        raise ConfigError("actor_rollout_ref.model.path", f"{model.path} ships its own code ({shipped}); {why}.")


def swift_lora_args(config: Config) -> dict[str, Any]:
    """ms-swift's LoRA arguments for verl's keys (ms-swift's own names; its lora_alpha defaults to 32, ours to verl's 16)."""
    model = config.actor_rollout_ref.model
    targets = [model.target_modules] if isinstance(model.target_modules, str) else list(model.target_modules)
    return {"lora_rank": model.lora_rank, "lora_alpha": model.lora_alpha, "target_modules": targets}


def _latest_checkpoint(directory: Path) -> str | None:
    found = sorted(directory.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]) if p.name.split("-")[1].isdigit() else -1)
    return str(found[-1]) if found else None


if __name__ == "__main__":  # pragma: no cover - a quick check of an environment
    print(environment_problem(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PYTHON) or "ok")
