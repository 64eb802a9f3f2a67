"""Does the demo hold on any seed? ``python -m training demo`` once per seed, one after another.

Each run trains the multi-turn FrozenLake recipe (examples/configs/frozenlake.yaml) until the mean
reward of the last five logged steps passes 0.9, or its steps run out. A seed passes when the
target is reached within ``--budget`` seconds of training (the README's promise: 180 s on 2 CPU
cores). The machine may be shared, so wall-clock times are pessimistic: the steps to the target are
recorded beside the seconds, with the process's CPU seconds and the load average before and after
each run, and ``passed_by_cpu_s`` judges the promise by CPU seconds (one torch thread: on an idle
core they are the wall seconds).

    python bench/demo_seeds.py [--seeds 1-10] [--budget 180] [--set key=value ...] [--out NAME]

Results: bench/results/<NAME>.json (default demo_seeds.json) and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REACHED = re.compile(r"reward passed [\d.]+ after ([\d.]+)s of training")
DONE = re.compile(r"training \w+: (\d+) (?:of \d+ )?steps, .*; ([\d.]+)s, last reward ([-\d.na]+)")


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds.extend(range(int(first), int(last or first) + 1))
    return seeds


def run_seed(seed: int, overrides: list[str], budget: float, timeout: float) -> dict:
    command = [sys.executable, "-m", "training", "demo", "--set", f"trainer.seed={seed}"]
    for item in overrides:
        command += ["--set", item]
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        output, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        output, returncode = (exc.stdout or b"").decode() + (exc.stderr or b"").decode(), None
    wall = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    reached = REACHED.search(output)
    done = DONE.search(output)
    seconds = float(reached.group(1)) if reached else None
    steps = int(done.group(1)) if done else None
    result = {
        "seed": seed,
        "reached_target": reached is not None,
        "seconds_to_target": seconds,
        "steps": steps,  # the demo stops once the target is reached: steps to the target when reached
        "last_reward": float(done.group(3)) if done else None,
        "passed": reached is not None and seconds <= budget,
        # the same promise judged by the CPU seconds of the whole run (start-up included), which a loaded
        # machine does not inflate: on an idle core one torch thread's CPU seconds are its wall seconds
        "passed_by_cpu_s": reached is not None and cpu <= budget,
        "wall_s": round(wall, 1),
        # CPU seconds of the whole run (start-up included): one torch thread, so this is roughly the
        # wall time the run takes on an idle core, whatever the neighbours do
        "cpu_s": round(cpu, 1),
        "returncode": returncode,
        "load_avg_before": round(load_before, 2),
        "load_avg_after": round(os.getloadavg()[0], 2),
    }
    if returncode not in (0, 1):  # 1: target not reached; anything else is a crash worth reading
        result["output_tail"] = output[-2000:]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1-10")
    parser.add_argument("--budget", type=float, default=180.0, help="seconds of training allowed to reach 0.9")
    parser.add_argument("--timeout", type=float, default=3600.0, help="wall-clock limit of one run (a loaded machine needs long)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default="demo_seeds")
    args = parser.parse_args()

    runs = []
    for seed in parse_seeds(args.seeds):
        result = run_seed(seed, args.overrides, args.budget, args.timeout)
        runs.append(result)
        print(json.dumps(result), flush=True)
    passed = sum(r["passed"] for r in runs)
    passed_by_cpu = sum(r["passed_by_cpu_s"] for r in runs)
    reached = [r for r in runs if r["reached_target"]]
    summary = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "recipe": "examples/configs/frozenlake.yaml",
        "overrides": args.overrides,
        "budget_s": args.budget,
        "passed": f"{passed}/{len(runs)}",
        "passed_by_cpu_s": f"{passed_by_cpu}/{len(runs)}",
        "reached_within_steps": f"{len(reached)}/{len(runs)}",
        "median_steps_to_target": sorted(r["steps"] for r in reached)[len(reached) // 2] if reached else None,
        "median_seconds_to_target": sorted(r["seconds_to_target"] for r in reached)[len(reached) // 2] if reached else None,
        "median_cpu_s": sorted(r["cpu_s"] for r in reached)[len(reached) // 2] if reached else None,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs": runs,
    }
    out = ROOT / "bench" / "results" / f"{args.out}.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{passed}/{len(runs)} seeds reached the target within {args.budget:.0f} s ({passed_by_cpu} within {args.budget:.0f} CPU-s); "
          f"{len(reached)}/{len(runs)} within the recipe's steps; written to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
