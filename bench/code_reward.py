"""What one test case of the ``code`` reward (``training.rewards.code_reward_fn``) costs: every case
is a sandboxed child interpreter, and code rewards run many cases per response. Three kinds of task,
each with passing code, timed per test case: a standard-input program (TACO), a function call
(LiveCodeBench) and a pytest file (KodCode, one program for all its tests). Wall-clock time and
the CPU time the child processes used (user + system): the CPU time swings less with the load.

    python bench/code_reward.py [--repeats 10] [--out bench/results/code_reward.json]

The machine's load average is recorded beside the times: on a shared machine they swing with the
neighbours' work.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from training.rewards import code_reward_fn  # noqa: E402

CASES = 5
TASKS = {
    "taco stdin program": (
        {"data_source": "taco", "ground_truth": {"inputs": [f"{i} 2\n" for i in range(CASES)],
                                                  "outputs": [f"{i + 2}\n" for i in range(CASES)]}},
        "a, b = map(int, input().split())\nprint(a + b)", CASES),
    "livecodebench function call": (
        {"data_source": "livecodebench", "ground_truth": [
            {"input": f"{i}", "output": f"{2 * i}", "testtype": "functional", "metadata": {"func_name": "twice"}}
            for i in range(CASES)]},
        "class Solution:\n    def twice(self, x: int) -> int:\n        return 2 * x", CASES),
    "kodcode pytest file": (
        {"data_source": "kodcode", "ground_truth": "from solution import twice\n\ndef test_twice():\n    assert twice(3) == 6\n"},
        "def twice(x):\n    return 2 * x", 1),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "code_reward.json"))
    args = parser.parse_args()
    before = os.getloadavg()
    results = {}
    for name, (task, code, cases) in TASKS.items():
        per_case, cpu_per_case = [], []
        for _ in range(args.repeats):
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            scored = code_reward_fn(task, f"```python\n{code}\n```")
            per_case.append((time.perf_counter() - started) / cases)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_per_case.append((after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime) / cases)
            if not scored.is_correct:
                raise SystemExit(f"{name}: the passing code did not pass: {scored.metadata}")
        results[name] = {"median_per_case_s": round(statistics.median(per_case), 4),
                         "max_per_case_s": round(max(per_case), 4),
                         "median_child_cpu_per_case_s": round(statistics.median(cpu_per_case), 4),
                         "cases": cases, "repeats": args.repeats}
        print(name, results[name], flush=True)
    report = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average": before,
                          "load_average_after": os.getloadavg()}, "per_case": results}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
