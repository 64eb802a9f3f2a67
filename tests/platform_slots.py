"""A pytest plugin: under ``pytest -n N`` each process is a platform of its own.

pytest-django gives each xdist process its own database (``test_<name>_gw1``). This gives it its own
Redis database (Celery's queues, the Channels groups and the series cache: the run ids of two test
databases collide) and its own var folder (run folders, the embedded broker, the run checker's
inbox). It must run before pytest-django reads the settings, which a conftest is too late for:
``make test`` loads it with ``-p platform_slots`` (tests/ on PYTHONPATH).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import pytest

# Bytecode caches are written even where PYTHONDONTWRITEBYTECODE is set: without them every process
# of a run (this one, each xdist process, and every server, worker and command a test starts) compiles
# each module it imports from source, and pytest rewrites the assertions of its plugins' modules
# (hypothesis, schemathesis: some 400) anew, seconds of CPU per process. Set here, where pytest
# imports this plugin before the plugins it finds by entry point, and inherited by the children.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    index = int(worker.removeprefix("gw"))
    redis_url = os.environ.get("REDIS_URL", "").rstrip("/")
    if redis_url:
        server, _, db = redis_url.rpartition("/")
        if not db.isdigit():  # no database named: the server's first
            server, db = redis_url, "0"
        os.environ["REDIS_URL"] = f"{server}/{int(db) + index}"
    os.environ["PLATFORM_VAR_DIR"] = str(Path(__file__).resolve().parent.parent / "var" / f"test-{worker}")


# Tests that spend most of their time waiting (an outage held for seconds, a frozen machine, a
# takeover after a stale window, verl's transfer queue) go first: their waits then overlap the
# CPU-bound tests instead of running alone at the end. Whole files keep their order; the sort is
# stable, so every xdist process collects the same list. In the last run before this (cpu_b in
# bench/results/suite_time.json) the fault tests ran last, one process alone for 70 s.
WAIT_MOSTLY = ("tests/reliability/", "tests/artifacts/test_fleet_runs.py", "tests/training/test_verl_dumps.py")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: not item.nodeid.startswith(WAIT_MOSTLY))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Everything collection imported (Django, torch, transformers, the test modules: about half a
    million objects) lives until the process ends, yet each full garbage collection walked all of it
    again: a third of a platform test process's CPU. Collected once and frozen here, later
    collections walk only what the tests themselves allocate (``gc.freeze``; objects still die by
    reference count as before). Measured in bench/results/suite_time.json."""
    gc.collect()
    gc.freeze()


# -- one warm process for the session's children ------------------------------------------------
# A worker's children (training, playground and evaluation processes) are forked from a warm process
# that imported torch, transformers and TRL once (``workers.processes.start_child``): in production
# each worker starts its own (``RUN_WARM_PROCESS``). Most workers a test starts run one child or none,
# where a warm process of their own would cost as much as it saves (tests/conftest.py turns it off);
# instead the session's first process starts one (``SUITE_WARM_PROCESS=0``: none) and every test
# process, worker and command started after inherits its address (``WORKER_WARM_PROCESS``), as a
# worker's pool processes inherit their worker's. The warm process forks a child only where the
# child's environment matches it in every variable its libraries read when imported (each xdist
# process's own database, Redis database and var folder are not among them); otherwise, and before
# it listens, a child starts plain and its run's log says why. Stopped (and reaped: its CPU and its
# children's count in the session's) when the session ends.
# The swift backend's training processes (its own interpreter, .venv-swift) fork likewise from a warm
# process of that interpreter (``SWIFT_WARM_PROCESS``; training/backends/swift/backend.py), started
# where that environment is built and the session runs the slow tests (where those trainings are).
_warm = None
_swift_warm = None


def pytest_configure(config):
    global _warm
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("SUITE_WARM_PROCESS", "1") == "0":
        return
    import getpass
    import tempfile

    from workers.processes import start_warm_process

    # A test process that trains in-process sets these (torch its compile cache's folder, the trl
    # backend TRL's warning switch), and the warm process's imports read them: set for every process
    # of the session (to the values they would set) from the start, their children stay servable.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    folder = tempfile.mkdtemp(prefix="suite-warm-")  # mode 0700; not a var folder, where a test's own may go
    _warm = start_warm_process(Path(folder) / "warm.sock")  # as a worker starts its own: the address into os.environ
    _warm.own_folder = folder  # removed with it
    from training.backends.swift import backend as swift

    if swift.DEFAULT_PYTHON.exists() and "not slow" not in (config.option.markexpr or ""):
        global _swift_warm
        _swift_warm = swift.start_warm_process(Path(folder) / "swift.sock")


def pytest_unconfigure(config):
    global _warm, _swift_warm
    if _swift_warm is not None:
        from training.backends.swift import backend as swift

        os.environ.pop(swift.WARM_PROCESS_ADDRESS, None)
        _swift_warm.terminate()
        _swift_warm.wait()
        _swift_warm = None
    if _warm is not None:
        from workers.processes import stop_warm_process

        stop_warm_process(_warm)  # the address out of the environment, the process reaped, its folder removed
        _warm = None


# -- where the CPU goes: ``SUITE_CPU_REPORT=<folder>`` ---------------------------------------------
# Each test process writes ``<folder>/<worker>.json``: per test, the CPU seconds (user + sys) of the
# process and of the children it waited for during the test (its servers, workers and training
# processes, once reaped); and ``<worker>.wall.json``: when each test began and ended (Unix seconds),
# which shows where the run's wall clock went (a process idle at the end, tests that wait).
# ``python bench/suite_time.py --cpu-report <folder>`` sums them per file.
_cpu: dict[str, float] = {}
_wall: dict[str, tuple[float, float]] = {}


def _cpu_now() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not os.environ.get("SUITE_CPU_REPORT"):
        yield
        return
    began, started = _cpu_now(), time.time()
    yield
    _cpu[item.nodeid] = round(_cpu_now() - began, 3)
    _wall[item.nodeid] = (round(started, 2), round(time.time(), 2))


def pytest_sessionfinish(session):
    folder = os.environ.get("SUITE_CPU_REPORT")
    if folder and _cpu:
        import json

        Path(folder).mkdir(parents=True, exist_ok=True)
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (Path(folder) / f"{name}.json").write_text(json.dumps(_cpu, indent=0))
        (Path(folder) / f"{name}.wall.json").write_text(json.dumps(_wall, indent=0))
