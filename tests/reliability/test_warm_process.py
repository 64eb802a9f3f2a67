"""A worker's warm process (torch, transformers and TRL imported once) forks its children: a claimed
run is trained by a process it forked, named as a plain ``python -m workers.child`` is; a child
whose environment differs in a variable those libraries read when imported starts plain, and the
run's log says why; a GPU run starts plain."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from webapp.runs.models import Run, RunLog
from workers import execute, processes

pytestmark = pytest.mark.django_db(transaction=True)  # the training process reads the committed rows


@pytest.fixture
def forked(warm_process, monkeypatch):
    """Every child the worker starts here, as (module, how it started, pid, its parent's pid)."""
    started = []
    start_child = processes.start_child

    def recording(module, *args, **kwargs):
        child = start_child(module, *args, **kwargs)
        started.append((module, child.started, child.pid, psutil.Process(child.pid).ppid()))
        return child

    monkeypatch.setattr(execute, "start_child", recording)
    return started


def claimed_line(run: Run) -> str:
    return RunLog.objects.filter(run=run, message__startswith="Claimed by").get().message


def test_a_claimed_run_is_trained_by_a_process_the_warm_process_forked(make_run, warm_process, forked, settings, tmp_path):
    settings.RUNS_DIR = tmp_path
    run = make_run()
    assert execute.execute_run(run.pk, "warm-worker") == Run.Status.SUCCEEDED
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED and run.steps == 2, f"{run.error}\n{run.traceback}"
    assert "its training process forked from the worker's warm process" in claimed_line(run)
    [(module, how, pid, parent)] = forked
    assert module == "workers.child" and parent == warm_process.pid, "the run was not trained by a forked process"
    assert "training on backend trl" in (run.folder() / "process.log").read_text()
    assert warm_process.poll() is None, "the warm process ended with its child"


def test_a_child_that_runs_now_is_named_as_a_plain_one(warm_process, tmp_path):
    """The housekeeping's graceful stop and the operators' ``ps`` find a training process by its command line."""
    with open(tmp_path / "out.log", "wb") as output:
        child = processes.start_child("workers.evaluation_child", "--help", output=output)
    try:
        assert child.started == "forked from the worker's warm process"
        assert " ".join(psutil.Process(child.pid).cmdline()).split() == [os.sys.executable, "-m", "workers.evaluation_child", "--help"]
        assert os.getsid(child.pid) == child.pid, "the child does not lead a session of its own"
        assert "workers.child" not in " ".join(psutil.Process(warm_process.pid).cmdline()), \
            "the warm process reads as a training process"
    finally:
        child.wait(timeout=60)


def test_a_child_whose_environment_differs_where_the_libraries_read_it_starts_plain(make_run, forked, settings, tmp_path, monkeypatch):
    settings.RUNS_DIR = tmp_path
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if os.environ.get("HF_HUB_OFFLINE") != "1" else "0")
    run = make_run()
    assert execute.execute_run(run.pk, "warm-worker") == Run.Status.SUCCEEDED
    line = claimed_line(run)
    assert "started without the warm process" in line and "HF_HUB_OFFLINE" in line, line
    [(_, _, pid, parent)] = forked
    assert parent == os.getpid(), "a plain child is this worker's own"


def test_a_gpu_child_starts_plain(warm_process, tmp_path):
    with open(tmp_path / "out.log", "wb") as output:
        child = processes.start_child("workers.evaluation_child", "--help", output=output, uses_gpu=True)
    assert child.started == "started without the warm process (the child uses a GPU)"
    assert psutil.Process(child.pid).ppid() == os.getpid()
    child.wait(timeout=60)


def test_a_var_folder_too_deep_for_a_socket_gets_a_private_folder_of_its_own(settings, tmp_path):
    settings.VAR_DIR = tmp_path / ("deep" * 30)
    address, own_folder = processes.warm_process_address()
    try:
        assert len(os.fsencode(address)) <= processes.UNIX_SOCKET_PATH_BYTES
        assert own_folder is not None and str(address).startswith(own_folder)
        assert os.stat(own_folder).st_mode & 0o777 == 0o700
    finally:
        os.rmdir(own_folder)
    settings.VAR_DIR = tmp_path
    assert processes.warm_process_address() == (tmp_path / "warm" / f"{os.getpid()}.sock", None)


def assert_private_and_listening(address: str, timeout_s: float = 180) -> None:
    """A session's warm process: its folder is this user's alone, and it listens (once it has imported)."""
    folder = os.stat(os.path.dirname(address))
    assert (folder.st_mode & 0o777, folder.st_uid) == (0o700, os.getuid())
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(address):
        assert time.monotonic() < deadline, f"the warm process at {address} never listened"
        time.sleep(0.2)


def test_the_sessions_warm_process_is_private_and_runs_only_the_workers_modules():
    """The test session's own (tests/platform_slots.py), which every process of the session may ask:
    its folder is this user's alone, and a request naming other code is refused."""
    from training.isolation import forkserver

    address = os.environ.get(processes.WARM_PROCESS_ADDRESS)
    if not address or os.environ.get("SUITE_WARM_PROCESS") == "0":
        pytest.skip("this session has no warm process (SUITE_WARM_PROCESS=0, or pytest without -p platform_slots)")
    assert_private_and_listening(address)
    with pytest.raises(forkserver.NotServed, match="does not run os"):
        forkserver.start(address, "os", [], dict(os.environ), "/")


def test_the_test_processes_are_forked_from_a_private_warm_process_that_runs_nothing_else():
    """xdist's test processes of this session (tests/suite_workers.py): this one was forked from the
    warm process, whose folder is this user's alone and which forks nothing but a test process (its
    socket serves only its own user: tests/training/test_forkserver.py)."""
    from training.isolation import forkserver

    address = os.environ.get("SUITE_WORKERS_WARM_PROCESS")
    if not address or not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("this session's test processes are plain (no xdist, SUITE_WARM_WORKERS=0, or no -p platform_slots)")
    assert_private_and_listening(address)
    parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()  # its title: python -m ...forkserver ADDRESS
    assert b"training.isolation.forkserver" in parent and address.encode() in parent
    for module in ("os", "workers.child", "training.platform.probe"):
        with pytest.raises(forkserver.NotServed, match=f"does not run {module}"):
            forkserver.start(address, module, [], dict(os.environ), "/")


def test_the_sessions_swift_warm_process_is_private_and_runs_only_the_swift_training_process():
    """The session's warm process of the swift backend's interpreter (tests/platform_slots.py; the
    swift backend's ``start_warm_process``): its folder is this user's alone, and it forks nothing
    but ``training.backends.swift.child``."""
    from training.backends.swift import backend as swift
    from training.isolation import forkserver

    address = os.environ.get(swift.WARM_PROCESS_ADDRESS)
    if not address:
        pytest.skip("this session has no swift warm process (no .venv-swift, slow tests left out, or SUITE_WARM_PROCESS=0)")
    assert_private_and_listening(address)
    for module in ("os", "training.platform.probe", "workers.child"):
        with pytest.raises(forkserver.NotServed, match=f"does not run {module}"):
            forkserver.start(address, module, [], dict(os.environ), "/")
