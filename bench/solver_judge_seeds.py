"""Does a cookbook learning test's recipe learn on any seed, or on a lucky one?

``test_solver_judge_cookbook_trains_unchanged_and_learns`` and ``test_math_cookbook_trains_unchanged_and_learns``
(tests/training/test_rllm_cookbooks.py) assert that training raises the log-probability of the
rewarded answer by more than 0.3. This runs a test's own recipe (``train_solver_judge`` or
``train_math``, by ``--recipe``: the same warm start, hydra overrides and steps),
seeding both the warm start and the trainer with each seed, each seed in a process of its own (one
torch thread, as the test suite), and reports per seed the log-probability before and after, and
the reward of each step.

    python bench/solver_judge_seeds.py [--recipe solver_judge|math] [--seeds 0-9] [--steps 5] [--set hydra.key=value ...] [--out NAME]

Results: bench/results/<NAME>.json (default solver_judge_seeds.json, math_seeds.json) and one line per seed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from demo_seeds import parse_seeds  # noqa: E402  (bench/ is the script's folder)

ROOT = Path(__file__).resolve().parent.parent
RISE = 0.3  # what the solver-judge test asserts of the log-probability
ACCURACY_RISE = 0.15  # what the math test asserts of the sampled accuracy


def one_seed(recipe: str, seed: int, steps: int, extra: list[str]) -> dict:
    """In this process: the test's recipe for ``seed``."""
    import torch

    for folder in ("tests/training", "tests/fixtures", "."):
        sys.path.insert(0, str(ROOT / folder))
    torch.set_num_threads(1)
    import test_rllm_cookbooks

    train = {"solver_judge": test_rllm_cookbooks.train_solver_judge, "math": test_rllm_cookbooks.train_math}[recipe]
    with tempfile.TemporaryDirectory(prefix=f"{recipe}-") as folder:
        trained = train(Path(folder), seed=seed, steps=steps, extra=tuple(extra))
    accuracy = "solver_acc" if recipe == "solver_judge" else "accuracy"
    return {
        "before": round(trained["before"], 3), "after": round(trained["after"], 3),
        "rise": round(trained["after"] - trained["before"], 3),
        "rewards": [round(m["reward"], 3) for m in trained["metrics"]],
        accuracy: [round(m[accuracy], 3) for m in trained["metrics"]],
        **({"sampled_accuracy": [round(trained["accuracy_before"], 3), round(trained["accuracy_after"], 3)]}
           if "accuracy_before" in trained else {}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=("solver_judge", "math"), default="solver_judge")
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE", help="a hydra override added to the recipe")
    parser.add_argument("--out", help="results file name (default: <recipe>_seeds)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child: one seed, its result as JSON
    args = parser.parse_args()
    if args.one is not None:
        print("RESULT " + json.dumps(one_seed(args.recipe, args.one, args.steps, args.extra)))
        return 0
    args.out = args.out or f"{args.recipe}_seeds"

    runs = []
    out = ROOT / "bench" / "results" / f"{args.out}.json"
    for seed in parse_seeds(args.seeds):
        command = [sys.executable, __file__, "--recipe", args.recipe, "--one", str(seed), "--steps", str(args.steps)]
        for item in args.extra:
            command += ["--set", item]
        started, load_before = time.perf_counter(), os.getloadavg()[0]
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
        result = {"seed": seed, **(json.loads(line[7:]) if line else {"error": (proc.stdout + proc.stderr)[-2000:]})}
        result.update(wall_s=round(time.perf_counter() - started, 1), load_avg_before=round(load_before, 2))
        if line and "sampled_accuracy" in result:
            before, after = result["sampled_accuracy"]
            result["learnt"] = after - before > ACCURACY_RISE
        elif line:
            result["learnt"] = result["rise"] > RISE
        runs.append(result)
        print(json.dumps(result), flush=True)
        learnt = [r for r in runs if r.get("learnt")]
        out.write_text(json.dumps({
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "recipe": f"tests/training/test_rllm_cookbooks.py::train_{args.recipe}", "steps": args.steps,
            "changes": args.extra,
            "asserted": f"sampled accuracy at temperature 0.6 rises by more than {ACCURACY_RISE}" if args.recipe == "math"
            else f"log-probability of the rewarded answer rises by more than {RISE}", "learnt": f"{len(learnt)}/{len(runs)}",
            "smallest_rise": min((r["rise"] for r in runs if "rise" in r), default=None),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs,
        }, indent=2) + "\n")
    print(f"{sum(bool(r.get('learnt')) for r in runs)}/{len(runs)} seeds learnt; written to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
