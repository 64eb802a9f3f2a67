"""The contract every training backend implements, and the registry of backends by name."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from training.log import logger
from training.rollouts.outcomes import RewardTrace, learning_warnings
from training.tracking.sinks import MetricSink, MultiSink
from training.utils import checkpoint_step, import_object
from training.errors import DiskFull, OwnerUnknown, RunSuperseded

T = TypeVar("T")

# The run's record files: an attempt writes them in its own folder and publishes them into the run's
# (its config at construction, the appended ones with each checkpoint and at the end).
RUN_RECORDS = ("config.yaml", "verl_config.yaml", "metrics.jsonl", "episodes.jsonl")


def disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is a full disk: ENOSPC, or the libraries' words for it
    (torch's stream writer, safetensors)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        if any(words in str(exc) for words in ("No space left on device", "file write failed", "StorageFull")):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def free_bytes(folder: str | Path) -> int:
    """The free space of ``folder``'s disk (its nearest existing parent's)."""
    path = Path(folder)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def free_space(folder: str | Path) -> str:
    """The free space of ``folder``'s disk, for people."""
    free = free_bytes(folder)
    return f"{free / 2**20:.1f} MB" if free < 2**30 else f"{free / 2**30:.1f} GB"


def attempt_folder(run_path: str | Path, attempt: int) -> Path:
    """The folder of a run's attempt ``attempt``: ``<run path>/attempts/<attempt>``."""
    return Path(run_path) / "attempts" / str(attempt)


class TrainerProcessor(ABC):
    """A training backend. ``AgentTrainer`` calls, in this order: ``check_agent``,
    ``check_dataset``, ``check_reward``, ``check_config``, then ``mark_initialized`` and ``train``.

    Each ``check_*`` validates one input, converts it to what the backend needs and keeps it;
    it raises ``ValueError`` (or a subclass) that says what is wrong and how to fix it.
    """

    #: Whether training runs in an interpreter of its own (``trainer.python``; on the platform the
    #: Backend's ``python``), so that its environment is checked there, not in the caller's process.
    own_interpreter: bool = False
    #: A full disk while a checkpoint or the final model is written (``write_files``): "fail" the
    #: run naming the folder and its free space, or "pause" until the disk has room again.
    on_full_disk: str = "fail"
    full_disk_check_seconds: float = 5.0

    def __init__(self, run_path: str) -> None:
        self.run_path = str(run_path)
        self.sinks = MultiSink()
        # Sees every step's reward whatever the backend, for ``learning_warnings``.
        self.reward_trace = RewardTrace()
        self.sinks.add(self.reward_trace)
        # Keeps the value of trainer.metric_for_best_model at each step, to rank the published checkpoints.
        self.best_metric = BestMetricTrace(self)
        self.sinks.add(self.best_metric)
        self._initialized = False
        self._stop = threading.Event()
        self._stop_checks: list[Callable[[], bool]] = []
        self._write_checks: list[Callable[[], bool]] = []
        self.kept_checkpoints: Callable[[], set[int]] | None = None  # steps the rotation never removes
        #: The attempt of the run this process trains (a platform's fencing token), or None: with one,
        #: checkpoints and the final model are written in ``attempt_dir`` and published into the run's
        #: folder (``publish``); without, they are written there directly.
        self.attempt: int | None = None
        self.write_fence: Callable[[Callable[[], None], bool], bool] | None = None
        self._unpublished: list[Path] = []

    @abstractmethod
    def train(self) -> Any:
        """Load data and model, run the training loop, save checkpoints."""

    @abstractmethod
    def check_agent(self, agent: Any) -> None:
        """Validate the agent (or its config path) and convert it for this backend."""

    @abstractmethod
    def check_dataset(self, dataset: Any = None, test_dataset: Any = None) -> None:
        """Validate and load the training and test datasets."""

    @abstractmethod
    def check_reward(self, reward_func: Any = None) -> None:
        """Validate and load the reward function (callable, import path or file path)."""

    @abstractmethod
    def check_config(self, config: Any = None) -> Any:
        """Validate the config, fill in defaults, and return the final config."""

    def inference(self, dataset: Any = None) -> Any:
        """Run the agent on ``dataset`` (default: the test dataset); return predictions and metrics.

        Optional, as in AWorld: a backend without it raises NotImplementedError. It may be a
        coroutine function; ``AgentTrainer.inference()`` awaits either kind.
        """
        raise NotImplementedError(f"the {type(self).__name__} training processor does not implement inference().")

    def learning_warnings(self) -> list[str]:
        """After training: warnings about a run that trained but had nothing to learn from (its
        reward the same at every step), naming the likely cause; empty when the reward moved."""
        return learning_warnings(self.reward_trace)

    def mark_initialized(self) -> None:
        self._initialized = True

    @property
    def initialized(self) -> bool:
        return self._initialized

    @property
    def path(self) -> Path:
        return Path(self.run_path)

    def add_sink(self, sink: MetricSink) -> None:
        self.sinks.add(sink)

    def request_stop(self) -> None:
        """Ask training to stop after the current step (cooperative; safe from any thread)."""
        self._stop.set()

    def add_stop_check(self, check: Callable[[], bool]) -> None:
        """A callable polled once per step; training stops when it returns True."""
        self._stop_checks.append(check)

    def add_write_check(self, check: Callable[[], bool]) -> None:
        """A callable asked before each file of the run is written (a checkpoint, the final model):
        False when another process owns the run now (a platform's later attempt of it)."""
        self._write_checks.append(check)

    def check_may_write(self, what: str) -> None:
        """Before writing ``what`` into the run's folder: raise ``RunSuperseded`` (and stop training)
        when a write check says this process may not write any more."""
        if not all(check() for check in self._write_checks):
            self._stop.set()
            raise RunSuperseded(f"Not writing {what}: another process owns this run now.")

    def write_files(self, what: str, folder: str | Path, write: Callable[[], T]) -> T:
        """Write ``what`` (a checkpoint, the final model) into ``folder`` with ``write()``, after
        ``check_may_write``. On a full disk the partial ``folder`` is removed (the last whole
        checkpoint stays what a resume starts from), then the run fails with ``DiskFull`` naming
        the folder and its free space, or with ``on_full_disk="pause"`` it waits (checking every
        ``full_disk_check_seconds``) until the disk has more room than it had, and writes again."""
        paused_at = None
        while True:
            self.check_may_write(what)
            try:
                result = write()
            except Exception as exc:
                if not disk_full(exc):
                    raise
                shutil.rmtree(folder, ignore_errors=True)
                message = f"The disk is full: {what} did not fit in {folder} ({free_space(folder)} free on its disk)."
                if self.on_full_disk != "pause":
                    raise DiskFull(errno.ENOSPC, f"{message} The last whole checkpoint is kept; free space on that disk "
                                   "and run it again.") from exc
                if paused_at is None:
                    paused_at = time.monotonic()
                    logger.error("%s Training is paused until the disk has room (checked every %.0f s).",
                                 message, self.full_disk_check_seconds)
                free = free_bytes(folder)
                while free_bytes(folder) <= free:
                    if self.should_stop():
                        raise DiskFull(errno.ENOSPC, f"{message} Stopped while waiting for room.") from exc
                    time.sleep(self.full_disk_check_seconds)
                continue
            if paused_at is not None:
                logger.info("%s written after waiting %.0f s for room on its disk.", what, time.monotonic() - paused_at)
            return result

    # -- the run's published files ---------------------------------------------------------------
    def checkpoint_dir(self) -> Path:
        """Where the run's checkpoints are published (and a resumed attempt starts from):
        ``trainer.default_local_dir``, else ``<run path>/checkpoints``."""
        configured = getattr(getattr(getattr(self, "config", None), "trainer", None), "default_local_dir", None)
        return Path(configured) if configured else self.path / "checkpoints"

    def attempt_dir(self) -> Path:
        """This attempt's own folder (``<run path>/attempts/<n>``): what it writes before publishing.
        Without an attempt, the run's folder."""
        return attempt_folder(self.path, self.attempt) if self.attempt is not None else self.path

    def attempt_checkpoint_dir(self) -> Path:
        """Where this attempt's trainer saves its checkpoints (and rotates them): its own folder's
        ``checkpoints``, or, without an attempt, the run's (``checkpoint_dir``)."""
        return self.attempt_dir() / "checkpoints" if self.attempt is not None else self.checkpoint_dir()

    def set_write_fence(self, fence: Callable[[Callable[[], None], bool], bool]) -> None:
        """``fence(action, wait)`` runs ``action`` only while this process owns the run, so that no
        other process can take the run over between the check and the action (a platform: under a
        lock of the run's row), and says whether it ran. It raises ``OwnerUnknown`` when it cannot
        tell now (with ``wait``, after waiting for the answer as long as it may)."""
        self.write_fence = fence

    def _while_owner(self, action: Callable[[], None], wait: bool) -> bool:
        if self.write_fence is not None:
            return self.write_fence(action, wait)
        if not all(check() for check in self._write_checks):
            return False
        action()
        return True

    def publish(self, what: str, source: Path, target: Path, after: Callable[[], None] | None = None,
                wait: bool = False) -> Path:
        """Publish ``source`` (a folder this attempt wrote in its own folder) as the run's ``target``:
        hard-linked into a staging folder of the attempt, then, while the attempt owns the run, put
        in place with a rename (an older ``target`` moved aside first, then removed) and ``after``
        run. A process that no longer owns the run publishes nothing: ``RunSuperseded`` (training
        stops). ``OwnerUnknown`` when ownership cannot be told now. Without an attempt ``source``
        is ``target``, already in place."""
        source, target = Path(source), Path(target)
        if source.resolve() == target.resolve():
            if after is not None and not self._while_owner(after, wait):
                self._refused(what)
            return target
        staged = self.attempt_dir() / "publishing" / target.name
        moved = self.attempt_dir() / "replaced" / target.name
        for folder in (staged, moved):
            shutil.rmtree(folder, ignore_errors=True)
            folder.parent.mkdir(parents=True, exist_ok=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, staged, copy_function=_link_or_copy)  # hard links: the weights are not written twice

        def put_in_place() -> None:
            if target.exists():
                os.rename(target, moved)
            os.rename(staged, target)
            if after is not None:
                after()

        try:
            published = self._while_owner(put_in_place, wait)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        shutil.rmtree(moved, ignore_errors=True)
        if not published:
            shutil.rmtree(staged, ignore_errors=True)
            self._refused(what)
        return target

    def publish_run_files(self, names: tuple[str, ...] = RUN_RECORDS, wait: bool = False) -> bool:
        """Publish the run's record files this attempt writes in its own folder (``RUN_RECORDS``: its
        config, ``metrics.jsonl``, ``episodes.jsonl``) into the run's, as ``publish`` does a checkpoint:
        copied (never linked: the attempt goes on appending to its own), then renamed into place while
        the attempt owns the run. False when ownership cannot be told now (published the next time);
        ``RunSuperseded`` when another process owns the run. Without an attempt they are in place."""
        staged = self._stage_run_files(names)
        if not staged:
            return True
        try:
            published = self._while_owner(lambda: _put_in_place(staged), wait)
        except OwnerUnknown:
            _discard(staged)
            return False
        if not published:
            _discard(staged)
            self._refused("the run's records")
        return True

    def _stage_run_files(self, names: tuple[str, ...] = RUN_RECORDS) -> list[tuple[Path, Path]]:
        if self.attempt is None:
            return []
        folder = self.attempt_dir() / "publishing"
        staged = []
        for name in names:
            source = self.attempt_dir() / name
            if source.is_file():
                folder.mkdir(parents=True, exist_ok=True)
                copy = folder / f"{name}.{os.getpid()}"
                shutil.copyfile(source, copy)
                staged.append((copy, self.path / name))
        return staged

    def seed_run_files(self, names: tuple[str, ...] = ("metrics.jsonl", "episodes.jsonl")) -> Path:
        """The folder the run's appended records go to: this attempt's own, starting from what the
        run has published (the earlier attempts' records up to their last published checkpoint),
        or, without an attempt, the run's."""
        folder = self.attempt_dir()
        if self.attempt is not None:
            folder.mkdir(parents=True, exist_ok=True)
            for name in names:
                published, own = self.path / name, folder / name
                if published.is_file() and not own.exists():
                    shutil.copyfile(published, own)
        return folder

    def _refused(self, what: str) -> None:
        self._stop.set()
        raise RunSuperseded(f"Not publishing {what}: another process owns this run now.")

    def publish_checkpoint(self, folder: str | Path | None, after: Callable[[Path], None] | None = None) -> list[tuple[int, Path]]:
        """Publish a checkpoint this attempt saved whole (``attempt_checkpoint_dir``/``<name ending
        in its step>``) into ``checkpoint_dir``, with those an earlier call could not publish (its
        owner unknown: the database away) first; the run's published checkpoints past
        ``trainer.max_checkpoints`` are removed in the same step, and ``after(published folder)``
        run (verl's marker file). Returns (step, published folder) of each published now; the sinks
        are told of each (``log_checkpoint``). ``folder`` None: only those held back."""
        if folder is not None and Path(folder) not in self._unpublished:
            self._unpublished.append(Path(folder))
        done = []
        while self._unpublished:
            source = self._unpublished[0]
            step = checkpoint_step(source.name)
            if source.is_dir() and step is not None:
                target = self.checkpoint_dir() / source.name

                records = self._stage_run_files()  # the records up to this checkpoint, published with it

                def then(target: Path = target, records: list = records) -> None:
                    self._rotate_published()
                    _put_in_place(records)
                    if after is not None:
                        after(target)

                try:
                    self.publish(f"the checkpoint of step {step}", source, target, after=then)
                except OwnerUnknown as exc:
                    logger.warning("checkpoint %s: not published yet (%s); published with the next one", source.name, exc)
                    return done
                finally:
                    _discard(records)
                done.append((step, target))
                self.sinks.log_checkpoint(step, target)
            self._unpublished.pop(0)
        return done

    def held_back(self) -> list[Path]:
        """Checkpoints this attempt saved whole but could not publish yet (the database away), oldest
        first: ``publish_checkpoint`` publishes them with the next one."""
        return list(self._unpublished)

    def _rotate_published(self) -> None:
        """Remove the run's published checkpoints past the newest ``trainer.max_checkpoints``, except
        the best ``trainer.keep_best_checkpoints`` by ``trainer.metric_for_best_model`` (ranked by the
        metric's value at each checkpoint's own step; the values are kept beside the checkpoints in
        ``BEST_METRIC_FILE``, so a later attempt ranks those of earlier ones too) and those of the
        steps ``kept_checkpoints`` names (a platform's aliases)."""
        trainer = getattr(getattr(self, "config", None), "trainer", None)
        keep = int(getattr(trainer, "max_checkpoints", 0) or 0)
        folder = self.checkpoint_dir()
        if keep <= 0 or not folder.is_dir():
            return
        found = sorted((step, path) for path in folder.iterdir()
                       if path.is_dir() and (step := checkpoint_step(path.name)) is not None)
        kept = {step for step, _ in found[-keep:]}
        if getattr(trainer, "metric_for_best_model", None):
            kept |= self._rank_and_record([step for step, _ in found], also=kept)
        if self.kept_checkpoints is not None:  # named by the platform's aliases: asked at each rotation
            kept |= set(self.kept_checkpoints())
        for step, path in found:
            if step not in kept:
                shutil.rmtree(path, ignore_errors=True)

    def best_checkpoint_steps(self, steps: Iterable[int]) -> set[int]:
        """Which of the checkpoints of ``steps`` a rotation keeps as the best: the best
        ``trainer.keep_best_checkpoints`` by ``trainer.metric_for_best_model``, ranked by the metric's value
        at each one's own step (empty without the metric). The one rule of the run's published checkpoints
        (``_rotate_published``) and of the artifact store's copies (``RunUploader``'s pruning, which
        stores the ``BEST_METRIC_FILE`` this writes, so an attempt on another machine ranks them too)."""
        trainer = getattr(getattr(self, "config", None), "trainer", None)
        if not getattr(trainer, "metric_for_best_model", None):
            return set()
        return self._rank_and_record(steps)

    def _rank_and_record(self, steps: Iterable[int], also: Iterable[int] = ()) -> set[int]:
        """The best of ``steps``; their values (and those of ``also``, known ones) are written to
        ``BEST_METRIC_FILE`` beside the published checkpoints, for a later attempt to rank them."""
        values = self._best_metric_values(steps)
        best = self._best_of(values)
        recorded = best | set(also)
        folder = self.checkpoint_dir()
        folder.mkdir(parents=True, exist_ok=True)
        write_best_metric(folder, self.config.trainer.metric_for_best_model,
                          {step: values[step] for step in values if step in recorded})
        return best

    def _best_of(self, values: dict[int, float]) -> set[int]:
        trainer = self.config.trainer
        return set(best_steps(values, trainer.keep_best_checkpoints, greater_is_better(trainer)))

    def _best_metric_values(self, steps: Iterable[int]) -> dict[int, float]:
        """The value of ``trainer.metric_for_best_model`` at each of ``steps`` known: those kept beside the
        published checkpoints (``BEST_METRIC_FILE``, earlier attempts') and those this attempt logged."""
        metric = self.config.trainer.metric_for_best_model
        values = {**read_best_metric(self.checkpoint_dir(), metric), **self.best_metric.values}
        wanted = set(steps)
        return {step: value for step, value in values.items() if step in wanted}

    @classmethod
    def environment_status(cls, config: Any = None) -> dict[str, str | None]:
        """What this backend needs from the machine it runs on, checked without training:
        ``{"environment": problem or None, "credentials": problem or None}`` (None: fine or
        not needed). ``check_backend`` refuses a run for the same problems."""
        return {"environment": None, "credentials": None}

    def should_stop(self) -> bool:
        if not self._stop.is_set() and any(check() for check in self._stop_checks):
            self._stop.set()
        return self._stop.is_set()


def _put_in_place(staged: list[tuple[Path, Path]]) -> None:
    for copy, target in staged:
        os.replace(copy, target)


def _discard(staged: list[tuple[Path, Path]]) -> None:
    for copy, _ in staged:
        copy.unlink(missing_ok=True)


# Beside the published checkpoints: the value of trainer.metric_for_best_model at each kept one's step.
BEST_METRIC_FILE = "best_metric.json"


class BestMetricTrace:
    """A ``MetricSink`` that keeps the value of ``trainer.metric_for_best_model`` at each step it is
    logged (the processor's config, read when each step is logged: it is built after the sinks)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.values: dict[int, float] = {}

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        trainer = getattr(getattr(self.processor, "config", None), "trainer", None)
        metric = getattr(trainer, "metric_for_best_model", None)
        value = metrics.get(metric) if metric else None
        if isinstance(value, (int, float)) and math.isfinite(value):
            self.values[int(step)] = float(value)

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass


def greater_is_better(trainer: Any) -> bool:
    """``trainer.greater_is_better``, or HF's rule when unset: larger is better unless the metric is a loss."""
    given = getattr(trainer, "greater_is_better", None)
    return bool(given) if given is not None else not str(trainer.metric_for_best_model).endswith("loss")


def best_steps(values: dict[int, float], count: int, greater: bool) -> list[int]:
    """The ``count`` steps with the best values, best first (on a tie, the newer step)."""
    ranked = sorted(values.items(), key=lambda item: (-item[1] if greater else item[1], -item[0]))
    return [step for step, _ in ranked[:count]]


def read_best_metric(folder: Path, metric: str) -> dict[int, float]:
    """The values ``BEST_METRIC_FILE`` in ``folder`` keeps for ``metric`` (empty: none, or another metric's)."""
    try:
        return parse_best_metric(json.loads((folder / BEST_METRIC_FILE).read_text()), metric)
    except (OSError, ValueError):
        return {}


def parse_best_metric(kept: Any, metric: str) -> dict[int, float]:
    """The values a ``BEST_METRIC_FILE``'s content (parsed) keeps for ``metric`` (empty: another metric's, or not one)."""
    try:
        if kept.get("metric") != metric:
            return {}
        return {int(step): float(value) for step, value in kept.get("values", {}).items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def write_best_metric(folder: Path, metric: str, values: dict[int, float]) -> None:
    """Write ``BEST_METRIC_FILE`` in ``folder`` whole (a reader never sees half of it)."""
    partial = folder / f".{BEST_METRIC_FILE}.partial"
    partial.write_text(json.dumps({"metric": metric, "values": {str(step): values[step] for step in sorted(values)}}))
    os.replace(partial, folder / BEST_METRIC_FILE)


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another disk, or a filesystem without hard links
        shutil.copy2(source, target)


# Built-in backends are named by import path so that importing this module never imports
# torch, TRL or verl: the web app starts without them.
BUILTIN_PROCESSORS: dict[str, str] = {
    "trl": "training.backends.trl.backend.TRLProcessor",
    "verl": "training.backends.verl.backend.VerlProcessor",
    "tinker": "training.backends.tinker_protocol.tinker.TinkerProcessor",
    "fireworks": "training.backends.tinker_protocol.fireworks.FireworksProcessor",
    "swift": "training.backends.swift.backend.SwiftProcessor",
}
_PROCESSORS: dict[str, type[TrainerProcessor] | str] = dict(BUILTIN_PROCESSORS)


def register_processor(name: str, processor_cls: type[TrainerProcessor]) -> None:
    """Make ``processor_cls`` available as ``train_engine_name=name``. A taken name raises ValueError."""
    if not isinstance(name, str) or not name:
        raise ValueError("A processor name must be a non-empty string.")
    if not (isinstance(processor_cls, type) and issubclass(processor_cls, TrainerProcessor)):
        raise ValueError(f"{processor_cls!r} is not a subclass of TrainerProcessor.")
    if name in _PROCESSORS or name == "auto":
        raise ValueError(
            f"A training processor named {name!r} is already registered; "
            f"unregister_processor({name!r}) first or choose another name."
        )
    _PROCESSORS[name] = processor_cls


def unregister_processor(name: str) -> None:
    """Remove a processor. Unknown names raise ValueError listing the known ones."""
    if name not in _PROCESSORS:
        raise ValueError(f"No training processor named {name!r}; known: {', '.join(available_processors())}.")
    del _PROCESSORS[name]


def processor(name: str) -> Callable[[type[TrainerProcessor]], type[TrainerProcessor]]:
    """Class decorator form of ``register_processor``."""

    def decorate(cls: type[TrainerProcessor]) -> type[TrainerProcessor]:
        register_processor(name, cls)
        return cls

    return decorate


def available_processors() -> list[str]:
    return sorted(_PROCESSORS)


def get_processor_class(name: str) -> type[TrainerProcessor]:
    """Look a processor up by name, importing a built-in one on first use."""
    if name not in _PROCESSORS:
        raise ValueError(f"Unknown training backend {name!r}; known backends: {', '.join(available_processors())}.")
    entry = _PROCESSORS[name]
    if isinstance(entry, str):
        entry = import_object(entry, what=f"the {name!r} backend")
        _PROCESSORS[name] = entry
    return entry
