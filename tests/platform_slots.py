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


# Which test process runs what. xdist (``--dist worksteal``) first deals the collected tests out in
# order, a quarter of them to each process, and later moves tests from the end of a busy process's
# share to an idle one. Collected in file order, the run's longest files (make run's one-worker
# scenarios, 40 s each) fell at the end of a share, and three processes sat idle for 40 s. So the
# order is made here: the long files are dealt out first, each to the share with the least expected
# time so far (longest-first list scheduling: within a third of the best split), at the front of its
# share; the short tests fill the shares up in file order, and are the ones later moved. Tests that
# share a package-scoped fixture (the browser package's live platform) go as one: spread over four
# processes, each would start its own platform (58 more CPU-seconds when tried). How long a
# test takes: tests/durations.json, the wall seconds of each test of half a second or more in a
# measured run (``bench/suite_time.py --write-durations``); a test not there counts as a typical
# short one. Stale figures make the split worse, never a test wrong. Tests of a file keep their
# order; every xdist process sorts the same collection alike.
DURATIONS = Path(__file__).with_name("durations.json")
SHORT_TEST_SECONDS = 0.08  # the mean of the suite's tests under half a second, in the measured run
LONG_FILE_SECONDS = 10.0


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(session, config, items):
    processes = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if processes > 1 and items:
        items[:] = dealt_out(items, processes)


def dealt_out(items: list, processes: int) -> list:
    """``items`` in the order whose quarters (xdist's first shares) are balanced, long files first."""
    import json

    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    files: dict[str, list] = {}  # what goes to one process: a file, or a package whose fixture its tests share
    for item in items:
        files.setdefault(_unit(item), []).append(item)
    expected = {path: sum(known.get(item.nodeid, SHORT_TEST_SECONDS) for item in tests) for path, tests in files.items()}
    sizes, left = [], len(items)
    for share in range(processes):  # as xdist deals them: what is left, split among the processes left
        sizes.append(left // (processes - share))
        left -= sizes[-1]
    shares: list[list] = [[] for _ in sizes]
    load = [0.0] * processes
    for path in sorted(files, key=lambda path: -expected[path]):
        if expected[path] < LONG_FILE_SECONDS:
            break
        room = [share for share in range(processes) if len(shares[share]) + len(files[path]) <= sizes[share]]
        if not room:
            continue
        share = min(room, key=lambda share: load[share])
        shares[share] += files.pop(path)
        load[share] += expected[path]
    rest = [item for tests in files.values() for item in tests]
    for share, size in enumerate(sizes):
        taken = size - len(shares[share])
        shares[share] += rest[:taken]
        rest = rest[taken:]
    return [item for share in shares for item in share]


def _unit(item) -> str:
    """The package whose package-scoped fixture the test uses (set up once per process), else its file."""
    info = getattr(item, "_fixtureinfo", None)
    for definitions in (info.name2fixturedefs.values() if info else ()):
        for definition in definitions:
            if definition.scope == "package" and definition.baseid:
                return definition.baseid
    return item.nodeid.split("::")[0]


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
_test_processes_warm = None


def pytest_configure(config):
    global _warm
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import getpass
    import tempfile

    # A test process that trains in-process sets these (torch its compile cache's folder, the trl
    # backend TRL's warning switch), and the warm processes' imports read them: set for every process
    # of the session (to the values they would set) from the start, their children stay servable.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    _fork_the_test_processes(config)
    if os.environ.get("SUITE_WARM_PROCESS", "1") == "0":
        return
    from workers.processes import start_warm_process

    folder = tempfile.mkdtemp(prefix="suite-warm-")  # mode 0700; not a var folder, where a test's own may go
    _warm = start_warm_process(Path(folder) / "warm.sock")  # as a worker starts its own: the address into os.environ
    _warm.own_folder = folder  # removed with it
    from training.backends.swift import backend as swift

    if swift.DEFAULT_PYTHON.exists() and "not slow" not in (config.option.markexpr or ""):
        global _swift_warm
        _swift_warm = swift.start_warm_process(Path(folder) / "swift.sock")


# xdist's test processes, forked likewise from a warm process of their own (tests/suite_workers.py:
# collection imports torch, transformers, TRL and the clients once instead of once per test process).
# ``SUITE_WARM_WORKERS=0``: started plain, as xdist starts them.
WORKERS_WARM_WAIT_SECONDS = 120.0


def _fork_the_test_processes(config) -> None:
    global _test_processes_warm
    specs = getattr(config.option, "tx", None) or []
    if not specs or any(spec != "popen" for spec in specs) or os.environ.get("SUITE_WARM_WORKERS", "1") == "0":
        return
    import shlex
    import tempfile

    import suite_workers
    from training.isolation import forkserver

    folder = tempfile.mkdtemp(prefix="suite-workers-")  # mode 0700
    address = Path(folder) / "workers.sock"
    root = Path(__file__).resolve().parent.parent
    _test_processes_warm = forkserver.launch(sys.executable, address, ("suite_workers",), dict(os.environ), root,
                                             preload=suite_workers.PRELOAD, own_folder=folder)
    os.environ["SUITE_WORKERS_WARM_PROCESS"] = str(address)  # for the test of its walls (test_warm_process.py)
    deadline = time.monotonic() + WORKERS_WARM_WAIT_SECONDS
    while not address.exists() and _test_processes_warm.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # it listens once it has imported; a test process asked for before would start plain
    python = " ".join(shlex.quote(part) for part in (sys.executable, "-m", "suite_workers", str(address)))
    config.option.tx = [f"popen//python={python}"] * len(specs)


def pytest_unconfigure(config):
    global _warm, _swift_warm, _test_processes_warm
    from training.isolation import forkserver

    if _test_processes_warm is not None:
        os.environ.pop("SUITE_WORKERS_WARM_PROCESS", None)
        forkserver.stop(_test_processes_warm)  # reaped (its CPU and its children's count), its folder removed
        _test_processes_warm = None
    if _swift_warm is not None:
        from training.backends.swift import backend as swift

        os.environ.pop(swift.WARM_PROCESS_ADDRESS, None)
        forkserver.stop(_swift_warm)
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
