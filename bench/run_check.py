"""How long a person waits for the run form's checks (``training/platform/probe.py``): the warm checking
server's start (once per web process, at startup), then each check in a sandboxed forked child:
a valid tiny copy run, and one refused for a dataset lacking the agent's field.

    python bench/run_check.py [--repeats 10]

Results: bench/results/run_check.json. The machine's load average is recorded beside them: on a
shared machine the times swing with the neighbours' work.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from training.platform.probe import Checker  # noqa: E402

TINY = {"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2}
SPECS = {
    "valid copy run": {"kwargs": {"train_dataset": "copy:train", "reward_func": "char_accuracy", "backend": "trl",
                                  "config": TINY}, "plugins": ["examples"], "load_model": True},
    "frozenlake on copy (refused)": {"kwargs": {"agent_class": "examples.frozenlake.FrozenLakeAgent",
                                                "env_class": "examples.frozenlake.FrozenLakeEnv",
                                                "train_dataset": "copy:train", "backend": "trl", "config": TINY},
                                     "plugins": ["examples"], "load_model": True},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    checker = Checker()
    started = time.perf_counter()
    checker.warm()
    results = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average": os.getloadavg()},
               "server_start_s": round(time.perf_counter() - started, 3), "checks": {}}
    for name, spec in SPECS.items():
        times, answer = [], None
        for _ in range(args.repeats):
            started = time.perf_counter()
            answer = checker.check(spec)
            times.append(time.perf_counter() - started)
        results["checks"][name] = {"ok": answer["ok"], "median_s": round(statistics.median(times), 3),
                                   "max_s": round(max(times), 3), "repeats": args.repeats}
    checker.close()
    results["machine"]["load_average_after"] = os.getloadavg()
    out = ROOT / "bench" / "results" / "run_check.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
