"""Does the platform's demo run rise steadily? The run `make run` queues, trained once per seed.

A first-time watcher reads the demo's reward chart: a long dip looks like a broken platform. Each
seed trains the demo run's recipe (``webapp.registry.seed.demo_run``: examples/configs/frozenlake.yaml
for ``DEMO_STEPS`` steps, the test-set score on 16 rows) through ``python -m training train``, one
after another, and reads the per-step reward from the run's metrics.jsonl. Per seed:

- ``worst_drop``: the largest fall of the 10-step moving average of the reward from its highest
  point so far (the chart's worst dip, smoothed over the per-step noise of 32 episodes), with the
  steps where that fall starts and ends;
- ``first`` / ``final``: mean reward of the first and the last 10 steps.

    python bench/demo_curve.py [--seeds 1-12,42] [--steps 150] [--set key=value ...] [--out NAME]

Results: bench/results/<NAME>.json (default demo_curve.json) and one line per seed on stdout.
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
WINDOW = 10


def moving_average(values: list[float], window: int = WINDOW) -> list[float]:
    return [sum(values[i - window + 1 : i + 1]) / window for i in range(window - 1, len(values))]


def worst_drop(rewards: list[float], window: int = WINDOW) -> dict:
    """The largest fall of the moving average below its running maximum, and the steps it spans
    (steps are 1-based; a moving-average point is named by the last step in its window)."""
    average = moving_average(rewards, window)
    worst, peak_at, start, end = 0.0, 0, None, None
    for i, value in enumerate(average):
        if value > average[peak_at]:
            peak_at = i
        if average[peak_at] - value > worst:
            worst, start, end = average[peak_at] - value, peak_at, i
    step = lambda i: None if i is None else i + window  # noqa: E731
    return {"worst_drop": round(worst, 4), "drop_from_step": step(start), "drop_to_step": step(end)}


def demo_config(steps: int | None) -> dict:
    """The demo run's overrides, as `make run` queues them (its model is the recipe's tiny-char);
    ``steps`` replaces its number of training steps."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    import yaml

    from webapp.registry.seed import demo_run

    overrides = yaml.safe_load("\n".join(line.replace("=", ": ", 1) for line in demo_run()["overrides"].splitlines()))
    if steps:
        overrides["trainer.total_training_steps"] = steps
    overrides.pop("trainer.seed", None)  # each run's own
    return overrides


def run_seed(seed: int, config: dict, extra: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="demo-curve-") as folder:
        command = [sys.executable, "-m", "training", "train", str(ROOT / "examples" / "configs" / "frozenlake.yaml"),
                   "--run-path", folder, "--set", f"trainer.seed={seed}", "--set", "trainer.resume_mode=disable"]
        for key, value in config.items():
            command += ["--set", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
        for item in extra:
            command += ["--set", item]
        started, load_before = time.perf_counter(), os.getloadavg()[0]
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - started
        metrics_file = Path(folder) / "metrics.jsonl"
        records = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.exists() else []
    rewards = [r["reward"] for r in sorted((r for r in records if "reward" in r), key=lambda r: r["step"])]
    result = {"seed": seed, "steps": len(rewards), "returncode": proc.returncode, "wall_s": round(wall, 1),
              "load_avg_before": round(load_before, 2), "load_avg_after": round(os.getloadavg()[0], 2)}
    if len(rewards) >= WINDOW:
        result.update(worst_drop(rewards))
        result["first"] = round(sum(rewards[:WINDOW]) / WINDOW, 4)
        result["final"] = round(sum(rewards[-WINDOW:]) / WINDOW, 4)
    result["rewards"] = [round(r, 4) for r in rewards]
    if proc.returncode != 0:
        result["output_tail"] = (proc.stdout + proc.stderr)[-2000:]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1-12,42")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the demo run's)")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE", help="a change to the recipe")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--out", default="demo_curve")
    args = parser.parse_args()

    config = demo_config(args.steps)
    runs = []
    out = ROOT / "bench" / "results" / f"{args.out}.json"
    for seed in parse_seeds(args.seeds):
        result = run_seed(seed, config, args.extra, args.timeout)
        runs.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "rewards"}), flush=True)
        summary = {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "recipe": "webapp.registry.seed.demo_run (examples/configs/frozenlake.yaml)",
            "config": config, "changes": args.extra, "window": WINDOW,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "runs": runs,
        }
        out.write_text(json.dumps(summary, indent=2) + "\n")  # after each seed: a long sweep can be read while it runs
    print(f"written to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
