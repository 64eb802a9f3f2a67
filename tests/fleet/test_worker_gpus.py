"""Workers report the GPUs they own: ``workers.gpus.inventory`` reads nvidia-smi, and a real Celery
worker answers the ``gpus`` inspect command the workers page asks. There is no GPU on the test
machine, so a stand-in ``nvidia-smi`` (a script printing what the real one prints for two H100s)
takes the driver's place: that is the only thing faked here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest
from django.conf import settings
from django.db import connection

from webapp.fleet.control import list_workers
from workers.processes import database_url
from workers.gpus import inventory

NVIDIA_SMI = """#!/bin/sh
# What `nvidia-smi --query-gpu=index,name,memory.total,memory.used,utilization.gpu
# --format=csv,noheader,nounits` prints on a two-GPU host.
echo "0, NVIDIA H100 80GB HBM3, 81559, 4, 0"
echo "1, NVIDIA H100 80GB HBM3, 81559, 40211, [N/A]"
"""


@pytest.fixture
def fake_driver(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(NVIDIA_SMI)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return bin_dir


def test_inventory_parses_nvidia_smi(fake_driver):
    assert inventory() == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "memory_used_mib": 4, "utilization_percent": 0},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "memory_used_mib": 40211,
         "utilization_percent": None},
    ]


def test_a_worker_limited_by_cuda_visible_devices_owns_only_those(fake_driver, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [gpu["index"] for gpu in inventory()] == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert inventory() == []


def test_no_driver_no_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert inventory() == []


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_reports_its_gpus_to_the_workers_page(fake_driver, tmp_path):
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DATABASE_URL": database_url(connection.settings_dict), "PLATFORM_VAR_DIR": str(settings.VAR_DIR),
           "RUN_WARM_PROCESS": "1"}  # asked for, but a machine with GPUs gets none: CUDA and fork do not mix
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", name, "--concurrency", "1", "-n", f"{name}@%h",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=settings.BASE_DIR, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            mine = [w for w in list_workers() if w.name.startswith(f"{name}@")]
            if mine and mine[0].gpus and mine[0].queues:  # three broadcasts: under load one may answer later
                break
            time.sleep(0.5)
        else:
            pytest.fail("the worker never reported its GPUs:\n" + log.read_text()[-3000:])
        assert mine[0].queues == [name] and [gpu["index"] for gpu in mine[0].gpus] == [0, 1]
        assert mine[0].gpus[1]["memory_used_mib"] == 40211
        started = [" ".join(child.cmdline()) for child in psutil.Process(worker.pid).children(recursive=True)]
        assert not [c for c in started if "training.isolation.forkserver" in c], started
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
