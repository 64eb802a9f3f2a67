"""The ``python`` tool of rLLM's tool agents runs code the policy wrote, which on the platform a
member can steer (their dataset's prompts, a model they trained). Each attack here is run in the
sandbox (training/isolation/sandbox.py, in the jail of training/isolation/jail.py) as the model would send it, and must
fail without touching the machine. The walls are the kernel's (a mount namespace, an unprivileged
uid, no network, a seccomp filter), so each attack is also tried below Python: raw system calls
through ctypes, paths relative to a directory file descriptor, /proc."""

from __future__ import annotations

import os
import site
import socket
import threading

import pytest

from training import PythonInterpreter
from training.isolation.sandbox import run_python

# _posixsubprocess.fork_exec's arguments on Python 3.11 (what subprocess.Popen passes), starting
# /bin/true: a fork from C, which only the kernel's filter can refuse.
RAW_FORK = """
import _posixsubprocess, os
r, w = os.pipe()
_posixsubprocess.fork_exec([b"/bin/true"], [b"/bin/true"], True, (w,), None, None, -1, -1, -1, -1, -1, -1,
                           r, w, False, False, -1, None, None, None, -1, None, True)
"""


@pytest.fixture
def settings_secret(settings):
    """A world-readable file in the platform's own folder (where its secret key lives): only the
    jail's mount namespace keeps it from the code, not file permissions."""
    path = settings.VAR_DIR / "secret-for-the-sandbox-test"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("do-not-leak")
    path.chmod(0o644)
    yield str(path)
    path.unlink()


def test_code_runs_and_answers_with_its_last_expression():
    run = run_python("x = 6\nprint('working')\nx * 7")
    assert (run.result, run.stdout, run.stderr, run.stopped) == ("42", "working\n", "", None)
    output = PythonInterpreter().forward(code="sum(range(10))")
    assert output.to_string() == "45"


def test_the_child_gets_no_secret_of_the_caller(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/prod")
    run = run_python("import os\nsorted(os.environ)")
    assert "DATABASE_URL" not in run.result and "secret" not in run.result


@pytest.mark.parametrize("code, refused", [
    ("import os\nos.fork()", "Operation not permitted"),
    ("import subprocess\nsubprocess.run(['id'])", "Operation not permitted"),
    ("import ctypes\nctypes.CDLL(None).fork()", None),  # libc's fork, below Python: -1, refused by the filter
    ("import socket\nsocket.socket().connect(('127.0.0.1', 5432))", "Operation not permitted"),
    ("open('/etc/shadow').read()", "No such file or directory"),
    ("open('/proc/1/environ', 'rb').read()", "Permission denied"),
    ("import ctypes\nctypes.CDLL(None).unshare(0x10000000)", None),  # a user namespace of its own: -1
    ("import threading\nthreading.Thread(target=print).start()", "can't start new thread"),
])
def test_what_the_code_may_not_do_is_refused(code, refused):
    run = run_python(code, timeout_s=10)
    if refused is None:
        assert run.result == "-1", run
    else:
        assert refused in run.stderr, run


def test_os_system_starts_no_program():
    run = run_python("import os\nos.system('id; touch /tmp/ran-by-the-model')", timeout_s=10)
    assert run.result != "0" and "uid=" not in run.stdout, run
    assert not os.path.exists("/tmp/ran-by-the-model")


def test_the_code_runs_as_an_unprivileged_user_without_capabilities():
    run = run_python("import os\nstatus = open('/proc/self/status').read()\n"
                     "(os.getuid(), os.getgid(), os.getgroups(), status.split('CapEff:')[1].split()[0])", timeout_s=10)
    uid, gid, groups, capabilities = eval(run.result)
    assert uid != 0 and gid != 0 and 0 not in groups and int(capabilities, 16) == 0, run


def test_paths_are_the_kernels_to_refuse_not_pythons(tmp_path, settings_secret):
    """The first sandbox judged ``open`` by a path resolved against the working folder; the kernel
    resolves it relative to ``dir_fd``, and ``/proc/self`` leads anywhere. Here the file is simply
    not in the jail's mount namespace, however it is named."""
    folder, name = os.path.split(settings_secret)
    attacks = [
        f"open({settings_secret!r}).read()",
        f"import os\nfd = os.open({folder!r}, os.O_RDONLY)\nos.read(os.open({name!r}, os.O_RDONLY, dir_fd=fd), 100)",
        f"import os\nfd = os.open('/', os.O_RDONLY)\nos.read(os.open({settings_secret.lstrip('/')!r}, os.O_RDONLY, dir_fd=fd), 100)",
        f"open('/proc/self/root' + {settings_secret!r}).read()",
    ]
    for code in attacks:
        run = run_python(code, timeout_s=10)
        assert "do-not-leak" not in (run.result or "") + run.stdout + run.stderr, (code, run)
        assert run.stderr and "Error" in run.stderr, (code, run)
    # Beside its own folder there is nothing: not the other runs' sandboxes, not the host's /tmp.
    run = run_python("import os\nfd = os.open('/proc/self/cwd/..', os.O_RDONLY)\nos.listdir(fd), os.path.basename(os.getcwd())")
    listed, own = eval(run.result)
    assert listed == [own], run


def test_nothing_outside_its_folder_can_be_written(tmp_path):
    """Not site-packages (code that every later training process would import), not /tmp of the host,
    not through a directory file descriptor either."""
    packages = site.getsitepackages()[0] if hasattr(site, "getsitepackages") else next(p for p in os.sys.path if "site-packages" in p)
    target = os.path.join(packages, "written_by_the_model.pth")
    attacks = [
        f"open({target!r}, 'w').write('import os')",
        f"import os\nfd = os.open({packages!r}, os.O_RDONLY)\nos.open('written_by_the_model.pth', os.O_WRONLY | os.O_CREAT, dir_fd=fd)",
        "open('/tmp/written-by-the-model', 'w').write('x')",
    ]
    for code in attacks:
        run_python(code, timeout_s=10)
    assert not os.path.exists(target)
    assert not os.path.exists("/tmp/written-by-the-model")


def test_the_kernel_refuses_a_fork_from_c():
    run = run_python(RAW_FORK, timeout_s=10)
    assert run.syscalls_filtered, run
    assert "PermissionError" in run.stderr and "Operation not permitted" in run.stderr, run


def test_no_network_even_to_this_machine():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
    thread.start()
    run = run_python(f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))", timeout_s=10)
    listener.close()
    assert run.stderr and not accepted, run


def test_a_loop_is_stopped_at_the_timeout():
    run = run_python("while True:\n    pass", timeout_s=2)
    assert run.stopped is not None and ("timed out" in run.stopped or "CPU" in run.stopped), run
    assert "the code was stopped" in PythonInterpreter().forward(code="while True: pass", timeout=1).to_string()


def test_memory_and_output_are_bounded():
    run = run_python("b = bytearray(8 * 1024 ** 3)", memory_mb=256)
    assert "MemoryError" in run.stderr or run.stopped, run
    flood = run_python("while True:\n    print('x' * 1000)", timeout_s=10)
    assert len(flood.stdout) <= 16_100 and flood.stdout.endswith("...(cut)"), len(flood.stdout)


def test_files_are_written_only_in_a_fresh_folder_of_its_own():
    first = run_python("import os\nopen('notes.txt', 'w').write('kept?')\nos.getcwd()")
    second = run_python("import os\nos.path.exists('notes.txt'), os.getcwd()")
    first_folder = eval(first.result)
    exists, second_folder = eval(second.result)
    assert not exists and first_folder != second_folder
    assert not os.path.exists(first_folder)  # removed after the run
