"""A warm Python: the training libraries imported once, children started by forking it.

A new Python process spends 7-10 CPU-seconds importing torch, transformers and TRL before it does
anything. The server (``python -m training.isolation.forkserver SOCKET --allow MODULE ...``) imports
them once; ``start`` hands it a module to run as ``python -m`` would, with its arguments, its
environment, its working folder and its standard streams (file descriptors passed over the Unix
socket), and returns a ``ForkedChild``: a pid and, once the child ends, its exit code, as
``subprocess.Popen`` gives them. When the server cannot serve, ``start`` says why (``NotServed``)
and the caller starts the child plain.

What stays as with a plain ``python -m``:
- the child leads a session of its own, with the caller's environment, folder and streams, its
  module run as ``__main__`` (an uncaught exception: the traceback and exit code 1); it ends as
  Python ends (threads joined, ``atexit`` run, files flushed), less the teardown of every module;
- Python's and numpy's random states are seeded afresh (a fork would share the server's);
- a child is refused when its environment differs from the server's in a variable the preloaded
  libraries read as they were imported (they keep the server's value; ``sensitivity``), or when
  it will use a GPU (CUDA and fork do not mix), or when the server holds a second Python thread.

Walls: the socket lies in a folder only the server's user may enter; the server serves only its
own user (``SO_PEERCRED``) and runs only the modules it was started to allow.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import io
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, NoReturn

from training.utils import readable

try:
    from setproctitle import setproctitle
except ImportError:  # the library alone: a forked child keeps the server's command line
    def setproctitle(title: str) -> None:
        pass

# What a training, playground or evaluation process of the platform imports first, and for long.
PRELOAD = ("torch", "transformers:AutoModelForCausalLM", "transformers:AutoTokenizer", "trl:GRPOTrainer")
# Libraries that read every variable with a prefix (they iterate the environment as they are imported):
# the prefix, not what they happened to read, is what they depend on.
PREFIX_SCANNERS = {"tqdm.utils": "TQDM_", "fsspec.config": "FSSPEC_"}
# Read by the interpreter as it starts, before any module: the server's and the child's must agree.
INTERPRETER_PREFIX = "PYTHON"
# The child makes its streams afresh with the caller's choice of buffering; the terminal's size is
# read at import only for the width of text (accelerate's menus), and readline sets it in the
# environment of a process that imports it, so a caller's children may carry it where the server
# has none.
APPLIED_IN_CHILD = {"PYTHONUNBUFFERED", "COLUMNS", "LINES"}
MESSAGE_BYTES = 1 << 20
OWNER_CHECK_SECONDS = 1.0
# A ready warm process answers in milliseconds. A caller (a worker's pool process, which must go on
# heartbeating its runs) waits no longer than this, then starts the child plain.
REPLY_SECONDS = 2.0


class NotServed(Exception):
    """The server cannot start this child (the reason is the message); start it plain."""


# -- the client ----------------------------------------------------------------------------------

class ForkedChild:
    """A child the server forked, as ``subprocess.Popen`` shows one: ``pid``, ``returncode``,
    ``poll()``, ``wait(timeout)``. Its exit code comes over the connection from the server."""

    def __init__(self, connection: socket.socket, pid: int, args: list[str]):
        self._connection = connection
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self.cpu_seconds: float | None = None  # user + system time of the child (and what it waited for)
        self._pid_watch: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._receive(timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._receive(timeout=left)
            if self.returncode is None and deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _receive(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` for the server's word that the child ended (or, once the server
        has gone, for the child's pid to end: no exit status reaches us then, and it reads as killed)."""
        if self._pid_watch is not None:
            if readable(self._pid_watch, timeout):
                os.close(self._pid_watch)
                self._pid_watch = None
                self.returncode = -signal.SIGKILL
            return
        if not readable(self._connection, timeout):
            return
        try:
            message = self._connection.recv(MESSAGE_BYTES)
        except OSError:
            message = b""
        self._connection.close()
        if message:
            ended = json.loads(message)
            self.returncode, self.cpu_seconds = int(ended["exit"]), ended.get("cpu_s")
            return
        try:
            self._pid_watch = os.pidfd_open(self.pid)  # readable once the child has ended
        except ProcessLookupError:
            self.returncode = -signal.SIGKILL
            return
        self._receive(timeout=0)


def start(address: str | os.PathLike, module: str, args: list[str], env: dict[str, str], cwd: str | os.PathLike,
          stdin: int | None = None, stdout: IO | int | None = None, stderr: IO | int | None = None,
          uses_gpu: bool = False) -> ForkedChild:
    """Have the server at ``address`` run ``python -m module args`` as a child in a session of its
    own. ``stdin``/``stdout``/``stderr``: a file, a file descriptor, ``subprocess.DEVNULL``, or
    None for this process's own. Raises ``NotServed`` (with the reason) when it cannot."""
    if uses_gpu:
        raise NotServed("the child uses a GPU")
    streams, opened = [], []
    try:
        for stream, own in ((stdin, 0), (stdout, 1), (stderr, 2)):
            if stream is None:
                streams.append(own)
            elif stream == subprocess.DEVNULL:
                opened.append(os.open(os.devnull, os.O_RDWR))
                streams.append(opened[-1])
            elif isinstance(stream, int):
                streams.append(stream)
            else:
                streams.append(stream.fileno())
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            connection.connect(os.fspath(address))
            request = {"module": module, "args": list(args), "env": dict(env), "cwd": os.fspath(cwd)}
            socket.send_fds(connection, [json.dumps(request).encode()], streams)
            connection.settimeout(REPLY_SECONDS)  # a slow or hung warm process: plain (it forks nothing once we hang up)
            reply = json.loads(connection.recv(MESSAGE_BYTES) or b'{"refused": "the warm process closed the connection"}')
            connection.settimeout(None)
        except OSError as exc:
            connection.close()
            raise NotServed(f"no warm process at {address} ({exc.strerror or exc})") from exc
        if "refused" in reply:
            connection.close()
            raise NotServed(reply["refused"])
        return ForkedChild(connection, int(reply["pid"]), [module, *args])
    finally:
        for fd in opened:
            os.close(fd)


def launch(python: str | os.PathLike, address: Path, allow: tuple[str, ...], env: dict[str, str], cwd: str | os.PathLike,
           preload: tuple[str, ...] = PRELOAD, own_folder: str | None = None) -> subprocess.Popen:
    """Start a server of interpreter ``python`` at ``address``, serving this process (its owner) and
    running only the modules ``allow``; it listens once it has imported ``preload``. In a session of
    its own (a Ctrl-C to the owner's terminal is the owner's to handle); its standard output goes
    nowhere (import notices), each child gets the streams it is asked with. ``own_folder``: a folder
    made for it alone, removed by ``stop``."""
    process = subprocess.Popen(
        [os.fspath(python), "-m", "training.isolation.forkserver", os.fspath(address), "--allow", *allow,
         "--preload", *preload, "--owner", str(os.getpid())],
        env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
    )
    process.address, process.own_folder = address, own_folder
    return process


def stop(process: subprocess.Popen) -> None:
    """End a server ``launch`` started and reap it (the children it forked run on: each is its own
    session), then remove its own folder."""
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if getattr(process, "own_folder", None):
        shutil.rmtree(process.own_folder, ignore_errors=True)


# -- what the preloaded libraries read from the environment --------------------------------------

class Sensitivity:
    """The variables the preloaded libraries read as they were imported (and the prefixes of those
    that read whole families), with the values they saw. ``everything``: something iterated the
    environment that we cannot tell the purpose of; then only the very same environment is served."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.prefixes: set[str] = {INTERPRETER_PREFIX}
        self.everything: str | None = None
        self.seen: dict[str, str] = {}  # the environment as they were imported
        self.set_by_them: dict[str, str] = {}  # what they set in it (a plain child's imports would too)

    def difference(self, env: dict[str, str]) -> str | None:
        """The first variable in which ``env`` differs from what the libraries saw, else None."""
        if self.everything is not None:
            keys = (set(env) | set(self.seen)) - APPLIED_IN_CHILD
            return next((k for k in sorted(keys) if env.get(k) != self.seen.get(k)), None)
        for key in sorted(self.keys - APPLIED_IN_CHILD):
            if env.get(key) != self.seen.get(key):
                return key
        for prefix in sorted(self.prefixes):
            names = {k for k in (*env, *self.seen) if k.startswith(prefix)} - APPLIED_IN_CHILD
            for key in sorted(names):
                if env.get(key) != self.seen.get(key):
                    return key
        return None


def _reader() -> str:
    """The module that reads the environment: the first frame outside the mapping's own code."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename in ("<frozen os>", "<frozen _collections_abc>"):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "?") if frame is not None else "?"


def preload(modules: tuple[str, ...]) -> Sensitivity:
    """Import ``modules`` (``name`` or ``name:attribute``), recording what they read from
    ``os.environ`` (C code that calls getenv itself is not seen: CUDA's and OpenMP's variables are
    read when a GPU or a thread pool is first used, which the server never does)."""
    import importlib

    sensitivity = Sensitivity()
    plain = type(os.environ)

    class Recording(plain):
        def __getitem__(self, key):
            reader = _reader()
            if reader in PREFIX_SCANNERS:
                sensitivity.prefixes.add(PREFIX_SCANNERS[reader])
            elif isinstance(key, str):
                sensitivity.keys.add(key)
            return super().__getitem__(key)

        def __iter__(self):
            reader = _reader()
            if reader in PREFIX_SCANNERS:
                sensitivity.prefixes.add(PREFIX_SCANNERS[reader])
            elif sensitivity.everything is None:
                sensitivity.everything = reader
            return super().__iter__()

    sensitivity.seen = dict(os.environ)
    os.environ.__class__ = Recording
    try:
        for name in modules:
            module, _, attribute = name.partition(":")
            imported = importlib.import_module(module)
            if attribute:
                getattr(imported, attribute)
    finally:
        os.environ.__class__ = plain
    sensitivity.set_by_them = {k: v for k, v in os.environ.items() if sensitivity.seen.get(k) != v}
    return sensitivity


# -- the server ----------------------------------------------------------------------------------

class _Request:
    def __init__(self, message: dict[str, Any], fds: list[int], set_by_preload: dict[str, str] | None = None):
        self.module = message["module"]
        self.args = [str(a) for a in message["args"]]
        self.env = {str(k): str(v) for k, v in message["env"].items()}
        self.cwd = message["cwd"]
        self.fds = fds
        self.set_by_preload = set_by_preload or {}
        self.ready = -1  # closed by the child once it leads its session under its own name


def serve(address: Path, allowed: set[str], modules: tuple[str, ...], owner: int) -> _Request:
    """Import ``modules``, listen at ``address``, then fork a child for each request. Returns only
    in a child, with its request; the server itself ends once ``owner`` (its parent) has, and the
    children it waits for have ended."""
    address.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(address.parent, 0o700)
    address.unlink(missing_ok=True)
    sensitivity = preload(modules)
    gc.collect()
    gc.freeze()  # what it imported is never traversed by a child's collections (which would copy its pages)
    # It listens once it has imported: a child asked for before finds no socket and starts plain, at once.
    # Bound and listening under a private name, then renamed: a caller that finds the address can
    # connect (one that came between bind and listen would be refused).
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    binding = address.parent / f".{os.getpid()}"
    binding.unlink(missing_ok=True)
    listener.bind(os.fspath(binding))
    listener.listen(64)
    os.replace(binding, address)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listener")
    waiting: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    while True:
        for key, _ in selector.select(timeout=OWNER_CHECK_SECONDS):
            if key.data == "listener":
                connection, _ = listener.accept()
                selector.register(connection, selectors.EVENT_READ, "request")
            elif key.data == "request":
                connection = key.fileobj
                selector.unregister(connection)
                child = _answer(connection, allowed, sensitivity, selector, listener, waiting)
                if child is not None:
                    return child
            else:  # a child ended
                pid, connection = waiting.pop(key.fileobj)
                selector.unregister(key.fileobj)
                os.close(key.fileobj)
                _, status, usage = os.wait4(pid, 0)
                ended = {"exit": os.waitstatus_to_exitcode(status), "cpu_s": usage.ru_utime + usage.ru_stime}
                try:
                    connection.send(json.dumps(ended).encode())
                except OSError:
                    pass  # the caller has gone; its child was its own
                connection.close()
        if os.getppid() != owner and not waiting:
            address.unlink(missing_ok=True)
            sys.exit(0)


def _answer(connection: socket.socket, allowed: set[str], sensitivity: Sensitivity, selector, listener,
            waiting: dict) -> _Request | None:
    """Fork the child ``connection`` asks for (returns its request, in the child) or refuse it."""
    fds: list[int] = []
    try:
        uid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
        data, fds, _, _ = socket.recv_fds(connection, MESSAGE_BYTES, 3)
        request = _Request(json.loads(data), fds, sensitivity.set_by_them)
        refused = _refusal(request, uid, allowed, sensitivity)
        if refused is None and len(fds) != 3:
            refused = "three standard streams were not passed"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        refused, request = f"a request the warm process could not read ({exc})", None
    if refused is None and _hung_up(connection):
        refused = "the caller gave up waiting"
    if refused is not None:
        for fd in fds:
            os.close(fd)
        try:
            connection.send(json.dumps({"refused": refused}).encode())
        except OSError:
            pass
        connection.close()
        return None
    ready, request.ready = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready)
        for key in list(selector.get_map().values()):
            if key.data != "listener" and key.data != "request":
                os.close(key.fileobj)
            else:
                key.fileobj.close()
        selector.close()
        listener.close()
        for _, other in waiting.values():
            other.close()
        connection.close()
        return request
    for fd in (*fds, request.ready):
        os.close(fd)
    os.read(ready, 1)  # a caller may signal its session as soon as it has the pid
    os.close(ready)
    watch = os.pidfd_open(pid)
    waiting[watch] = (pid, connection)
    selector.register(watch, selectors.EVENT_READ, "child")
    try:
        connection.send(json.dumps({"pid": pid}).encode())
    except OSError:
        pass
    return None


def _hung_up(connection: socket.socket) -> bool:
    """Whether the caller has closed its end (it waited past ``REPLY_SECONDS`` and started the child plain)."""
    if not readable(connection, 0):
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _refusal(request: _Request, uid: int, allowed: set[str], sensitivity: Sensitivity) -> str | None:
    if uid != os.getuid():
        return "the warm process serves only its own user"
    if request.module not in allowed:
        return f"the warm process does not run {request.module}"
    if threading.active_count() > 1:
        return "the warm process holds a second thread (no fork then)"
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
        return "the warm process has initialised CUDA (no fork then)"
    differs = sensitivity.difference(request.env)
    if differs is not None:
        return f"the environment differs from the warm process's in {differs}, which its libraries read when imported"
    return None


def become(request: _Request) -> NoReturn:
    """In the forked child: the session, streams, folder, environment and arguments of
    ``python -m <module> <args>``; run the module as ``__main__``, then exit as Python would."""
    os.setsid()
    setproctitle(" ".join([sys.executable, "-m", request.module, *request.args]))  # what ps and psutil show
    os.close(request.ready)
    for target, fd in enumerate(request.fds):
        os.dup2(fd, target)
    for fd in request.fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update({**request.set_by_preload, **request.env})
    unbuffered = bool(request.env.get("PYTHONUNBUFFERED"))
    sys.stdin = _stream(0, "r", unbuffered)
    sys.stdout = _stream(1, "w", unbuffered)
    sys.stderr = _stream(2, "w", True)
    sys.path[0] = request.cwd
    if "numpy.random" in sys.modules:  # seeded once from entropy at import; a fork would share the server's
        sys.modules["numpy.random"].seed()
    sys.argv = [request.module, *request.args]
    code = _run_as_main(request.module)
    _exit(code)


def _run_as_main(module: str) -> int | None:
    """Run ``module`` as ``__main__``; the exit code Python would give (None: killed by SIGINT, as
    an uncaught KeyboardInterrupt ends a plain one), its traceback printed."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        return None
    except BaseException:  # noqa: BLE001 (what the interpreter does with it: the traceback, exit code 1)
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _exit(code: int | None) -> NoReturn:
    """End as a plain Python ends, less the teardown of every module: that writes to each object
    the child shares with the warm process, copying its pages (about 2 CPU-seconds a child, where the
    whole child may take 1). What an exit does that matters is done here, in the interpreter's order:
    the non-daemon threads are joined, the ``atexit`` functions run (logging's shutdown,
    ``weakref.finalize``, the libraries' own), and every file still open for writing is flushed."""
    threading._shutdown()  # noqa: SLF001 (the interpreter's own first step at exit)
    atexit._run_exitfuncs()  # noqa: SLF001
    for generation in range(3):  # the child's own objects: the warm process froze its own (``serve``)
        for thing in gc.get_objects(generation):
            # By its type, not isinstance: that asks the object itself for its class, and a weak proxy
            # whose object has died raises, a lazy object (Django's settings, a request's nonce) runs its code.
            if issubclass(type(thing), (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)):
                try:
                    if not thing.closed:
                        thing.flush()
                except (OSError, ValueError):
                    pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code is None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code if code is not None else 1)


def _stream(fd: int, mode: str, unbuffered: bool) -> io.TextIOWrapper:
    """A standard stream as Python makes it at start (line-buffered on a terminal, written through
    when unbuffered)."""
    raw = io.FileIO(fd, mode, closefd=False)
    interactive = raw.isatty()
    buffered = io.BufferedReader(raw) if "r" in mode else io.BufferedWriter(raw)
    stream = io.TextIOWrapper(buffered, encoding="utf-8", errors="backslashreplace" if fd == 2 else "strict",
                              line_buffering=interactive, write_through=unbuffered and "w" in mode)
    return stream


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.isolation.forkserver")
    parser.add_argument("address", type=Path, help="the Unix socket to listen at (its folder is made private)")
    parser.add_argument("--allow", nargs="+", required=True, help="the modules it may run")
    parser.add_argument("--preload", nargs="*", default=PRELOAD, help="what to import first (name or name:attribute)")
    parser.add_argument("--owner", type=int, default=os.getppid(),
                        help="the process it serves (its parent): it ends once that has")
    options = parser.parse_args(argv)
    setproctitle(f"{sys.executable} -m training.isolation.forkserver {options.address}")  # not the modules it runs
    signal.signal(signal.SIGTERM, lambda *_: (options.address.unlink(missing_ok=True), os._exit(0)))
    request = serve(options.address, set(options.allow), tuple(options.preload), options.owner)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    become(request)


if __name__ == "__main__":
    main()
