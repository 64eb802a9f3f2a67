"""The warm process (training/isolation/forkserver.py) against real processes: a forked child behaves
as ``python -m`` does (arguments, environment, folder, streams, session, exit code, traceback, fresh
random states); what the server cannot start the same way it refuses, saying why; it ends with the
process that started it. Its preload here is small modules written by the test (the platform's,
torch and TRL, is exercised by tests/reliability/test_warm_process.py)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from training.isolation import forkserver

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, os, random, sys
import numpy
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "leader": os.getsid(0) == os.getpid(),
                  "x": os.environ.get("X"), "random": random.random(), "numpy": float(numpy.random.rand()),
                  "name": open("/proc/self/cmdline", "rb").read().split(b"\\0")[0].decode()}))
sys.stdout.flush()
if sys.argv[1:] == ["raise"]:
    raise RuntimeError("the probe failed on purpose")
if sys.argv[1:] == ["sleep"]:
    import time
    time.sleep(60)
sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
"""


def write_modules(folder: Path, **modules: str) -> None:
    for name, source in modules.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))


class Server:
    def __init__(self, tmp_path: Path, preload: list[str], allow: list[str], env: dict[str, str] | None = None):
        self.folder = tmp_path
        self.env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}", **(env or {})}
        self.address = tmp_path / "warm" / "server.sock"
        self.process = subprocess.Popen([sys.executable, "-m", "training.isolation.forkserver", str(self.address),
                                         "--allow", *allow, "--preload", *preload], env=self.env, cwd=tmp_path)
        deadline = time.monotonic() + 30
        while not self.address.exists():
            assert self.process.poll() is None and time.monotonic() < deadline, "the server did not listen"
            time.sleep(0.02)

    def start(self, module: str, *args: str, env: dict[str, str] | None = None, output: Path | None = None):
        with open(output or self.folder / "out.log", "wb") as out:
            return forkserver.start(self.address, module, list(args), env or self.env, self.folder, stdout=out, stderr=out)

    def stop(self):
        self.process.kill()
        self.process.wait()


@pytest.fixture
def server(tmp_path):
    started = []

    def start(preload=("numpy",), allow=("probe",), env=None, **modules):
        write_modules(tmp_path, probe=PROBE, **modules)
        started.append(Server(tmp_path, list(preload), list(allow), env))
        return started[-1]

    yield start
    for one in started:
        one.stop()


def outputs(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def test_a_forked_child_runs_its_module_as_python_m_would(server, tmp_path):
    warm = server()
    first = warm.start("probe", "3", env={**warm.env, "X": "first"}, output=tmp_path / "1.log")
    second = warm.start("probe", "0", env={**warm.env, "X": "second"}, output=tmp_path / "2.log")
    assert (first.wait(timeout=30), second.wait(timeout=30)) == (3, 0)
    [one], [two] = outputs(tmp_path / "1.log"), outputs(tmp_path / "2.log")
    assert one["argv"] == ["3"] and one["cwd"] == str(tmp_path) and one["leader"] and one["x"] == "first"
    assert two["x"] == "second" and one["name"].split() == [sys.executable, "-m", "probe", "3"]
    assert one["random"] != two["random"], "Python's random state is the server's"
    assert one["numpy"] != two["numpy"], "numpy's random state is the server's"
    assert first.cpu_seconds is not None and first.cpu_seconds >= 0


def test_an_uncaught_exception_prints_its_traceback_and_exits_1(server, tmp_path):
    warm = server()
    child = warm.start("probe", "raise", output=tmp_path / "out.log")
    assert child.wait(timeout=30) == 1
    assert "RuntimeError: the probe failed on purpose" in (tmp_path / "out.log").read_text()


def test_a_killed_child_reads_as_killed_and_wait_can_time_out(server):
    warm = server()
    child = warm.start("probe", "sleep")
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    assert child.poll() is None
    os.killpg(child.pid, signal.SIGKILL)  # its own session: a caller may signal it as soon as it has the pid
    assert child.wait(timeout=30) == -signal.SIGKILL


def test_what_the_server_may_not_run_is_refused(server):
    warm = server()
    with pytest.raises(forkserver.NotServed, match="does not run os"):
        warm.start("os")


def test_an_environment_that_differs_where_a_preloaded_module_read_it_is_refused(server, tmp_path):
    warm = server(preload=["numpy", "reads"], reads="import os\nMODE = os.environ.get('READS_MODE', 'plain')\n")
    with pytest.raises(forkserver.NotServed, match="READS_MODE"):
        warm.start("probe", env={**warm.env, "READS_MODE": "other"})
    with pytest.raises(forkserver.NotServed, match="PYTHONHASHSEED"):  # the interpreter's own, read before any module
        warm.start("probe", env={**warm.env, "PYTHONHASHSEED": "7"})
    child = warm.start("probe", env={**warm.env, "X": "read by nobody at import"}, output=tmp_path / "x.log")
    assert child.wait(timeout=30) == 0 and outputs(tmp_path / "x.log")[0]["x"] == "read by nobody at import"


def test_the_terminals_size_read_at_import_does_not_refuse_a_child(server, tmp_path):
    """accelerate reads it at import for its menus' width; readline puts it in a caller's environment."""
    warm = server(preload=["numpy", "width"], width="import shutil\nWIDTH = shutil.get_terminal_size()\n")
    env = {**warm.env, "COLUMNS": "123", "LINES": "45", "X": "sized"}
    assert warm.start("probe", env=env, output=tmp_path / "x.log").wait(timeout=30) == 0
    assert outputs(tmp_path / "x.log")[0]["x"] == "sized"


def test_a_preload_that_reads_the_whole_environment_serves_only_the_same_one(server, tmp_path):
    warm = server(preload=["numpy", "scans"], scans="import os\nSEEN = dict(os.environ)\n")
    with pytest.raises(forkserver.NotServed, match="X"):
        warm.start("probe", env={**warm.env, "X": "new"})
    assert warm.start("probe").wait(timeout=30) == 0


def test_a_server_holding_a_second_thread_forks_nothing(server):
    warm = server(preload=["numpy", "threads"], threads="import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    with pytest.raises(forkserver.NotServed, match="second thread"):
        warm.start("probe")


def test_its_socket_folder_is_private(server):
    warm = server()
    assert stat.S_IMODE(warm.address.parent.stat().st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="becoming another user needs root")
def test_another_user_who_reaches_the_socket_is_refused(server, tmp_path):
    """Past the private folder (opened up here, as a mistaken chmod would), the socket still serves
    only its own user: the credentials the kernel gives with the connection, not anything sent."""
    import json
    import pwd

    warm = server()
    os.chmod(warm.address.parent, 0o711)
    os.chmod(warm.address, 0o777)
    nobody = pwd.getpwnam("nobody")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user: in the folder, then no longer root
        try:
            os.chdir(warm.address.parent)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            try:
                forkserver.start(warm.address.name, "probe", ["7"], dict(warm.env), "/", stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
                answer = "forked"
            except forkserver.NotServed as exc:
                answer = str(exc)
            os.write(write, json.dumps(answer).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert json.loads(os.read(read, 65536)) == "the warm process serves only its own user"
    assert warm.start("probe", "0").wait(timeout=30) == 0  # its own user still is


def test_a_child_whose_server_went_away_is_waited_for_by_its_pid(server):
    warm = server()
    child = warm.start("probe", "sleep")
    warm.process.kill()
    warm.process.wait()
    assert child.poll() is None, "the child went with its server"
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL  # no exit status reaches us then: it reads as killed


def test_the_server_ends_with_the_process_that_started_it(tmp_path):
    """No warm process outlives its worker: it notices its parent has gone within a second or two."""
    address = tmp_path / "warm" / "server.sock"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.run(
        [sys.executable, "-c", "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-m', "
         f"'training.isolation.forkserver', {str(address)!r}, '--allow', 'probe', '--preload', '--owner', str(__import__('os').getpid())]); print(p.pid)"],
        env=env, capture_output=True, text=True, check=True)
    pid = int(parent.stdout)
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the warm process outlived the process that started it"
        time.sleep(0.1)


def test_a_child_ends_as_python_ends_threads_joined_exit_functions_run_files_flushed(server, tmp_path):
    """It skips the teardown of every module (the warm process's pages it would copy), nothing else."""
    warm = server(ending="""
        import atexit, sys, threading, time
        out = open(sys.argv[1], "w")  # never closed: a plain exit flushes it
        out.write("written, never flushed by the program")
        atexit.register(lambda: open(sys.argv[1] + ".atexit", "w").write("ran"))
        def late():
            time.sleep(0.5)
            open(sys.argv[1] + ".thread", "w").write("joined")
        threading.Thread(target=late).start()
        raise SystemExit(7)
        """, allow=["ending"])
    target = tmp_path / "kept.txt"
    assert warm.start("ending", str(target)).wait(timeout=30) == 7
    assert target.read_text() == "written, never flushed by the program"
    assert (tmp_path / "kept.txt.atexit").read_text() == "ran"
    assert (tmp_path / "kept.txt.thread").read_text() == "joined"


def test_the_flush_at_exit_looks_at_no_object_that_would_answer_with_code(server, tmp_path):
    """Found when pytest's own test processes were forked: the exit's search for files to flush asked
    each object for its class (isinstance), and a dead ``weakref.proxy`` raised ReferenceError, a lazy
    object (Django's ``SimpleLazyObject``) ran its code and raised (a traceback, the exit code lost)."""
    warm = server(proxies="""
        import sys, weakref
        class Thing:
            pass
        class Lazy:
            @property
            def __class__(self):
                raise RuntimeError("evaluated at exit")
        thing = Thing()
        sys.kept = [weakref.proxy(thing), Lazy()]  # outlive the module; the proxy its object
        del thing
        out = open(sys.argv[1], "w")
        out.write("flushed after the dead proxy")
        """, allow=["proxies"])
    target = tmp_path / "kept.txt"
    assert warm.start("proxies", str(target), output=tmp_path / "out.log").wait(timeout=30) == 0
    assert target.read_text() == "flushed after the dead proxy"
    assert "Traceback" not in (tmp_path / "out.log").read_text()


def test_a_caller_holding_more_than_1024_descriptors_waits_for_its_child(server):
    """Found when the suite ran in six processes: one that held more than 1024 descriptors could not
    poll its forked child (``select.select`` refuses a descriptor numbered 1024 or more)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip(f"this process may open only {hard} files")
    warm = server()
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    held = []
    try:
        while not held or held[-1] < 1024:
            held.append(os.open(os.devnull, os.O_RDONLY))
        child = warm.start("probe", "3")  # its connection's descriptor is numbered above 1024
        assert child.poll() is None or child.returncode == 3
        assert child.wait(timeout=30) == 3
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_sys_exit_with_a_message_prints_it_and_exits_1(server, tmp_path):
    warm = server(message="raise SystemExit('no data file')\n", allow=["message"])
    assert warm.start("message", output=tmp_path / "out.log").wait(timeout=30) == 1
    assert (tmp_path / "out.log").read_text().strip() == "no data file"


def test_a_caller_that_gave_up_waiting_gets_no_child_once_the_server_answers(server, tmp_path):
    """A warm process that does not answer within ``REPLY_SECONDS`` (frozen here): the caller starts
    its child plain, and the server, answering later, must not start a second one."""
    warm = server()
    os.kill(warm.process.pid, signal.SIGSTOP)
    try:
        with pytest.raises(forkserver.NotServed, match="timed out"):
            warm.start("probe", "given-up", output=tmp_path / "given-up.log")
    finally:
        os.kill(warm.process.pid, signal.SIGCONT)
    assert warm.start("probe", output=tmp_path / "later.log").wait(timeout=30) == 0  # answering again
    assert outputs(tmp_path / "later.log") and not (tmp_path / "given-up.log").read_text(), "the abandoned child ran"


def test_before_it_has_imported_there_is_nothing_to_wait_for(tmp_path):
    """It listens only once it has imported: a caller meanwhile finds no socket and starts plain at once."""
    write_modules(tmp_path, probe=PROBE, slow="import time\ntime.sleep(60)\n")
    address = tmp_path / "warm" / "server.sock"
    process = subprocess.Popen([sys.executable, "-m", "training.isolation.forkserver", str(address), "--allow", "probe",
                                "--preload", "slow"], env={**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"}, cwd=tmp_path)
    try:
        time.sleep(1)
        started = time.monotonic()
        with pytest.raises(forkserver.NotServed, match="no warm process"):
            forkserver.start(address, "probe", [], dict(os.environ), tmp_path)
        assert time.monotonic() - started < 1
    finally:
        process.kill()
        process.wait()
