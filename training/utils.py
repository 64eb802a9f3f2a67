"""Small helpers: importing user code by path, checking optional dependencies, walking nested values."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import select
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator


MAX_LISTED = 20  # names listed in an error
# For the environment of the training and checking processes the platform starts: our trainers give
# transformers report_to="none" and log to MLflow through our own trackers, yet importing TRL imports
# mlflow (transformers' integration check), 0.6 s of each process's start.
NO_TRANSFORMERS_MLFLOW = {"DISABLE_MLFLOW_INTEGRATION": "TRUE"}


def leaves(value: Any, whole: Callable[[Any], Any] = lambda value: False) -> Iterator[Any]:
    """The values inside ``value``'s dicts, lists and tuples, however deep; a container for which
    ``whole`` is true is yielded as it is, not opened."""
    if isinstance(value, (dict, list, tuple)) and not whole(value):
        for item in value.values() if isinstance(value, dict) else value:
            yield from leaves(item, whole)
    else:
        yield value


def import_object(path: str, what: str = "object") -> Any:
    """Import ``package.module.Name`` or ``path/to/file.py:Name``.

    Raises ValueError that names the path, what was being loaded, and the underlying error.
    """
    if ":" in path and path.split(":", 1)[0].endswith(".py"):
        file_part, attr = path.split(":", 1)
        module = import_file(file_part, what=f"{what} {path!r}")
    else:
        module_path, _, attr = path.replace(":", ".").rpartition(".")
        if not module_path:
            raise ValueError(f"Cannot load {what} {path!r}: give a dotted path such as 'package.module.Name'.")
        try:
            module = importlib.import_module(module_path)
        except Exception as exc:
            raise ValueError(f"Cannot load {what} {path!r}: importing module {module_path!r} failed: {exc!r}.") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"Cannot load {what} {path!r}: module has no attribute {attr!r}{_names_in(module, attr)}.") from None


def _names_in(module: Any, missing: str) -> str:
    """What the module defines itself (its public classes and functions), the closest to ``missing`` first."""
    names = sorted(name for name, value in vars(module).items()
                   if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == module.__name__)
    if not names:
        return ""
    close = difflib.get_close_matches(missing, names, n=1)
    listed = ", ".join(names[:MAX_LISTED]) + (", ..." if len(names) > MAX_LISTED else "")
    return (f". Did you mean {close[0]!r}?" if close else ".") + f" It defines: {listed}"


def import_file(file_path: str | Path, what: str = "module") -> Any:
    """Import a Python file as a module (the same file, resolved, is the same module name).

    Raises ValueError naming ``what`` when the file is missing or raises while importing.
    """
    file_path = Path(file_path)
    if not file_path.is_file():
        raise ValueError(f"Cannot load {what}: file {file_path} does not exist.")
    module_name = f"_user_{file_path.stem}_{abs(hash(str(file_path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, file_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # user code can raise anything while importing
        raise ValueError(f"Cannot load {what}: importing {file_path} raised {exc!r}.") from exc
    return module


@lru_cache(maxsize=None)
def is_package_available(name: str) -> bool:
    """Whether a package can be imported, without importing it."""
    return importlib.util.find_spec(name) is not None


def is_trl_available() -> bool:
    return is_package_available("trl")


def is_verl_available() -> bool:
    return is_package_available("verl")


def cuda_device_count() -> int:
    """How many CUDA devices torch sees (0 without torch or CUDA)."""
    if not is_package_available("torch"):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def checkpoint_step(name: str) -> int | None:
    """The step a checkpoint directory's name ends in (``checkpoint-12``, ``global_step_12``), else None."""
    digits = ""
    for char in reversed(name):
        if not char.isdigit():
            break
        digits = char + digits
    return int(digits) if digits and name[: -len(digits)] in ("checkpoint-", "global_step_") else None


def readable(source: Any, timeout: float | None) -> bool:
    """Whether ``source`` (a file descriptor, or an object with ``fileno()``) can be read without
    blocking, or has closed, within ``timeout`` seconds (None: wait as long as it takes). By
    ``select.poll``: ``select.select`` refuses a descriptor numbered 1024 or more, which a process
    that has opened many files or connections holds (a test process of the suite did)."""
    poller = select.poll()
    poller.register(source, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(None if timeout is None else max(0.0, timeout) * 1000))
