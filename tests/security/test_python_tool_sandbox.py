"""The ``python`` tool of rLLM's tool agents runs code the policy wrote, which on the platform a
member can steer (their dataset's prompts, a model they trained). Each attack here is run in the
sandbox (training/sandbox.py) as the model would send it, and must fail without touching the machine."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from training import PythonInterpreter
from training.sandbox import run_python

# _posixsubprocess.fork_exec's arguments on Python 3.11 (what subprocess.Popen passes), starting
# /bin/true: a fork that raises no audit event, so only the kernel's filter can refuse it.
RAW_FORK = """
import _posixsubprocess, os
r, w = os.pipe()
_posixsubprocess.fork_exec([b"/bin/true"], [b"/bin/true"], True, (w,), None, None, -1, -1, -1, -1, -1, -1,
                           r, w, False, False, -1, None, None, None, -1, None, True)
"""


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
    ("import os\nos.fork()", "os.fork"),
    ("import subprocess\nsubprocess.run(['id'])", "subprocess.Popen"),
    ("import os\nos.system('id')", "os.system"),
    ("import ctypes\nctypes.CDLL(None)", "ctypes.dlopen"),
    ("import socket\nsocket.socket().connect(('127.0.0.1', 5432))", "socket."),
    ("open('/tmp/written-by-the-model', 'w').write('x')", "opening '/tmp/written-by-the-model' for writing"),
    ("open('/etc/shadow').read()", "opening '/etc/shadow'"),
    ("open('/proc/1/environ', 'rb').read()", "opening '/proc/1/environ'"),
    ("import os\nos.listdir('/root')", "os.listdir"),
    ("import threading\nthreading.Thread(target=print).start()", "can't start new thread"),
])
def test_what_the_code_may_not_do_is_refused(code, refused):
    run = run_python(code, timeout_s=10)
    assert refused in run.stderr, run
    assert not os.path.exists("/tmp/written-by-the-model")


def test_the_kernel_refuses_a_fork_that_bypasses_the_audit_hook():
    run = run_python(RAW_FORK, timeout_s=10)
    if not run.syscalls_filtered:
        pytest.skip("this kernel gave the child no seccomp filter")
    assert "PermissionError" in run.stderr and "Operation not permitted" in run.stderr, run


def test_no_network_even_to_this_machine():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
    thread.start()
    # The socket module's audit events are refused first; _socket's own constructor is the kernel's to refuse.
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
