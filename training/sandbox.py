"""Running model-written Python in a child process that cannot harm the machine it runs on.

A tool agent's ``python`` tool executes whatever the policy wrote, so the code runs in a fresh
interpreter (``python -I``: no user site, no ``PYTHON*`` variables, not the caller's directory on
``sys.path``) that, before the code's first line:

- enters a user and a network namespace of its own where the kernel allows it (no network
  interface but a down loopback; other processes' ``/proc/<pid>/environ`` are out of reach);
- installs a seccomp filter (where the kernel has seccomp, on x86-64 and arm64) that answers
  EPERM to ``clone``, ``fork``, ``vfork``, ``clone3``, ``execve``, ``execveat`` and ``socket``:
  no new process, thread or program, so a fork bomb fails at its first fork, root or not;
- sets resource limits: CPU seconds, address space, file size, open files, no core files, and
  ``RLIMIT_NPROC`` 0 (the same as the filter for a user other than root);
- installs an audit hook (PEP 578) that refuses starting processes, sockets, ``ctypes``, and
  opening files outside the allowed places: the code writes only in its own temporary working
  directory and reads only there and in the interpreter's own library folders.

The parent gives it a wall-clock timeout and kills its whole process group then. Its environment
holds only ``PATH``, ``HOME``/``TMPDIR`` (the working directory) and thread-count variables: no
secret of the caller's. Output is read from files in the working directory, cut to
``MAX_OUTPUT_CHARS`` (or the caller's ``max_output_chars``); the file-size limit keeps a printing
loop from filling the disk.

The same sandbox serves the ``python`` tool of tool agents (code in, last expression's value out)
and the ``code`` reward (``training.rewards.code_reward_fn``), which also gives a program its
standard input, places files beside it in its folder (a solution, a harness, a test file) and reads
its exit status (``SystemExit`` ends the code with its status, as in a plain interpreter).

This is a layered sandbox for a single machine, not a virtual machine: the kernel is shared.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass

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

def _enter_namespaces():
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
        return libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0
    except Exception:
        return False

# Syscall numbers refused by the seccomp filter: new processes and threads, exec, sockets.
_SYSCALLS = {"x86_64": (0xC000003E, (56, 57, 58, 59, 322, 435, 41)), "aarch64": (0xC00000B7, (220, 221, 281, 435, 198))}

def _refuse_syscalls():
    # A seccomp filter answering EPERM to clone, fork, vfork, clone3, execve, execveat and socket:
    # it holds for root too, which RLIMIT_NPROC does not.
    import ctypes, struct
    arch = _SYSCALLS.get(os.uname().machine)
    if arch is None:
        return False
    audit_arch, numbers = arch
    def op(code, k, jt=0, jf=0):
        return struct.pack("HBBI", code, jt, jf, k)
    LD, JEQ, RET = 0x20, 0x15, 0x06
    ALLOW, KILL, EPERM = 0x7FFF0000, 0x80000000, 0x00050000 | 1
    JGE = 0x35
    # x86-64's x32 numbers (bit 30 set) reach the same calls under other numbers: refused whole
    program = [op(LD, 4), op(JEQ, audit_arch, 1, 0), op(RET, KILL), op(LD, 0), op(JGE, 0x40000000, len(numbers) + 1, 0)]
    for i, number in enumerate(numbers):
        program.append(op(JEQ, number, len(numbers) - i, 0))
    program += [op(RET, ALLOW), op(RET, EPERM)]
    code = b"".join(program)
    buffer = ctypes.create_string_buffer(code, len(code))
    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = Program(len(program), ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0

isolated = _enter_namespaces()
filtered = _refuse_syscalls()
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

workdir = os.path.realpath(os.getcwd())
readable = tuple(os.path.realpath(p) for p in settings["readable"]) + (workdir,)
with open("code.py") as handle:
    source = handle.read()

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_REFUSED = ("subprocess.", "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
            "os.kill", "os.killpg", "socket.", "ctypes.", "os.chroot", "os.setuid", "os.setgid",
            "_posixsubprocess", "pty.", "os.startfile", "sys.setprofile", "sys.settrace", "sys.addaudithook")
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
                "os.symlink", "os.truncate", "os.utime", "os.chdir", "shutil.rmtree", "shutil.copyfile",
                "shutil.move", "os.listdir", "os.scandir"}

def _inside(path, roots):
    path = os.path.realpath(os.fsdecode(path))
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)

def _hook(event, args):
    if event.startswith(_REFUSED):
        raise PermissionError(f"the sandbox does not allow {event}")
    if event == "open":
        path, mode, flags = args
        if isinstance(path, int) or path is None:
            return
        writes = (mode is not None and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
        allowed = (workdir, "/dev/null") if writes else readable  # /dev/null: pytest's capture writes there
        if not _inside(path, allowed):
            raise PermissionError(f"the sandbox does not allow opening {os.fsdecode(path)!r}" + (" for writing" if writes else ""))
    elif event in _PATH_EVENTS:
        for path in args:
            if isinstance(path, (str, bytes, os.PathLike)) and not _inside(path, (workdir,) if event not in ("os.listdir", "os.scandir") else readable):
                raise PermissionError(f"the sandbox does not allow {event} on {os.fsdecode(path)!r}")

sys.addaudithook(_hook)
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
    json.dump({"result": result, "isolated": isolated, "filtered": filtered}, handle)
sys.exit(status)
"""


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
    isolation the child got (read from the child itself: False where it could not tell) and the
    child's exit status (negative: the signal that ended it; None when it was stopped)."""

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
    output included) and ``max_output_chars`` what is read back of its output."""
    timeout_s = min(max(float(timeout_s), 1.0), MAX_TIMEOUT_S)
    files = files or {}
    for name in files:
        if not isinstance(name, str) or not name or os.path.basename(name) != name or name in (".", "..") or name in _RUNNER_FILES:
            raise ValueError(f"run_python: file name {name!r} must be a plain name (no folder) other than {', '.join(_RUNNER_FILES)}.")
    with tempfile.TemporaryDirectory(prefix="python-sandbox-") as workdir:
        for name, text in {**files, "code.py": code}.items():
            with open(os.path.join(workdir, name), "w", encoding="utf-8") as handle:
                handle.write(text)
        settings = {
            "cpu_s": int(timeout_s) + 1,
            "memory_bytes": memory_mb * 1024 * 1024,
            "file_bytes": int(file_mb * 1024 * 1024),
            "readable": _library_folders(),
        }
        env = {
            "PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            # one thread each: BLAS and OpenMP pools would need new threads, which RLIMIT_NPROC refuses
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1",
        }
        # Standard input from an unlinked file outside the working directory: the code cannot rewrite it.
        with open(os.path.join(workdir, "stdout"), "wb") as out, open(os.path.join(workdir, "stderr"), "wb") as err, \
                tempfile.TemporaryFile() as given:
            given.write(stdin.encode())
            given.seek(0)
            process = subprocess.Popen(
                [sys.executable, "-I", "-c", _RUNNER, json.dumps(settings)], cwd=workdir, env=env,
                stdin=given, stdout=out, stderr=err, start_new_session=True,
            )
            stopped, status = None, None
            try:
                status = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                stopped = f"timed out after {timeout_s:g} s"
            finally:
                try:
                    os.killpg(process.pid, signal.SIGKILL)  # whatever it left running too
                except ProcessLookupError:
                    pass
                process.wait()
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
                         bool(written.get("isolated")), bool(written.get("filtered")), status)


def _library_folders() -> list[str]:
    """Where the interpreter's own modules live: the code may import them (and read nothing else)."""
    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    folders.update(path for name in ("stdlib", "platstdlib", "purelib", "platlib") if (path := sysconfig.get_path(name)))
    folders.update(p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p)
    folders.update({"/usr/lib", "/usr/local/lib", "/lib", "/usr/share/zoneinfo", "/dev/null", "/dev/urandom", "/proc/self"})
    return sorted(folders)


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
