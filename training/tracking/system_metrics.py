"""System metrics of the training process, like W&B's system tab: CPU, memory and, per GPU,
utilisation, memory and power.

A background thread samples every ``interval`` seconds (psutil for CPU and memory, NVML through
``nvidia-ml-py`` for GPUs); each logged step gets the mean of the samples taken since the step
before, as ``system/*`` metrics, so every sink (database, W&B, TensorBoard, MLflow, ...) receives
them on the same step axis as the training metrics and stores each once.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from typing import Any

logger = logging.getLogger("training")


def gpu_handles() -> list[Any]:
    """NVML handles of the GPUs this process sees (none without a driver or without nvidia-ml-py)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no NVIDIA driver here: CPU and memory only
        return []


def sample_gpu(index: int, handle: Any) -> dict[str, float]:
    import pynvml

    values: dict[str, float] = {}
    try:
        values[f"system/gpu_utilization/{index}"] = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        values[f"system/gpu_memory_gb/{index}"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 1e9
        values[f"system/gpu_power_watts/{index}"] = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
    except pynvml.NVMLError as exc:  # a field this GPU does not report (e.g. power on some boards)
        logger.debug("NVML: GPU %d: %s", index, exc)
    return values


class SystemMetrics:
    """Samples in a daemon thread; ``collect()`` returns the means since the last call (empty if none)."""

    def __init__(self, interval: float = 5.0) -> None:
        import psutil

        self.interval = interval
        self.process = psutil.Process()
        self.gpus = gpu_handles()
        self._samples: list[dict[str, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        psutil.cpu_percent(None)  # the first reading of a counter is meaningless: prime them
        self.process.cpu_percent(None)

    def sample(self) -> dict[str, float]:
        import psutil

        memory = psutil.virtual_memory()
        rss = self.process.memory_info().rss
        for child in self.process.children(recursive=True):  # data loaders, Ray workers, reward processes
            try:
                rss += child.memory_info().rss
            except psutil.Error:
                pass
        values = {
            "system/cpu/machine": psutil.cpu_percent(None),  # percent of all cores
            "system/cpu/process": self.process.cpu_percent(None),  # percent of one core, as top shows it
            "system/memory_gb/machine": (memory.total - memory.available) / 1e9,
            "system/memory_gb/process": rss / 1e9,
        }
        for index, handle in enumerate(self.gpus):
            values.update(sample_gpu(index, handle))
        return values

    def start(self) -> "SystemMetrics":
        self._thread = threading.Thread(target=self._run, name="system-metrics", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                values = self.sample()
            except Exception:  # never stop training for a sampler
                logger.exception("system metrics: a sample failed; sampling stops")
                return
            with self._lock:
                self._samples.append(values)
            if self._stop.wait(self.interval):
                return

    def collect(self) -> dict[str, float]:
        with self._lock:
            samples, self._samples = self._samples, []
        sums: dict[str, list[float]] = defaultdict(list)
        for values in samples:
            for name, value in values.items():
                sums[name].append(value)
        return {name: sum(values) / len(values) for name, values in sums.items()}

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
