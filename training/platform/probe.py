"""Checking a run before it is queued, in a process of its own.

Checking a run means running its code: building the ``AgentTrainer`` imports the agent,
environment, workflow and reward it names, builds one agent and environment from the first row,
and calls the reward. A web server must not do that itself, so ``check_isolated(spec)`` runs
``check(spec)`` in a child process under a CPU-time and memory limit and reads back JSON only
(never a pickle: nothing the checked code made reaches the caller). Children are forked from a
warm server process that has the library, torch and transformers imported, so an answer takes
well under a second instead of the imports' several seconds.

The server runs in the platform's jail (``training.isolation.jail``: a mount namespace as an unprivileged
uid, no network, an environment of its own that holds no secret). What it sees: the interpreter,
the code the caller can import (its ``sys.path``, and the folders of registry code named by file
path), the local model cache read-only, and, for one check at a time, that check's data (its
``data_paths``: dataset files, a trained model's folder) linked into an inbox folder and named
there in the spec. Each check's child also refuses new programs and processes (threads only):
building an environment whose servers are programs (an MCP server) is left to the run itself.

The spec and the answer are JSON::

    spec = {"kwargs": {...AgentTrainer arguments: import paths, dataset names, config...},
            "plugins": ["examples"],           # modules imported first (they register names)
            "pinned": {"trainer.default_local_dir": None, ...},  # the final config must hold these
            "user_keys": ["data.train_batch_size", ...],         # keys the run's owner set
            "load_model": true,                # load the model's config and tokenizer, offline
            "data_paths": ["/var/uploads/train.jsonl", ...]}     # files and folders the check reads
    answer = {"ok": true, "final_config": {...}}
           | {"ok": false, "key": "config key or null", "message": "what is wrong",
              "problems": [{"key": ..., "message": ...}, ...]}  # every problem found; the first as above

``python -m training.platform.probe < spec.json`` checks one spec from a shell (cold: seconds of imports).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from training.config import secrets
from training.isolation.jail import Jail, interpreter, refuse_new_programs
from training.errors import ConfigError, JailUnavailable, Problems
from training.utils import NO_TRANSFORMERS_MLFLOW, leaves, readable
from training.agents.tools import load_tool
from training.rollouts.models import TINY_MODEL, resolve_model_path
from training.trainer import AgentTrainer

DEFAULT_TIMEOUT_S = 20.0
DEFAULT_MEMORY_MB = 2048
# Imported once in the forkserver, so each check's child starts with them loaded.
def _preload() -> None:
    """Import once in the server what every check needs (transformers' Auto classes load lazily)."""
    import torch  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import training.backends.trl.backend  # noqa: F401
    import training.trainer  # noqa: F401


def check(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the run's ``AgentTrainer`` in a scratch directory and check what the platform pins
    (and load each of ``spec["tools"]``, tools' import paths, when given). Runs the run's code:
    call it in a process of its own (``check_isolated``)."""
    try:
        for module in spec.get("plugins", []):
            importlib.import_module(module)
        for tool in spec.get("tools", []):
            load_tool(tool)
        if "kwargs" not in spec:
            return {"ok": True, "final_config": None}
        with tempfile.TemporaryDirectory(prefix="run-check-") as scratch:
            trainer = AgentTrainer(**{**spec["kwargs"], "run_path": scratch})
            final = trainer.final_config
            check_platform_keys(trainer, spec.get("pinned", {}), spec.get("user_keys", []))
            if spec.get("load_model"):
                _check_model(final, trainer.train_processor, scratch)
            return {"ok": True, "final_config": final.to_dict() if hasattr(final, "to_dict") else None}
    except Exception as exc:
        return _refusal(exc)


def _refusal(exc: Exception) -> dict[str, Any]:
    """The answer for a run refused by ``exc``; ``problems``: each of several found at once."""
    problems = [_problem(problem) for problem in (exc.problems if isinstance(exc, Problems) else [exc])]
    return {"ok": False, **problems[0], "problems": problems}


def _problem(exc: Exception) -> dict[str, Any]:
    key = getattr(exc, "key", None)
    if isinstance(exc, ValueError):
        return {"key": key, "message": str(exc)}
    return {"key": key, "message": f"Validation raised {type(exc).__name__}: {exc}"}  # the run's own code can raise anything


def check_platform_keys(trainer: Any, pinned: dict[str, Any], user_keys: list[str]) -> None:
    """ConfigError unless a built trainer's final config holds each ``pinned`` value (a backend's
    alias, such as rLLM's ``training.default_local_dir``, must not change one under another name),
    and no key of ``user_keys`` is handed to the backend's engine unchecked (verl's own keys name
    files and code this trainer cannot vet: a platform takes them from its administrators only)."""
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
# A checking server (``python -m training.platform.probe --serve``, a child of the caller) imports the library,
# torch and transformers once, then forks one child per check: the child sets its limits, runs
# ``check`` and writes the answer, length-prefixed, to a pipe. Only that JSON text comes back.

_HEADER = struct.Struct("!Q")
MAX_ANSWER_BYTES = 16 * 1024 * 1024
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _limit_and_check(spec: dict[str, Any], timeout_s: float, memory_mb: int, out: int) -> None:
    """In the forked child: its own process group, CPU and memory limits, no stdin/stdout, no new
    program or process (threads only), then the check."""
    os.setpgid(0, 0)  # a timeout kills whatever the checked code started, too
    refuse_new_programs(threads=True)
    secrets.use_placeholders()  # the jail holds no secret; nothing built here sends one anywhere
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
        if remaining <= 0 or not readable(fd, remaining):
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
    """A warm checking server for this process, in the jail, started on first use and again if it
    died or a check needs code it cannot see. One check at a time per ``Checker`` (each takes well
    under a second once warm). ``inbox``: the folder where each check's data is linked (on the same
    file system as the data, links cost nothing; elsewhere the data is copied); default: a
    temporary folder."""

    def __init__(self, startup_timeout_s: float = 180.0, inbox: str | os.PathLike | None = None) -> None:
        self.startup_timeout_s = startup_timeout_s
        self.inbox = str(inbox) if inbox is not None else None
        self._process: subprocess.Popen | None = None
        self._code: set[str] = set()
        self._lock = threading.Lock()

    def check(self, spec: dict[str, Any], timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB) -> dict[str, Any]:
        with self._lock:
            try:
                process = self._server(code_folders(spec))
                with _Inbox(self._inbox_root(), spec.get("data_paths", [])) as inbox:
                    request = {"spec": inbox.inside(spec), "timeout_s": timeout_s, "memory_mb": memory_mb,
                               "sys_path": [os.path.realpath(entry or os.getcwd()) for entry in sys.path]}
                    process.stdin.write(json.dumps(request) + "\n")
                    process.stdin.flush()
                    line = self._read_line(process, timeout_s + 30)
                    return inbox.outside(_answer(line.encode()))
            except (OSError, ValueError, TimeoutError, JailUnavailable) as exc:
                self.close()
                return {"ok": False, "key": None, "message": f"The run could not be checked: {exc}"}

    def _inbox_root(self) -> str:
        if self.inbox is None:
            self.inbox = tempfile.mkdtemp(prefix="run-check-inbox-")
        os.makedirs(self.inbox, mode=0o755, exist_ok=True)
        return self.inbox

    def _server(self, extra_code: set[str] = frozenset()) -> subprocess.Popen:
        code = set(code_roots(sys.path)) | set(extra_code)
        if self._process is not None and self._process.poll() is None and code <= self._code:
            return self._process
        self.close()
        self._code = code
        self._process = checker_jail(sorted(code), self._inbox_root(), sys.path).popen(
            [interpreter(), "-m", "training.platform.probe", "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, start_new_session=True,
        )
        if json.loads(self._read_line(self._process, self.startup_timeout_s)).get("ready") is not True:
            raise OSError("the checking server did not start")
        return self._process

    @staticmethod
    def _read_line(process: subprocess.Popen, timeout_s: float) -> str:
        if not readable(process.stdout, timeout_s):
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


def checker_jail(code: list[str], inbox: str, path: list[str]) -> Jail:
    """The checking server's jail: the code it may import (from the folders of ``path``), the model
    cache read-only (downloads are off), the inbox read-only, and an environment of its own: no
    variable of the caller's."""
    from huggingface_hub.constants import HF_HUB_CACHE

    folders = [os.path.realpath(entry or os.getcwd()) for entry in path]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "PYTHONPATH": os.pathsep.join(folders),
           "HF_HUB_CACHE": HF_HUB_CACHE, "HF_DATASETS_CACHE": "/tmp/datasets-cache",  # datasets writes its cache
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", **OFFLINE, **NO_TRANSFORMERS_MLFLOW}
    # Not killed with the thread that starts it (often a passing one): it ends when its stdin closes.
    return Jail(workdir="/tmp", read_only=(*code, HF_HUB_CACHE, inbox), env=env, die_with_parent=False)


def code_roots(path: list[str]) -> list[str]:
    """What of ``path`` (a ``sys.path``) is code: installed packages and the interpreter whole
    (the jail adds them), and of any other folder (a checkout) only its Python packages and
    modules, never its other files (a checkout's ``var/`` holds the platform's secret key)."""
    roots = []
    for entry in path:
        folder = os.path.realpath(entry or os.getcwd())
        if not os.path.isdir(folder):
            continue
        if "site-packages" in folder or "dist-packages" in folder or folder.startswith(os.path.realpath(sys.base_prefix)):
            continue
        for name in sorted(os.listdir(folder)):
            child = os.path.join(folder, name)
            if name.endswith(".py") or os.path.isfile(os.path.join(child, "__init__.py")):
                roots.append(child)
    return roots


_CODE_FILE = re.compile(r"^(/[^:]+\.py)(:[\w.]+)?$")


def code_folders(spec: dict[str, Any]) -> set[str]:
    """The folders of registry code that ``spec`` names by file path (``/srv/rewards/score.py:fn``)."""
    folders = set()
    for value in leaves({key: value for key, value in spec.items() if key != "data_paths"}):
        match = _CODE_FILE.match(value) if isinstance(value, str) else None
        if match and os.path.isfile(match.group(1)):
            folders.add(os.path.dirname(os.path.realpath(match.group(1))))
    return folders


class _Inbox:
    """One check's data, linked (or copied) into a fresh folder of the inbox; the spec's mentions of
    each host path are rewritten to its place there, and the answer's back. Removed afterwards."""

    def __init__(self, root: str, paths: list[str]) -> None:
        self.folder = tempfile.mkdtemp(prefix="check-", dir=root)
        os.chmod(self.folder, 0o755)
        self.places: dict[str, str] = {}
        for index, path in enumerate(dict.fromkeys(os.path.realpath(p) for p in paths if p and os.path.exists(p))):
            place = os.path.join(self.folder, str(index), os.path.basename(path))
            os.makedirs(os.path.dirname(place), mode=0o755)
            _link_tree(path, place)
            self.places[path] = place

    def __enter__(self) -> "_Inbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def inside(self, spec: dict[str, Any]) -> dict[str, Any]:
        return _rewrite({k: v for k, v in spec.items() if k != "data_paths"}, self.places)

    def outside(self, answer: dict[str, Any]) -> dict[str, Any]:
        return _rewrite(answer, {place: path for path, place in self.places.items()})


def _link_tree(source: str, target: str) -> None:
    """Hard links to ``source`` (a file or a folder) at ``target``; a copy where a link cannot serve
    (another file system, or a file the jail's uid could not read through a link)."""
    def place(src: str, dst: str) -> None:
        readable = os.geteuid() != 0 or os.stat(src).st_mode & 0o004
        try:
            if not readable:
                raise PermissionError
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o644)

    if os.path.isdir(source):
        shutil.copytree(source, target, copy_function=place, symlinks=False)
        for folder, _, _ in os.walk(target):
            os.chmod(folder, 0o755)
    else:
        place(source, target)


def _rewrite(value: Any, places: dict[str, str]) -> Any:
    """``value`` with every string that is, or starts with, a key of ``places`` (then ``/`` or ``:``) moved there."""
    if isinstance(value, str):
        for old, new in places.items():
            if value == old or value.startswith((old + "/", old + ":")):
                return new + value[len(old):]
            if old in value:  # a message quoting the path
                value = value.replace(old, new)
        return value
    if isinstance(value, dict):
        return {key: _rewrite(item, places) for key, item in value.items()}
    if isinstance(value, list):
        return [_rewrite(item, places) for item in value]
    return value


_checker = Checker()


def check_isolated(spec: dict[str, Any], timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB) -> dict[str, Any]:
    """``check(spec)`` in a sandboxed child process (wall-clock and CPU limit ``timeout_s``, memory
    ``memory_mb`` beyond the warm server's): the answer, or why there is none (see the module doc)."""
    return _checker.check(spec, timeout_s, memory_mb)


def use_inbox(folder: str | os.PathLike) -> None:
    """Link each check's data under ``folder`` (best on the data's own file system: links, not copies)."""
    if _checker.inbox != str(folder):
        with _checker._lock:
            _checker.close()  # its jail shows the old inbox
            _checker.inbox = str(folder)


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
