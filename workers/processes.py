"""The child processes of a worker: a run's training process (``workers.child``), a playground
answer (``workers.playground_child``), a checkpoint's evaluation (``workers.evaluation_child``).

Each starts in a session of its own, so a stop reaches every process it started in turn
(dataloader workers, a local Ray cluster's raylet and its workers), and with the worker's
environment, the database it uses and the GPU of its slot. A worker with a warm process
(``RUN_WARM_PROCESS``: torch, transformers and TRL imported once) has it fork each child that uses no
GPU (``training.isolation.forkserver``); otherwise, or when it cannot, the child starts plain.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import psutil
from billiard.process import current_process
from django.conf import settings
from django.db import connection

from training.isolation import forkserver
from training.utils import NO_TRANSFORMERS_MLFLOW, cuda_device_count

logger = logging.getLogger(__name__)

# The modules a worker runs as children: all that its warm process may start.
CHILD_MODULES = ("workers.child", "workers.playground_child", "workers.evaluation_child")
# Where the worker's pool processes find its warm process: the worker's main process sets it.
WARM_PROCESS_ADDRESS = "WORKER_WARM_PROCESS"
UNIX_SOCKET_PATH_BYTES = 107  # what a Unix socket's address holds on Linux (sun_path, less its NUL)
Child = subprocess.Popen | forkserver.ForkedChild  # a child as the worker supervises it


def start_child(module: str, *args: str, output: IO | int | None = None, uses_gpu: bool = False) -> Child:
    """``python -m <module> <args>`` in a session of its own, with the worker's environment
    (``child_env``: the GPU of this worker's slot where it ``uses_gpu``), its output (both streams)
    to ``output``: forked from this worker's warm process where it has one that can. ``started`` on
    what it returns says how (the run's log shows it)."""
    env = child_env(uses_gpu)
    address = os.environ.get(WARM_PROCESS_ADDRESS)
    if address:
        try:
            child = forkserver.start(address, module, list(args), env, settings.BASE_DIR, stdin=subprocess.DEVNULL,
                                     stdout=output, stderr=output if output is not None else 1, uses_gpu=uses_gpu)
            child.started = "forked from the worker's warm process"
            return child
        except forkserver.NotServed as exc:
            logger.info("Starting %s without the warm process: %s.", module, exc)
            started = f"started without the warm process ({exc})"
    else:
        started = "started"
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args], env=env, stdin=subprocess.DEVNULL, stdout=output,
        stderr=subprocess.DEVNULL if output is subprocess.DEVNULL else subprocess.STDOUT,
        start_new_session=True,  # its own session: a kill reaches every process it starts
        cwd=settings.BASE_DIR,
    )
    process.started = started
    return process


def start_warm_process(address: Path | None = None) -> subprocess.Popen:
    """In a worker's main process: start its warm process (``python -m training.isolation.forkserver``,
    with the environment of a child that uses no GPU) and tell the pool processes where it listens
    (``address``, in a folder only this user may enter; by default ``warm_process_address()``).
    It listens once it has imported torch, transformers and TRL: a child asked for before (or when it does not answer within
    ``forkserver.REPLY_SECONDS``) starts plain, so no pool process waits on it. Not for a machine with
    GPUs (the worker starts none there: CUDA and fork do not mix)."""
    own_folder = None
    if address is None:
        address, own_folder = warm_process_address()
    process = forkserver.launch(sys.executable, address, CHILD_MODULES, child_env(needs_gpu=False), settings.BASE_DIR,
                                own_folder=own_folder)
    os.environ[WARM_PROCESS_ADDRESS] = str(address)
    return process


def warm_process_address() -> tuple[Path, str | None]:
    """Where this worker's warm process listens: ``$PLATFORM_VAR_DIR/warm/<pid>.sock``, or, where that
    is too long for a socket's address, the same in a private temporary folder (returned second: it
    goes with the warm process)."""
    address = Path(settings.VAR_DIR) / "warm" / f"{os.getpid()}.sock"
    if len(os.fsencode(address)) <= UNIX_SOCKET_PATH_BYTES:
        return address, None
    own_folder = tempfile.mkdtemp(prefix="platform-warm-")  # mode 0700
    return Path(own_folder) / "warm" / f"{os.getpid()}.sock", own_folder


def stop_warm_process(process: subprocess.Popen) -> None:
    """End the worker's warm process (the children it forked run on: each is its own session)."""
    os.environ.pop(WARM_PROCESS_ADDRESS, None)
    forkserver.stop(process)


def kill_session(process: Child) -> None:
    """SIGKILL to every process of the child's session, at once (not SIGTERM: that asks a training
    process for a checkpoint, and one that is superseded may write nothing more), then reap it."""
    kill_session_of(process.pid)
    process.wait()


def kill_session_of(leader: int) -> None:
    """SIGKILL to every process of the session that ``leader`` (a child of ``start_child``) leads.
    Its session, not only its process group: a local Ray cluster's workers (verl's trainer, which
    writes verl's checkpoints) each have a group of their own in it, and outlive their raylet by
    seconds, writing."""
    _kill_session_members(leader)
    try:
        os.killpg(leader, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_own_session() -> None:
    """From inside a child (a session leader, ``start_child``): SIGKILL to every process of its
    session, itself last (nothing of it runs on)."""
    _kill_session_members(os.getsid(0))
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _kill_session_members(session: int) -> None:
    """SIGKILL to the session's processes but this one, until none is left (one may be starting
    another as it is killed: a raylet its next worker)."""
    for _ in range(20):
        members = [pid for pid in psutil.pids() if pid != os.getpid() and _session_of(pid) == session]
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)  # killed ones become zombies, then leave the table as their parents reap them


def _session_of(pid: int) -> int | None:
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return None  # dead already: it writes nothing more
        return os.getsid(pid)
    except (ProcessLookupError, PermissionError, psutil.Error):
        return None


def session_alive(session: int) -> bool:
    """Whether a process of session ``session`` (not a zombie) is alive on this machine. Its number
    stays the session's while any process of it lives: the kernel gives it to no other."""
    return any(_session_of(pid) == session for pid in psutil.pids())


# -- who writes an attempt's folder ---------------------------------------------------------------
# An attempt's training process records itself in its folder (``record_writer``), so that a worker
# on the same machine can tell, later, that nothing of it runs any more (``writer_gone``): only then
# is what it left there removed (``workers.lifecycle.remove_ended_attempt_folders``).
WRITER_FILE = "writer.json"


def this_machine() -> dict[str, Any]:
    """This machine as a writer records it: its host name, when it booted, its process namespace
    (a container restarted on the same host is a new one: nothing of the old one runs)."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = None
    return {"host": socket.gethostname(), "boot": psutil.boot_time(), "namespace": namespace}


def record_writer(folder: str | Path) -> Path:
    """Record this process's session (a training process leads its own: ``start_child``) and its
    machine as the writer of ``folder``, an attempt's own folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = folder / f".{WRITER_FILE}.{os.getpid()}"
    written.write_text(json.dumps({**this_machine(), "session": os.getsid(0), "pid": os.getpid()}))
    os.replace(written, folder / WRITER_FILE)
    return folder / WRITER_FILE


def writer_gone(folder: str | Path) -> bool:
    """True when nothing of the session recorded as ``folder``'s writer can run any more: it ran on
    this machine, and the machine (or its container) started again since, or no process of that
    session is alive. False when it may still run, or cannot be told here (another machine's writer,
    whose own workers judge it; no record)."""
    try:
        writer = json.loads((Path(folder) / WRITER_FILE).read_text())
        session = int(writer["session"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    here = this_machine()
    if writer.get("host") != here["host"]:
        return False
    if (writer.get("boot"), writer.get("namespace")) != (here["boot"], here["namespace"]):
        return True
    return not session_alive(session)


def terminate_session(process: Child, wait_seconds: float = 5.0) -> None:
    """SIGTERM to the child's process group (a training process saves nothing on it when it is
    cancelled); after ``wait_seconds``, or once it has exited, SIGKILL to whatever
    is left of its session."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=wait_seconds)
    except subprocess.TimeoutExpired:
        pass
    kill_session(process)


def tail(path: Path, max_bytes: int = 20000) -> str:
    """The end of a child's output file ('' when there is none)."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-max_bytes:].decode("utf-8", "replace")


def child_env(needs_gpu: bool) -> dict[str, str]:
    """The worker's environment, with the database the worker uses and, for a ``needs_gpu`` child,
    the GPU of this worker slot."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = os.environ.get("DJANGO_SETTINGS_MODULE", "webapp.settings")
    env["DATABASE_URL"] = database_url(connection.settings_dict)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(NO_TRANSFORMERS_MLFLOW)
    if needs_gpu:
        gpu = gpu_for_this_worker()
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def gpu_for_this_worker() -> str | None:
    """One GPU per worker process: child N of ``celery worker -Q gpu --concurrency=<GPUs>`` gets GPU N
    (of ``CUDA_VISIBLE_DEVICES`` when the worker was given a subset)."""
    index = getattr(current_process(), "index", None) or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
    else:
        devices = [str(i) for i in range(cuda_device_count())]
    return devices[index % len(devices)] if devices else None


def database_url(settings_dict: dict) -> str:
    """A DATABASE_URL for the connection Django uses now (so test databases carry over to children)."""
    engine = settings_dict["ENGINE"]
    if engine.endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    scheme = {"django.db.backends.postgresql": "postgres", "django.db.backends.mysql": "mysql"}.get(engine)
    if scheme is None:
        raise ValueError(f"Cannot hand database engine {engine} to a training process.")
    auth = quote(settings_dict.get("USER") or "")
    if settings_dict.get("PASSWORD"):
        auth += ":" + quote(settings_dict["PASSWORD"])
    host = settings_dict.get("HOST") or "localhost"
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    return f"{scheme}://{auth + '@' if auth else ''}{host}{port}/{settings_dict['NAME']}"


def run_child_within(module: str, arg: str, needs_gpu: bool, seconds: float, tail_chars: int, on_timeout) -> tuple[int | None, str]:
    """Run ``python -m module arg`` in a session of its own for at most ``seconds`` (then its whole
    session is ended and ``on_timeout()`` called). Returns its exit code (None when stopped, negative
    when killed by a signal) and the last ``tail_chars`` of what it printed."""
    output = tempfile.NamedTemporaryFile(prefix=f"{module.rsplit('.', 1)[-1]}-", suffix=".log", dir=settings.VAR_DIR, delete=False)
    try:
        with output:
            process = start_child(module, arg, output=output, uses_gpu=needs_gpu)
            try:
                process.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                terminate_session(process)
                on_timeout()
        return process.returncode, tail(Path(output.name))[-tail_chars:]
    finally:
        Path(output.name).unlink(missing_ok=True)


def how_it_ended(code: int | None) -> str:
    """A child's end in words: ``was killed by SIGKILL`` or ``exited with code 1``."""
    return f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exited with code {code}"
