"""The system metrics sampler: CPU and memory on any machine, per-GPU fields where NVML sees a GPU."""

import time

import pytest

from training.tracking.sinks import MultiSink
from training.tracking.system_metrics import SystemMetrics


def sampled(sampler: SystemMetrics, count: int = 2, timeout: float = 30) -> None:
    """Until ``sampler`` holds ``count`` samples (a busy machine may take far longer than the interval)."""
    deadline = time.monotonic() + timeout
    while True:
        with sampler._lock:
            if len(sampler._samples) >= count:
                return
        assert time.monotonic() < deadline, f"fewer than {count} samples in {timeout} s"
        time.sleep(0.01)


def test_each_step_gets_the_mean_of_the_samples_since_the_last_and_nothing_twice(sink):
    sampler = SystemMetrics(interval=0.05).start()
    sinks = MultiSink([sink])
    sinks.add_source(sampler)
    sampled(sampler)
    sinks.log_metrics(1, {"reward": 0.5})
    first = sink.metrics[-1]
    assert first["reward"] == 0.5 and 0 <= first["system/cpu/machine"] <= 100
    assert first["system/memory_gb/process"] > 0.05 and first["system/memory_gb/machine"] >= first["system/memory_gb/process"] / 2
    sampler._stop.set()  # no new samples: the next step carries no system metrics at all
    sampler._thread.join()
    sampler.collect()
    sinks.log_metrics(2, {"reward": 0.6})
    assert not any(key.startswith("system/") for key in sink.metrics[-1])
    sinks.close()
    assert sink.closed


@pytest.mark.gpu
def test_gpu_utilisation_memory_and_power_per_gpu():
    import torch

    held = torch.ones(256, 1024, 1024, device="cuda")  # 1 GiB on GPU 0, before the first sample
    torch.cuda.synchronize()
    sampler = SystemMetrics(interval=0.05).start()
    sampled(sampler)
    values = sampler.collect()
    sampler.close()
    assert values["system/gpu_memory_gb/0"] >= 1.0
    assert 0 <= values["system/gpu_utilization/0"] <= 100
    assert values["system/gpu_power_watts/0"] > 0
    del held
