"""Whether another Python interpreter (a backend's own environment, e.g. ``.venv-swift``) can
import what a backend's training process needs, asked of that interpreter itself.

The answer comes from a short subprocess, ``python -I -c "import ..."``, with a timeout (heavy
packages such as torch are only looked up, not imported, to keep it short), and is
kept for ``CACHE_SECONDS``: the admin's backend list and the run form ask often. ``-I`` (isolated
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
TIMEOUT_SECONDS = 30.0

_cache: dict[tuple[str, tuple[str, ...], tuple[str, ...]], tuple[float, str | None]] = {}
_lock = threading.Lock()


def import_problem(python: Path | str, modules: tuple[str, ...], hint: str = "", present: tuple[str, ...] = ()) -> str | None:
    """None when ``python`` imports every one of ``modules`` and finds the packages ``present``
    (looked up, not imported); else what is wrong, in words (a missing interpreter, the import
    error's last line, a missing package, a timeout), followed by ``hint``."""
    key = (str(python), tuple(modules), tuple(present))
    now = time.monotonic()
    with _lock:
        cached = _cache.get(key)
    if cached is not None and now - cached[0] < CACHE_SECONDS:
        return cached[1]
    problem = _ask(Path(python), tuple(modules), tuple(present))
    if problem is not None and hint:
        problem = f"{problem} ({hint})"
    with _lock:
        _cache[key] = (time.monotonic(), problem)
    return problem


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
