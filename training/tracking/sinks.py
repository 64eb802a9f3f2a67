"""Metric sinks: where a backend's numbers and sample episodes go.

Every backend reports through a ``MetricSink``; the web platform adds its own sink (database
plus live push) without touching any backend.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

logger = logging.getLogger("training")


@runtime_checkable
class MetricSink(Protocol):
    """Receives what a training run reports. Methods are called from the training thread."""

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """One logged step: metric name to value (floats only)."""

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        """Sample episodes of that step, each an ``Episode.to_dict()``."""

    def close(self) -> None:
        """The run is over; flush what is buffered.

        A sink that keeps every episode (the episode store: ``training.tracking.episodes``) also
        defines ``store_episodes(step, records)``: each step's records, whole (token ids, mask,
        logprobs), called from the training thread; it must return at once.

        A sink that records how a run ended (``RemoteSink``) may also define
        ``log_outcome(status, error)``: it is called just before ``close`` when the run raised
        (``failed``, or ``cancelled`` for Ctrl-C), so ``close`` never reports a failed run as done."""


class ConsoleSink:
    """One line per logged step with the headline numbers."""

    HEADLINE = ("reward", "reward_std", "loss", "kl", "entropy", "response_length", "turns", "solve_rate", "step_time")

    def __init__(self, total_steps: int | None = None) -> None:
        self.total_steps = total_steps

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        shown = [f"{k}={metrics[k]:.4g}" for k in self.HEADLINE if k in metrics]
        if not shown:  # e.g. validation scores alone, which the backend logs itself
            return
        of = f"/{self.total_steps}" if self.total_steps else ""
        logger.info("step %d%s %s", step, of, " ".join(shown))

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlSink:
    """``metrics.jsonl`` (one JSON object per logged step) and ``episodes.jsonl`` in the run directory."""

    def __init__(self, run_path: str | Path) -> None:
        self.run_path = Path(run_path)
        self.run_path.mkdir(parents=True, exist_ok=True)
        self._metrics = open(self.run_path / "metrics.jsonl", "a", buffering=1)
        self._episodes = open(self.run_path / "episodes.jsonl", "a", buffering=1)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, "time": time.time(), **{k: _json_float(v) for k, v in metrics.items()}}
        self._metrics.write(json.dumps(record) + "\n")

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        for episode in episodes:
            self._episodes.write(json.dumps({"step": step, **episode}, default=str) + "\n")

    def close(self) -> None:
        self._metrics.close()
        self._episodes.close()


class MultiSink:
    """Fans out to several sinks. A sink that raises is logged and dropped, never stopping training."""

    def __init__(self, sinks: list[MetricSink] | None = None) -> None:
        self.sinks: list[MetricSink] = list(sinks or [])
        self.sources: list[Any] = []
        self.closed = False

    def add_source(self, source: Any) -> None:
        """Extra metrics merged into each logged step: ``source.collect()`` returns them (e.g. system
        metrics averaged since the last step; empty when nothing new), ``source.close()`` stops it."""
        self.sources.append(source)

    def add(self, sink: MetricSink) -> None:
        if not isinstance(sink, MetricSink):
            raise TypeError(f"{type(sink).__name__} is not a MetricSink (needs log_metrics, log_episodes, close).")
        self.sinks.append(sink)
        self.closed = False  # the next close() closes it

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for source in self.sources:
            clean.update(source.collect())
        self._each("log_metrics", step, clean)

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        if episodes:
            self._each("log_episodes", step, episodes)

    @property
    def stores_episodes(self) -> bool:
        """Whether a sink keeps every episode (``store_episodes``): when none does, no records are built."""
        return any(hasattr(sink, "store_episodes") for sink in self.sinks)

    def store_episodes(self, step: int, records: list[dict[str, Any]]) -> None:
        """A step's episode store records (``training.tracking.episodes``), to the sinks that keep them."""
        if records:
            self._each("store_episodes", step, records, optional=True)

    def log_checkpoint(self, step: int, path: str | Path) -> None:
        """A checkpoint of ``step`` is saved whole at ``path``. Optional for a sink: those that keep
        files (``training.platform.artifacts.CheckpointUploadSink``) define it."""
        self._each("log_checkpoint", step, path, optional=True)

    def log_optimizer_state(self, record: dict[str, Any]) -> None:
        """What a run starting from a checkpoint's weights (a fork) carried of that checkpoint's optimizer
        state: ``{"carried": bool, "why": str}`` (why not; empty when carried). Optional for a sink: a
        platform's defines it to record it on the run."""
        self._each("log_optimizer_state", record, optional=True)

    def __enter__(self) -> "MultiSink":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Closes every sink; when the run raised, first tells those that record an outcome."""
        if exc is not None:
            status = "cancelled" if isinstance(exc, KeyboardInterrupt) else "failed"
            self._each("log_outcome", status, f"{exc_type.__name__}: {exc}", optional=True)
        self.close()

    def close(self) -> None:
        """Closes every sink once (a second call does nothing)."""
        if self.closed:
            return
        self.closed = True
        for source in self.sources:
            source.close()
        self.sources.clear()
        self._each("close")

    def _each(self, method: str, *args: Any, optional: bool = False) -> None:
        for sink in list(self.sinks):
            if optional and not hasattr(sink, method):
                continue
            try:
                getattr(sink, method)(*args)
            except Exception:
                logger.exception("metric sink %s failed in %s; it is removed", type(sink).__name__, method)
                self.sinks.remove(sink)


def _json_float(value: float) -> float | None:
    return None if isinstance(value, float) and (math.isnan(value) or math.isinf(value)) else value
