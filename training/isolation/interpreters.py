"""Whether another Python interpreter (a backend's own environment, e.g. ``.venv-swift``) can
import what a backend's training process needs, asked of that interpreter itself.

The answer comes from a short subprocess, ``python -I -c "import ..."``, with a timeout (heavy
packages such as torch are only looked up, not imported, to keep it short), and is
kept: the admin's backend list and the run form ask often, and the check costs a second or two of
CPU (ms-swift's import). For a virtual environment it is kept while the environment stays as it
was (its ``pyvenv.cfg`` and ``site-packages`` folders unchanged: installing or removing a package
changes the folder) for up to ``STABLE_SECONDS``; for another interpreter, ``CACHE_SECONDS``. ``-I`` (isolated
mode) keeps the caller's working directory, ``PYTHONPATH`` and user site-packages out of the
interpreter's path, so a file someone left where the web process runs (a ``swift.py``) is never
imported; only that environment's packages and this library (put on the path explicitly) are.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CACHE_SECONDS = 120.0
STABLE_SECONDS = 3600.0
TIMEOUT_SECONDS = 30.0

# key -> (when asked, the environment's fingerprint then, the answer)
_cache: dict[tuple[str, tuple[str, ...], tuple[str, ...]], tuple[float, tuple | None, str | None]] = {}
_lock = threading.Lock()


def import_problem(python: Path | str, modules: tuple[str, ...], hint: str = "", present: tuple[str, ...] = ()) -> str | None:
    """None when ``python`` imports every one of ``modules`` and finds the packages ``present``
    (looked up, not imported); else what is wrong, in words (a missing interpreter, the import
    error's last line, a missing package, a timeout), followed by ``hint``."""
    key = (str(python), tuple(modules), tuple(present))
    fingerprint = _fingerprint(Path(python))
    with _lock:
        cached = _cache.get(key)
    if cached is not None:
        asked, then, problem = cached
        age = time.monotonic() - asked
        if age < CACHE_SECONDS or (fingerprint is not None and fingerprint == then and age < STABLE_SECONDS):
            return problem
    problem = _ask(Path(python), tuple(modules), tuple(present))
    if problem is not None and hint:
        problem = f"{problem} ({hint})"
    with _lock:
        _cache[key] = (time.monotonic(), fingerprint, problem)
    return problem


def _fingerprint(python: Path) -> tuple | None:
    """What changes when a virtual environment's packages do: the modification times of its
    ``pyvenv.cfg`` and ``lib/python*/site-packages`` folders. None for an interpreter outside one."""
    root = python.parent.parent
    try:
        marks = [root / "pyvenv.cfg", *sorted(root.glob("lib/python*/site-packages"))]
        return tuple((str(path), path.stat().st_mtime_ns) for path in marks)
    except OSError:  # no pyvenv.cfg (not a virtual environment), or a folder gone meanwhile
        return None


def forget() -> None:
    """Drop every cached answer (after rebuilding an environment, and in tests)."""
    with _lock:
        _cache.clear()


def _plain_env() -> dict[str, str]:
    env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    return {**env, "HF_HUB_OFFLINE": "1"}


def _ask(python: Path, modules: tuple[str, ...], present: tuple[str, ...]) -> str | None:
    if not python.is_file():
        return f"its environment {python} does not exist"
    code = "; ".join([
        f"import sys, importlib.util; sys.path.insert(0, {str(PROJECT_ROOT)!r})",
        *(f"import {m}" for m in modules),
        *(f"importlib.util.find_spec({p!r}) or sys.exit({f'ModuleNotFoundError: No module named {p!r}'!r})" for p in present),
    ])
    try:
        done = subprocess.run([str(python), "-I", "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                              timeout=TIMEOUT_SECONDS, env=_plain_env())
    except subprocess.TimeoutExpired:
        return f"its environment {python} did not import {', '.join(modules)} within {TIMEOUT_SECONDS:g} s"
    except OSError as exc:
        return f"its environment {python} does not start ({exc})"
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return f"its environment {python} cannot import {', '.join(modules + present)}: {lines[-1] if lines else f'exit code {done.returncode}'}"
    return None
