"""Does a learning test's recipe learn on any seed, or on a lucky one?

Each test that asserts learning trains through a recipe function of its test module (the same warm
start, overrides and steps as the test); this runs that recipe over many seeds, seeding both the warm
start and the trainer with each seed, each seed in a process of its own (one torch thread, as the test
suite), and reports per seed what the test asserts before and after, and the reward of each step.

    python bench/learning_seeds.py --recipe NAME [--seeds 0-9] [--steps N] [--set key=value ...] [--out NAME]

Results: bench/results/<NAME>.json (default <recipe>_seeds.json) and one line per seed.
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

# recipe -> (test module, recipe function, what the test asserts, by how much it must rise, the per-step
# metric reported beside the reward)
RECIPES = {
    "solver_judge": ("test_rllm_cookbooks", "train_solver_judge", "logprob", 0.3, "solver_acc"),
    "math": ("test_rllm_cookbooks", "train_math", "sampled_accuracy", 0.15, "accuracy"),
    "sdk_solver_judge": ("test_sdk_training", "train_sdk_solver_judge", "logprob", 0.5, None),
    "frozenlake_example": ("test_rllm_examples", "train_frozenlake", "reward", 0.2, None),
    "frozenlake_workflow": ("test_rllm_frozenlake_learning", "train_workflow", "logprob_likeliest", 0.3, None),
    "frozenlake_cookbook": ("test_rllm_frozenlake_learning", "train_cookbook", "logprob_likeliest", 0.3, None),
    "math_tool": ("test_rllm_tool_agents", "train_math_tool", "logprob", 0.1, None),
    "search": ("test_rllm_tool_agents", "train_search", "logprob", 0.2, None),
    "single_turn_workflow": ("test_rllm_examples", "train_single_turn_workflow", "logprob", 0.3, None),
    "math_agent": ("test_rllm_examples", "train_math_agent", "reward", 0.2, None),
    "trl_single_turn": ("test_trl_smoke", "train_single_turn", "reward", 0.3, None),
    "trl_multi_turn": ("test_trl_smoke", "train_multi_turn", "reward_5", 0.05, None),
    "trl_filtered": ("test_trl_smoke", "train_filtered", "reward", 0.0, None),
    "aworld_trl": ("test_aworld_agent", "train_aworld_trl", "reward", 0.3, None),
    "fireworks": ("test_fireworks_backend", "train_single_conversation", "reward", 0.3, None),
    "fireworks_two_conversations": ("test_fireworks_backend", "train_two_conversations", "reward", 0.4, None),
    "tinker": ("test_tinker_backend", "train_single_conversation", "reward", 0.3, None),
    "tinker_two_conversations": ("test_tinker_backend", "train_two_conversations", "reward", 0.4, None),
    "sdk_hendrycks_math": ("test_sdk_training", "train_hendrycks_math", "reward_last_first", 0.3, None),
    "sdk_countdown": ("test_sdk_training", "train_countdown", "reward_last_first", 0.3, None),
    "swift_single_turn": ("test_swift_backend", "train_single_turn", "reward_last_first", 0.3, None),
    "swift_frozenlake": ("test_swift_backend", "train_frozenlake", "reward_10", 0.05, None),
    "mcp_example": ("test_rllm_mcp", "train_example", "logprob", 0.1, None),
}
ASSERTED = {
    "logprob": "the log-probability of the rewarded answer rises by more than {rise}",
    "sampled_accuracy": "the share of sampled answers graded right (temperature 0.6) rises by more than {rise}",
    "reward": "the mean reward of the last three steps exceeds the first three's by more than {rise}",
    "reward_5": "the mean reward of the last five steps exceeds the first five's by more than {rise}",
    "reward_10": "the mean reward of the last ten steps exceeds the first ten's by more than {rise}",
    "reward_last_first": "the last step's reward exceeds the first step's by more than {rise}",
    "logprob_likeliest": "the log-probability of the winning move rises by more than {rise}, and it is the likeliest move after",
}


def one_seed(recipe: str, seed: int, steps: int | None, extra: list[str]) -> dict:
    """In this process: the test's recipe for ``seed``."""
    import importlib

    import torch

    for folder in ("tests/training", "tests/fixtures", "tests", "."):
        sys.path.insert(0, str(ROOT / folder))
    torch.set_num_threads(1)
    module, function, _, _, per_step = RECIPES[recipe]
    train = getattr(importlib.import_module(module), function)
    with tempfile.TemporaryDirectory(prefix=f"{recipe}-") as folder:
        # The datasets a recipe registers stay in this seed's folder, as the tests keep theirs in a tmp_path
        # (tests/conftest.py): in the user's registry a recipe's "frozenlake" would shadow the demo's.
        os.environ["AGENT_TRAINER_DATASETS"] = str(Path(folder) / "datasets")
        trained = train(Path(folder), seed=seed, extra=tuple(extra), **({"steps": steps} if steps else {}))
    result = {
        "before": round(trained["before"], 3), "after": round(trained["after"], 3),
        "rise": round(trained["after"] - trained["before"], 3),
        "rewards": [round(m["reward"], 3) for m in trained["metrics"]],
    }
    if per_step:
        result[per_step] = [round(m[per_step], 3) for m in trained["metrics"]]
    if "holds" in trained:  # what the test asserts besides the rise
        result["holds"] = bool(trained["holds"])
    if "accuracy_before" in trained:
        result["sampled_accuracy"] = [round(trained["accuracy_before"], 3), round(trained["accuracy_after"], 3)]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), required=True)
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--steps", type=int, help="training steps (default: the test's)")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE", help="an override added to the recipe")
    parser.add_argument("--out", help="results file name (default: <recipe>_seeds)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child: one seed, its result as JSON
    args = parser.parse_args()
    if args.one is not None:
        print("RESULT " + json.dumps(one_seed(args.recipe, args.one, args.steps, args.extra)))
        return 0
    module, function, measure, rise, _ = RECIPES[args.recipe]
    args.out = args.out or f"{args.recipe}_seeds"

    runs = []
    out = ROOT / "bench" / "results" / f"{args.out}.json"
    for seed in parse_seeds(args.seeds):
        command = [sys.executable, __file__, "--recipe", args.recipe, "--one", str(seed)]
        command += ["--steps", str(args.steps)] if args.steps else []
        for item in args.extra:
            command += ["--set", item]
        started, load_before = time.perf_counter(), os.getloadavg()[0]
        cpu_before = os.times()
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        cpu_after = os.times()
        line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
        result = {"seed": seed, **(json.loads(line[7:]) if line else {"error": (proc.stdout + proc.stderr)[-2000:]})}
        result.update(wall_s=round(time.perf_counter() - started, 1),
                      cpu_s=round(cpu_after.children_user + cpu_after.children_system - cpu_before.children_user - cpu_before.children_system, 1),
                      load_avg_before=round(load_before, 2))
        if line:
            before, after = result["sampled_accuracy"] if measure == "sampled_accuracy" else (result["before"], result["after"])
            result["learnt"] = after - before > rise and result.get("holds", True)
        runs.append(result)
        print(json.dumps(result), flush=True)
        learnt = [r for r in runs if r.get("learnt")]
        out.write_text(json.dumps({
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "recipe": f"tests/training/{module}.py::{function}", "steps": args.steps or "the test's",
            "changes": args.extra, "asserted": ASSERTED[measure].format(rise=rise), "learnt": f"{len(learnt)}/{len(runs)}",
            "smallest_rise": min((r["rise"] for r in runs if "rise" in r), default=None),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs,
        }, indent=2) + "\n")
    print(f"{sum(bool(r.get('learnt')) for r in runs)}/{len(runs)} seeds learnt; written to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
