"""The GPUs a worker owns, as the workers page shows them (model, memory, load).

Read from ``nvidia-smi`` (the driver's own tool: no CUDA context is created in the worker, which
must leave the GPUs to its training processes). A worker limited by ``CUDA_VISIBLE_DEVICES`` owns
only those. No driver, no GPUs: an empty list.
"""

from __future__ import annotations

import os
import shutil
import subprocess

QUERY = "index,name,memory.total,memory.used,utilization.gpu"


def inventory() -> list[dict]:
    """``[{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "memory_used_mib": 3,
    "utilization_percent": 0}, ...]`` for the GPUs this process may use."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return []
    try:
        output = subprocess.run([tool, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    gpus = [gpu for gpu in map(_parse, output.splitlines()) if gpu is not None]
    visible = _visible_indices()
    return [gpu for gpu in gpus if visible is None or gpu["index"] in visible]


def _parse(line: str) -> dict | None:
    fields = [field.strip() for field in line.split(",")]
    if len(fields) != 5 or not fields[0].isdigit():
        return None
    index, name, total, used, load = fields
    return {"index": int(index), "name": name, "memory_total_mib": _number(total),
            "memory_used_mib": _number(used), "utilization_percent": _number(load)}


def _number(text: str) -> int | None:
    """nvidia-smi writes ``[N/A]`` where a GPU does not report a value."""
    try:
        return int(float(text))
    except ValueError:
        return None


def _visible_indices() -> set[int] | None:
    """The indices ``CUDA_VISIBLE_DEVICES`` allows (None: all; UUIDs are not narrowed down)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not all(part.isdigit() for part in parts):
        return None
    return {int(part) for part in parts}
