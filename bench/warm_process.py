"""What a worker's warm process saves a child: a tiny training (``python -m training train`` of the
copy task, 2 steps) started plain against the same one forked from a warm process
(training/isolation/forkserver.py), in pairs, the order alternating from pair to pair.

Per child: the wall time from the request to its exit, and its CPU time (user + system of the child
and what it waited for: ``getrusage(RUSAGE_CHILDREN)`` for a plain one, the server's ``wait4`` for a
forked one). The warm process's own import is measured once, apart: a worker pays it once, then
every child is forked. The figure is the median of the per-pair ratios (plain / forked) with a
distribution-free 95 % interval (order statistics).

    python bench/warm_process.py [--pairs 8]

Results: bench/results/warm_process.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from train_overhead import median_interval  # noqa: E402

from training.isolation import forkserver  # noqa: E402
from training.utils import NO_TRANSFORMERS_MLFLOW  # noqa: E402

ARGS = ["train", "examples/configs/copy.yaml", "--set", "trainer.total_training_steps=2", "--set", "data.train_batch_size=2"]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def plain(env: dict[str, str], run_path: Path) -> tuple[float, float]:
    cpu, start = children_cpu(), time.monotonic()
    subprocess.run([sys.executable, "-m", "training", *ARGS, "--run-path", str(run_path)], env=env, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.monotonic() - start, children_cpu() - cpu


def forked(address: Path, env: dict[str, str], run_path: Path) -> tuple[float, float]:
    start = time.monotonic()
    child = forkserver.start(address, "training", [*ARGS, "--run-path", str(run_path)], env, ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if child.wait() != 0:
        raise SystemExit(f"the forked training exited with {child.returncode}")
    return time.monotonic() - start, child.cpu_seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=8)
    options = parser.parse_args()
    env = {**os.environ, **NO_TRANSFORMERS_MLFLOW, "PYTHONUNBUFFERED": "1"}
    work = Path(tempfile.mkdtemp(prefix="warm-bench-"))
    address = work / "warm" / "server.sock"
    cpu, start = children_cpu(), time.monotonic()
    server = subprocess.Popen([sys.executable, "-m", "training.isolation.forkserver", str(address), "--allow", "training"],
                               env=env, cwd=ROOT)
    while not address.exists():
        time.sleep(0.05)
    # The first request waits for the imports: its wall time is the warm process's start.
    warm_up_wall, warm_up_cpu = forked(address, env, work / "warm-up")
    pairs = []
    for index in range(options.pairs):
        order = ("plain", "forked") if index % 2 == 0 else ("forked", "plain")
        pair = {}
        for kind in order:
            run_path = work / f"{kind}-{index}"
            pair[kind] = plain(env, run_path) if kind == "plain" else forked(address, env, run_path)
        pairs.append(pair)
        print(f"pair {index}: plain {pair['plain'][0]:.1f} s / {pair['plain'][1]:.1f} CPU-s, "
              f"forked {pair['forked'][0]:.1f} s / {pair['forked'][1]:.1f} CPU-s", flush=True)
    server.terminate()
    server.wait()
    # Ours: the server and every child; less the children measured one by one, the server's own imports.
    server_cpu = children_cpu() - cpu - warm_up_cpu - sum(p["plain"][1] + p["forked"][1] for p in pairs)
    wall_ratios = [p["plain"][0] / p["forked"][0] for p in pairs]
    cpu_ratios = [p["plain"][1] / p["forked"][1] for p in pairs]
    result = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "machine": f"{platform.node()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "child": "python -m " + " ".join(["training", *ARGS]),
        "pairs": [{"plain_s": p["plain"][0], "plain_cpu_s": p["plain"][1], "forked_s": p["forked"][0],
                   "forked_cpu_s": p["forked"][1]} for p in pairs],
        "median_s": {"plain": statistics.median(p["plain"][0] for p in pairs),
                     "forked": statistics.median(p["forked"][0] for p in pairs)},
        "median_cpu_s": {"plain": statistics.median(p["plain"][1] for p in pairs),
                         "forked": statistics.median(p["forked"][1] for p in pairs)},
        "wall_ratio_plain_over_forked": {"median": statistics.median(wall_ratios),
                                         "interval_95": median_interval(wall_ratios)[:2]},
        "cpu_ratio_plain_over_forked": {"median": statistics.median(cpu_ratios),
                                        "interval_95": median_interval(cpu_ratios)[:2]},
        "warm_process_start": {"first_child_s": warm_up_wall, "imports_cpu_s": server_cpu,
                               "note": "the first request waits for the imports; the warm process's own CPU is its imports"},
        "load_average_after": os.getloadavg(),
    }
    out = ROOT / "bench" / "results" / "warm_process.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median_s", "median_cpu_s", "wall_ratio_plain_over_forked",
                                             "cpu_ratio_plain_over_forked")}, indent=1))


if __name__ == "__main__":
    main()
