"""Reads an uploaded Parquet file in a child process of its own, under CPU-time and memory limits.

A Parquet file's pages are compressed and its sizes are the file's own word, so its bytes do not
bound what reading it costs (CSV and JSONL are read in the web process: their cost follows their
size). The child gets the file on stdin and answers one JSON object on stdout: ``{"columns": [...],
"rows": [...]}`` or ``{"error": "..."}``. No Django here: the child imports only pyarrow.

    python -m webapp.registry.parquet_reader MAX_ROWS MAX_OUTPUT_BYTES MEMORY_MB CPU_SECONDS < file.parquet
"""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
from typing import Any


class ReadError(ValueError):
    pass


def read(data: bytes, max_rows: int, max_output_bytes: int, memory_mb: int, cpu_seconds: int) -> dict[str, Any]:
    """Run the child on ``data``; its answer, or ReadError saying which limit stopped it."""
    env = {"PATH": os.environ.get("PATH", ""), "ARROW_DEFAULT_MEMORY_POOL": "system", "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "webapp.registry.parquet_reader", str(max_rows), str(max_output_bytes),
             str(memory_mb), str(cpu_seconds)],
            input=data, capture_output=True, timeout=cpu_seconds * 2 + 10, env=env,
        )
    except subprocess.TimeoutExpired:
        raise ReadError(f"reading it took longer than {cpu_seconds * 2 + 10} s") from None
    if done.returncode != 0 or not done.stdout:
        if done.returncode in (-9, -24) or b"CPU" in done.stderr:  # SIGKILL / SIGXCPU from the CPU limit
            raise ReadError(f"reading it took more than {cpu_seconds} s of CPU time")
        if b"MemoryError" in done.stderr or b"bad_alloc" in done.stderr or b"Out of memory" in done.stderr:
            raise ReadError(f"reading it needs more than {memory_mb} MB of memory")
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise ReadError(f"the reader stopped ({tail[0][:300]})")
    answer = json.loads(done.stdout)
    if "error" in answer:
        raise ReadError(answer["error"])
    return answer


def _limit(memory_mb: int, cpu_seconds: int) -> None:
    with open("/proc/self/status") as status:  # what the interpreter and pyarrow already map, plus the budget
        mapped = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:")), 0)
    limit = mapped + memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))


def _rows(data: bytes, max_rows: int, max_output_bytes: int) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(io.BytesIO(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        return {"error": f"Not a readable Parquet file ({exc})."}
    if parquet.metadata.num_rows > max_rows:
        return {"error": f"{parquet.metadata.num_rows:,} rows, more than the limit of {max_rows:,}; split the file."}
    rows: list[dict] = []
    size = 0
    try:
        for batch in parquet.iter_batches(batch_size=256):
            for row in batch.to_pylist():
                size += len(json.dumps(row, default=str))
                if size > max_output_bytes:
                    return {"error": f"Row {len(rows) + 1}: the rows so far unpack to more than {max_output_bytes:,} bytes."}
                rows.append(row)
                if len(rows) > max_rows:
                    return {"error": f"More than {max_rows:,} rows; split the file."}
    except (pa.ArrowException, OSError, ValueError) as exc:
        return {"error": f"Row {len(rows) + 1}: cannot be read ({exc})."}
    return {"columns": list(parquet.schema_arrow.names), "rows": rows}


def main(argv: list[str]) -> int:
    max_rows, max_output_bytes, memory_mb, cpu_seconds = (int(value) for value in argv)
    import pyarrow.parquet  # noqa: F401  (imported before the memory limit is set)

    data = sys.stdin.buffer.read()
    _limit(memory_mb, cpu_seconds)
    sys.stdout.write(json.dumps(_rows(data, max_rows, max_output_bytes), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
