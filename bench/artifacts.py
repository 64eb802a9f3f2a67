"""Artifact store benchmark: what storing checkpoints costs a training run. Results:
bench/results/artifacts.json.

    python bench/artifacts.py [--sizes-mb 8 64] [--checkpoints 5]

For each checkpoint size, ``RunUploader`` stores ``--checkpoints`` checkpoint folders (one
``model.safetensors`` of random bytes plus small JSON files, as TRL writes them) to two stores:
a folder on this disk, and an S3-compatible server on loopback (moto's server mode, standing in
for MinIO; the client is s3fs, as in production). Reported per store and size:

* ``enqueue_ms``: the time the training thread spends handing a saved checkpoint over (median):
  all a training step waits for, whatever the store does;
* ``store_s``: from the hand-over to the checkpoint being whole in the store (median; all are
  handed over at once, so this includes waiting behind the ones before it);
* ``mb_per_s``: checkpoint bytes stored per second over the whole batch.

The loopback server keeps objects in memory and shares this machine's cores, so its figures are
a floor for the client's overhead, not a network's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "artifacts"))
RESULTS = ROOT / "bench" / "results" / "artifacts.json"


def write_checkpoint(folder: Path, size_mb: int) -> None:
    folder.mkdir(parents=True)
    with open(folder / "model.safetensors", "wb") as out:
        for _ in range(size_mb):
            out.write(os.urandom(1 << 20))
    for name in ("config.json", "trainer_state.json", "tokenizer.json"):
        (folder / name).write_text('{"bench": true}')


def measure(store, size_mb: int, count: int, scratch: Path) -> dict:
    from training.platform.artifacts import RunUploader

    uploader = RunUploader(store, f"runs/bench-{size_mb}-{time.time_ns()}", scratch, max_pending=count + 1)
    folders = []
    for step in range(1, count + 1):
        folder = scratch / "checkpoints" / f"checkpoint-{step}"
        write_checkpoint(folder, size_mb)
        folders.append(folder)
    enqueue, handed = [], {}
    started = time.perf_counter()
    for folder in folders:
        before = time.perf_counter()
        uploader.checkpoint_saved(folder)
        enqueue.append((time.perf_counter() - before) * 1000)
        handed[uploader._key_for(folder)] = before
    stored_at = {}
    while len(stored_at) < count:
        for key in uploader.stored - set(stored_at):
            stored_at[key] = time.perf_counter()
        time.sleep(0.005)
    total = time.perf_counter() - started
    uploader.finish(None, timeout=600)
    return {
        "checkpoint_mb": size_mb, "checkpoints": count,
        "enqueue_ms": round(statistics.median(enqueue), 3),
        "store_s": round(statistics.median(stored_at[k] - handed[k] for k in stored_at), 3),
        "mb_per_s": round(size_mb * count / total, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--checkpoints", type=int, default=5)
    args = parser.parse_args()

    from s3_server import S3Server

    from training.platform.artifacts import ArtifactStore

    server = S3Server().start()
    os.environ.update(server.env())
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            stores = {"local folder": ArtifactStore(str(Path(tmp) / "store")),
                      "S3 (moto on loopback, s3fs)": ArtifactStore(f"s3://{server.new_bucket()}/bench")}
            for label, store in stores.items():
                for size in args.sizes_mb:
                    scratch = Path(tmp) / f"scratch-{len(results)}"
                    row = {"store": label, **measure(store, size, args.checkpoints, scratch)}
                    print(json.dumps(row))
                    results.append(row)
    finally:
        server.stop()
    RESULTS.write_text(json.dumps({
        "bench": "artifacts", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "results": results,
    }, indent=2) + "\n")
    print(f"written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
