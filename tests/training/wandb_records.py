"""Reads an offline W&B run file (``run-<id>.wandb``) back, for the tracker tests.

wandb 0.31 no longer ships a Python reader (its Go core writes and syncs the file). The format is
the LevelDB log format (32 KiB blocks of chunks: CRC32C, length, type) after a 7-byte ``:W&B``
header, each record one ``wandb_internal_pb2.Record``: the same bytes ``wandb sync`` uploads.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str | Path):
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    position, pending = 7, b""
    while position + 7 <= len(data):
        if BLOCK - position % BLOCK < 7:  # a block's tail too short for a header is padding
            position += BLOCK - position % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position:position + 7])
        body = data[position + 7:position + 7 + length]
        position += 7 + length
        if kind == FULL:
            chunk = body
        elif kind == FIRST:
            pending = body
            continue
        elif kind == MIDDLE:
            pending += body
            continue
        elif kind == LAST:
            chunk = pending + body
        else:
            continue
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        yield record


def history(path: str | Path) -> list[dict]:
    """Each ``run.log`` row: key to decoded value, with ``_step``."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
    return rows


def config(path: str | Path) -> dict:
    values = {}
    for record in records(path):
        if record.WhichOneof("record_type") in ("config", "run"):
            items = record.config.update if record.WhichOneof("record_type") == "config" else record.run.config.update
            for item in items:
                values[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return values
