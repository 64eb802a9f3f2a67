"""A stop reaches every process a child started, a local Ray cluster's workers included: they
each have a process group of their own (a kill of the child's group misses them, and they write
on for seconds after their raylet is gone), but they stay in the child's session."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_execute import _alive  # the one reading of a process's state from /proc

from workers.processes import child_env, kill_session

WRITER = Path(__file__).with_name("session_writer.py")
ROOT = Path(__file__).resolve().parents[2]


def _start(how: str, lines: Path) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen([sys.executable, str(WRITER), how, str(lines)], env=child_env(needs_gpu=False),
                               stdout=subprocess.PIPE, start_new_session=True, cwd=ROOT)
    writer = int(process.stdout.readline())
    return process, writer


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 10  # killed: gone as soon as the kernel has torn it down
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not _alive(pid)


def _still_writing(lines: Path) -> bool:
    before = lines.read_text().count("\n")
    time.sleep(0.5)  # ten of its writes
    return lines.read_text().count("\n") > before


@pytest.mark.django_db
def test_killing_a_childs_session_stops_a_writer_in_a_group_of_its_own(tmp_path):
    lines = tmp_path / "lines"
    process, writer = _start("wait", lines)
    assert os.getpgid(writer) != os.getpgid(process.pid) and os.getsid(writer) == process.pid
    kill_session(process)
    assert process.poll() is not None and _gone(writer)
    assert not _still_writing(lines)


@pytest.mark.django_db
def test_a_superseded_attempt_kills_its_own_session(tmp_path):
    lines = tmp_path / "lines"
    process, writer = _start("suicide", lines)
    assert process.wait(timeout=30) == -9
    assert _gone(writer) and not _still_writing(lines)


@pytest.mark.slow
@pytest.mark.django_db
def test_a_local_ray_clusters_actor_is_stopped_with_its_training_process(tmp_path):
    """The worker processes of verl's Ray job (its trainer, which writes verl's checkpoints) are
    killed with the attempt's training process. Ray runs here on CPU; verl itself needs a GPU."""
    pytest.importorskip("ray")
    lines = tmp_path / "lines"
    process, actor = _start("ray", lines)
    assert os.getpgid(actor) != os.getpgid(process.pid) and os.getsid(actor) == process.pid
    kill_session(process)
    assert _gone(actor)
    assert not _still_writing(lines)


def test_a_training_process_does_not_import_mlflow_for_transformers():
    """Our trainers log to MLflow through our own trackers (transformers gets report_to="none"); TRL's
    import would otherwise import mlflow for transformers' integration, 0.6 s of each process's start."""
    code = "from transformers.integrations import is_mlflow_available; import sys; print(is_mlflow_available(), 'mlflow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], env=child_env(needs_gpu=False), capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.split() == ["False", "False"], done.stderr[-2000:]
