"""Running model-written Python in a child process that cannot harm the machine it runs on.

A tool agent's ``python`` tool executes whatever the policy wrote, and the ``code`` reward runs the
programs it wrote against their tests. The code runs in the platform's one jail
(``training.isolation.jail``: a bubblewrap mount namespace as an unprivileged user, no network, an empty
environment), where the kernel, not Python, decides what exists: the interpreter and its libraries
read-only, and a fresh working folder of its own, nothing else. Inside, a fresh interpreter
(``python -I``), before the code's first line:

- installs a seccomp filter (on x86-64 and arm64) that answers EPERM to ``clone``, ``fork``,
  ``vfork``, ``clone3``, ``execve``, ``execveat``, ``socket``, ``unshare`` and ``setns``: no new
  process, thread, program, socket or namespace, so a fork bomb fails at its first fork;
- sets resource limits: CPU seconds, address space, file size, open files, no core files, and
  ``RLIMIT_NPROC`` 0.

The parent gives it a wall-clock timeout and kills the jail then (its pid namespace ends with
it). Its environment holds only ``PATH``, ``HOME``/``TMPDIR`` (the working folder) and
thread-count variables. Output is read from files in the working folder, cut to
``MAX_OUTPUT_CHARS`` (or the caller's ``max_output_chars``); the file-size limit keeps a printing
loop from filling the disk.

The same sandbox serves the ``python`` tool of tool agents (code in, last expression's value out)
and the ``code`` reward (``training.rewards.code_reward_fn``), which also gives a program its
standard input, places files beside it in its folder (a solution, a harness, a test file) and reads
its exit status (``SystemExit`` ends the code with its status, as in a plain interpreter). Where
the machine cannot make the jail, ``run_python`` raises ``training.isolation.jail.JailUnavailable``: the
code does not run at all.

This is a sandbox on a shared kernel, not a virtual machine: a kernel exploit is out of its reach.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass

from training.isolation.jail import Jail, filter_program, install_filter, interpreter

DEFAULT_TIMEOUT_S = 12
MAX_TIMEOUT_S = 60
DEFAULT_MEMORY_MB = 1024
MAX_OUTPUT_CHARS = 16_000
MAX_FILE_BYTES = 8 * 1024 * 1024
# The runner's own files in the working directory: the caller's files may not take these names.
_RUNNER_FILES = ("code.py", "stdout", "stderr", "result.json")

# Runs in the child before the model's code. Reads its settings from argv[1] (JSON); the code is in
# code.py in the working directory. Writes the last expression's repr to result.json.
_RUNNER = r"""
import ast, json, os, resource, sys
settings = json.loads(sys.argv[1])

%s
filtered = install_filter(settings["filter"])
cpu = settings["cpu_s"]
for limit, value in (
    (resource.RLIMIT_CPU, (cpu, cpu + 1)),
    (resource.RLIMIT_AS, (settings["memory_bytes"],) * 2),
    (resource.RLIMIT_FSIZE, (settings["file_bytes"],) * 2),
    (resource.RLIMIT_NOFILE, (64, 64)),
    (resource.RLIMIT_CORE, (0, 0)),
    (resource.RLIMIT_NPROC, (0, 0)),
):
    resource.setrlimit(limit, value)

with open("code.py") as handle:
    source = handle.read()
result, status = None, 0
scope = {"__name__": "__main__"}
try:
    tree = ast.parse(source, "<code>")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<code>", "exec"), scope)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<code>", "eval"), scope)
        result = None if value is None else repr(value)
except SystemExit as stop:  # exit() / sys.exit(): its status, as a plain interpreter would give
    if stop.code is None or isinstance(stop.code, int):
        status = stop.code or 0
    else:
        print(stop.code, file=sys.stderr)
        status = 1
except BaseException:
    import traceback  # only on an error: each import costs every test case of a code reward
    error = sys.exc_info()
    traceback.print_exception(error[0], error[1], error[2].tb_next)  # from the code's own frame on
    status = 1
sys.stdout.flush()
with open("result.json", "w") as handle:
    json.dump({"result": result, "filtered": filtered}, handle)
sys.exit(status)
""".replace("%s", inspect.getsource(install_filter))


@dataclass(frozen=True)
class Limits:
    """Per program run, for callers that run many (the ``code`` reward, one run per test case):
    ``timeout_s`` wall clock (the CPU limit is the same, rounded up; at most ``MAX_TIMEOUT_S``),
    ``memory_mb`` of address space, ``file_mb`` per file written (its output included)."""

    timeout_s: float = 6.0
    memory_mb: int = DEFAULT_MEMORY_MB
    file_mb: float = 16

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "file_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}.")
        if self.timeout_s > MAX_TIMEOUT_S:
            raise ValueError(f"Limits.timeout_s is at most {MAX_TIMEOUT_S} s, got {self.timeout_s!r}.")


@dataclass(frozen=True)
class PythonRun:
    """What one sandboxed run left: its printed output, its error output, the ``repr`` of the
    code's last expression (None when it had none), why it was stopped, if it was, which kernel
    isolation the child got (``namespaces``: it ran in the jail, always so since code never runs
    outside it; ``syscalls_filtered``: read from the child itself) and the child's exit status
    (negative: the signal that ended it; None when it was stopped)."""

    stdout: str
    stderr: str
    result: str | None
    stopped: str | None = None
    namespaces: bool = False
    syscalls_filtered: bool = False
    exit_status: int | None = None

    @property
    def ok(self) -> bool:
        return self.stopped is None and not self.stderr


def run_python(
    code: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    *,
    stdin: str = "",
    files: dict[str, str] | None = None,
    file_mb: float = MAX_FILE_BYTES / (1024 * 1024),
    max_output_chars: int = MAX_OUTPUT_CHARS,
) -> PythonRun:
    """Run ``code`` in a sandboxed child interpreter (see the module doc) and return what it left.

    ``stdin`` is its standard input; ``files`` (name -> text) are written into its working
    directory beside it first (plain names only); ``file_mb`` caps each file it writes (its
    output included) and ``max_output_chars`` what is read back of its output. Raises
    ``training.isolation.jail.JailUnavailable`` where this machine cannot jail it."""
    timeout_s = min(max(float(timeout_s), 1.0), MAX_TIMEOUT_S)
    files = files or {}
    for name in files:
        if not isinstance(name, str) or not name or os.path.basename(name) != name or name in (".", "..") or name in _RUNNER_FILES:
            raise ValueError(f"run_python: file name {name!r} must be a plain name (no folder) other than {', '.join(_RUNNER_FILES)}.")
    with tempfile.TemporaryDirectory(prefix="python-sandbox-") as workdir:
        for name, text in {**files, "code.py": code}.items():
            with open(os.path.join(workdir, name), "w", encoding="utf-8") as handle:
                handle.write(text)
        program = filter_program(threads=False)
        settings = {
            "filter": program.hex() if program else "",
            "cpu_s": int(timeout_s) + 1,
            "memory_bytes": memory_mb * 1024 * 1024,
            "file_bytes": int(file_mb * 1024 * 1024),
        }
        env = {
            "PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            # one thread each: BLAS and OpenMP pools would need new threads, which the filter refuses
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1",
        }
        jail = Jail(workdir=workdir, writable=(workdir,), env=env)
        # Standard input from an unlinked file outside the working directory: the code cannot rewrite it.
        with open(os.path.join(workdir, "stdout"), "wb") as out, open(os.path.join(workdir, "stderr"), "wb") as err, \
                tempfile.TemporaryFile() as given:
            given.write(stdin.encode())
            given.seek(0)
            process = jail.popen([interpreter(), "-I", "-c", _RUNNER, json.dumps(settings)],
                                 stdin=given, stdout=out, stderr=err, start_new_session=True)
            stopped, status = None, None
            try:
                status = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                stopped = f"timed out after {timeout_s:g} s"
            finally:
                try:
                    os.killpg(process.pid, signal.SIGKILL)  # the jail's pid namespace ends with it
                except ProcessLookupError:
                    pass
                process.wait()
        status = _child_status(status)
        if stopped is None and status < 0:
            stopped = _signal_text(-status, timeout_s, memory_mb, settings["file_bytes"])
        stdout = _read(workdir, "stdout", max_output_chars)
        stderr = _read(workdir, "stderr", max_output_chars)
        try:
            with open(os.path.join(workdir, "result.json")) as handle:
                written = json.load(handle)
        except (OSError, ValueError):
            written = {}
        if not isinstance(written, dict):
            written = {}
        result = written.get("result")
        if isinstance(result, str) and len(result) > max_output_chars:
            result = result[:max_output_chars] + "...(cut)"
        return PythonRun(stdout, stderr, result if isinstance(result, str) else None, stopped,
                         True, bool(written.get("filtered")), status)


# The signals a program in the jail is ended by (its limits, the memory limit's failed allocation):
# bubblewrap passes a child's death by signal N on as exit status 128 + N.
_LIMIT_SIGNALS = {signal.SIGXCPU, signal.SIGXFSZ, signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS}


def _child_status(status: int | None) -> int | None:
    if status is not None and status > 128 and (status - 128) in _LIMIT_SIGNALS:
        return -(status - 128)
    return status


def _read(workdir: str, name: str, max_chars: int) -> str:
    with open(os.path.join(workdir, name), "rb") as handle:
        data = handle.read(4 * max_chars + 4)  # UTF-8: at most 4 bytes a character
    text = data.decode("utf-8", errors="replace")
    return text[:max_chars] + "...(cut)" if len(text) > max_chars else text


def _signal_text(number: int, timeout_s: float, memory_mb: int, file_bytes: int) -> str:
    if number == signal.SIGXCPU:
        return f"used over {timeout_s:g} s of CPU time"
    if number == signal.SIGXFSZ:
        return f"wrote a file over {file_bytes / (1024 * 1024):g} MB"
    if number in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT):
        return f"killed by {signal.Signals(number).name} (it may have needed more than {memory_mb} MB of memory)"
    return f"killed by {signal.Signals(number).name}"
