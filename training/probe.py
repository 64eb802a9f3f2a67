"""Checking a run before it is queued, in a process of its own.

Checking a run means running its code: building the ``AgentTrainer`` imports the agent,
environment, workflow and reward it names, builds one agent and environment from the first row,
and calls the reward. A web server must not do that itself, so ``check_isolated(spec)`` runs
``check(spec)`` in a child process under a CPU-time and memory limit and reads back JSON only
(never a pickle: nothing the checked code made reaches the caller). Children are forked from a
warm server process that has the library, torch and transformers imported, so an answer takes
well under a second instead of the imports' several seconds.

The spec and the answer are JSON::

    spec = {"kwargs": {...AgentTrainer arguments: import paths, dataset names, config...},
            "plugins": ["examples"],           # modules imported first (they register names)
            "pinned": {"trainer.default_local_dir": None, ...},  # the final config must hold these
            "user_keys": ["data.train_batch_size", ...],         # keys the run's owner set
            "load_model": true}                # load the model's config and tokenizer, offline
    answer = {"ok": true, "final_config": {...}}
           | {"ok": false, "key": "config key or null", "message": "what is wrong"}

``python -m training.probe < spec.json`` checks one spec from a shell (cold: seconds of imports).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import resource
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

DEFAULT_TIMEOUT_S = 20.0
DEFAULT_MEMORY_MB = 2048
# Imported once in the forkserver, so each check's child starts with them loaded.
def _preload() -> None:
    """Import once in the server what every check needs (transformers' Auto classes load lazily)."""
    import torch  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import training.backends.trl_backend  # noqa: F401
    import training.trainer  # noqa: F401


def check(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the run's ``AgentTrainer`` in a scratch directory and check what the platform pins
    (and load each of ``spec["tools"]``, tools' import paths, when given). Runs the run's code:
    call it in a process of its own (``check_isolated``)."""
    try:
        for module in spec.get("plugins", []):
            importlib.import_module(module)
        for tool in spec.get("tools", []):
            from training.tools import load_tool

            load_tool(tool)
        if "kwargs" not in spec:
            return {"ok": True, "final_config": None}
        with tempfile.TemporaryDirectory(prefix="run-check-") as scratch:
            from training.trainer import AgentTrainer

            trainer = AgentTrainer(**{**spec["kwargs"], "run_path": scratch})
            final = trainer.final_config
            check_platform_keys(trainer, spec.get("pinned", {}), spec.get("user_keys", []))
            if spec.get("load_model"):
                _check_model(final, trainer.train_processor, scratch)
            return {"ok": True, "final_config": final.to_dict() if hasattr(final, "to_dict") else None}
    except ValueError as exc:
        return {"ok": False, "key": getattr(exc, "key", None), "message": str(exc)}
    except Exception as exc:  # the run's own code can raise anything
        return {"ok": False, "key": getattr(exc, "key", None), "message": f"Validation raised {type(exc).__name__}: {exc}"}


def check_platform_keys(trainer: Any, pinned: dict[str, Any], user_keys: list[str]) -> None:
    """ConfigError unless a built trainer's final config holds each ``pinned`` value (a backend's
    alias, such as rLLM's ``training.default_local_dir``, must not change one under another name),
    and no key of ``user_keys`` is handed to the backend's engine unchecked (verl's own keys name
    files and code this trainer cannot vet: a platform takes them from its administrators only)."""
    from training.config import ConfigError

    for key, value in pinned.items():
        if trainer.final_config.get(key) != value:
            raise ConfigError(key, "cannot be set per run (here it was set under another name); the platform chooses it.")
    passed = set(getattr(trainer.train_processor, "verl_overrides", None) or {})
    for key in user_keys:
        if key in passed:
            raise ConfigError(key, "is verl's own key, which the platform takes only from the backend's administrator.")


def _check_model(final: Any, processor: Any, scratch: str) -> None:
    """Load the model's config and tokenizer without any download: a model that is not on this
    machine fails now, named, instead of holding a worker in download retries."""
    from transformers import AutoConfig, AutoTokenizer

    from training.config import ConfigError
    from training.models import TINY_MODEL, resolve_model_path

    model = final.actor_rollout_ref.model
    if model.path is None:
        raise ConfigError("actor_rollout_ref.model.path", "no model given; choose one.")
    if model.path == TINY_MODEL and model.tokenizer_path is None:
        return  # built in code, no files to find
    path = resolve_model_path(final, scratch)
    trust = model.trust_remote_code
    remote = hasattr(processor, "load_tokenizer")  # a training service holds the weights; only the tokenizer is local
    try:
        if not remote:
            AutoConfig.from_pretrained(path, trust_remote_code=trust, local_files_only=True)
        AutoTokenizer.from_pretrained(model.tokenizer_path or path, trust_remote_code=trust, local_files_only=True)
    except Exception as exc:
        raise ConfigError(
            "actor_rollout_ref.model.path",
            f"model {model.path!r} could not be loaded on this machine ({type(exc).__name__}: {_first_line(exc)}); "
            "it is not in the local Hugging Face cache or its directory is not a saved model. Nothing is downloaded "
            "while checking a run: an administrator can download it once (huggingface-cli download) or choose another model.",
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


# -- the isolated child ------------------------------------------------------------------------
#
# A checking server (``python -m training.probe --serve``, a child of the caller) imports the library,
# torch and transformers once, then forks one child per check: the child sets its limits, runs
# ``check`` and writes the answer, length-prefixed, to a pipe. Only that JSON text comes back.

_HEADER = struct.Struct("!Q")
MAX_ANSWER_BYTES = 16 * 1024 * 1024
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# What the checked code has no need to see (a platform's own secrets and databases).
PRIVATE_ENV = {"SECRET_KEY", "DATABASE_URL", "REDIS_URL"}


def _limit_and_check(spec: dict[str, Any], timeout_s: float, memory_mb: int, out: int) -> None:
    """In the forked child: its own process group, CPU and memory limits, no stdin/stdout, then the check."""
    os.setpgid(0, 0)  # a timeout kills whatever the checked code started, too
    cpu = max(1, math.ceil(timeout_s))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    limit = _mapped_bytes() + memory_mb * 1024 * 1024  # torch alone maps a lot: the allowance is on top
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the server's protocol streams are not the checked code's to read or write
        os.dup2(devnull, fd)
    data = json.dumps(check(spec), default=str).encode()[:MAX_ANSWER_BYTES]
    os.write(out, _HEADER.pack(len(data)))
    view = memoryview(data)
    while view:
        view = view[os.write(out, view):]


def _mapped_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def run_forked(spec: dict[str, Any], timeout_s: float, memory_mb: int, sys_path: list[str] | None = None) -> dict[str, Any]:
    """``check(spec)`` in a forked child under the limits (importing from ``sys_path``, default:
    this process's); the answer, or why there is none."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(read_end)
            if sys_path is not None:
                sys.path[:] = sys_path
            _limit_and_check(spec, timeout_s, memory_mb, write_end)
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        data = _read_answer(read_end, time.monotonic() + timeout_s)
    finally:
        os.close(read_end)
        try:
            os.killpg(pid, signal.SIGKILL)  # what the checked code left running
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
    if data is not None:
        return _answer(data)
    if status == 0 or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        return {"ok": False, "key": None, "message": (
            f"Checking the run took over {timeout_s:g} s and was stopped: the agent, environment or reward code "
            "hangs or is too slow.")}
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
        return {"ok": False, "key": None, "message": f"Checking the run used over {timeout_s:g} s of CPU time and was stopped."}
    return {"ok": False, "key": None, "message": (
        f"Checking the run ended without an answer ({_status_text(status)}); it may need more than {memory_mb} MB of memory.")}


def _read_answer(fd: int, deadline: float) -> bytes | None:
    """The length-prefixed answer from ``fd``, or None at the deadline or an early end."""
    buffer = b""
    wanted: int | None = None
    while wanted is None or len(buffer) < wanted + _HEADER.size:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        buffer += chunk
        if wanted is None and len(buffer) >= _HEADER.size:
            wanted = _HEADER.unpack_from(buffer)[0]
            if wanted > MAX_ANSWER_BYTES:
                return None
    return buffer[_HEADER.size:_HEADER.size + wanted]


def _status_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def _answer(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not isinstance(value.get("ok"), bool):
        return {"ok": False, "key": None, "message": "Checking the run gave no readable answer."}
    return value


def serve(requests: Any = None, answers: Any = None) -> None:
    """The checking server: preload, say ``ready``, then one JSON request per line -> one JSON answer per line."""
    requests = requests or sys.stdin
    answers = answers or sys.stdout
    _preload()
    answers.write('{"ready": true}\n')
    answers.flush()
    for line in requests:
        request = json.loads(line)
        answer = run_forked(request["spec"], float(request["timeout_s"]), int(request["memory_mb"]), request.get("sys_path"))
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


class Checker:
    """A warm checking server for this process, started on first use and again if it died.
    One check at a time per ``Checker`` (each takes well under a second once warm)."""

    def __init__(self, startup_timeout_s: float = 180.0) -> None:
        self.startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def check(self, spec: dict[str, Any], timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB) -> dict[str, Any]:
        with self._lock:
            try:
                process = self._server()
                request = {"spec": spec, "timeout_s": timeout_s, "memory_mb": memory_mb, "sys_path": sys.path}
                process.stdin.write(json.dumps(request) + "\n")
                process.stdin.flush()
                line = self._read_line(process, timeout_s + 30)
                return _answer(line.encode())
            except (OSError, ValueError, TimeoutError) as exc:
                self.close()
                return {"ok": False, "key": None, "message": f"The run could not be checked: {exc}"}

    def _server(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is None:
            return self._process
        env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
        env.update(OFFLINE, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._process = subprocess.Popen(
            [sys.executable, "-m", "training.probe", "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=env, text=True, start_new_session=True,
        )
        if json.loads(self._read_line(self._process, self.startup_timeout_s)).get("ready") is not True:
            raise OSError("the checking server did not start")
        return self._process

    @staticmethod
    def _read_line(process: subprocess.Popen, timeout_s: float) -> str:
        if not select.select([process.stdout], [], [], timeout_s)[0]:
            raise TimeoutError(f"the checking server gave no answer within {timeout_s:g} s")
        line = process.stdout.readline()
        if not line:
            raise OSError(f"the checking server exited (code {process.poll()})")
        return line

    def warm(self) -> None:
        """Start the server now (it imports torch and transformers: seconds), not at the first check."""
        with self._lock:
            self._server()

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


_checker = Checker()


def check_isolated(spec: dict[str, Any], timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB) -> dict[str, Any]:
    """``check(spec)`` in a sandboxed child process (wall-clock and CPU limit ``timeout_s``, memory
    ``memory_mb`` beyond the warm server's): the answer, or why there is none (see the module doc)."""
    return _checker.check(spec, timeout_s, memory_mb)


def warm() -> None:
    """Start this process's checking server now rather than at the first check (a web server calls
    this at startup, so the first person to submit a run waits under a second, not for torch's import)."""
    _checker.warm()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--serve"]:
        serve()
        return 0
    answer = run_forked(json.load(sys.stdin), DEFAULT_TIMEOUT_S, DEFAULT_MEMORY_MB)
    json.dump(answer, sys.stdout)
    sys.stdout.write("\n")
    return 0 if answer["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
