"""Does a run built from the form with every common field left empty learn? FrozenLake on the
built-in tiny model, trained with what an empty form gives (the library's defaults under the seeded
FrozenLake agent's and tiny-char model's ``default_config``, webapp/registry/seed.py), once with
the model's learning rate and once with the library's (1e-6, what an empty form gave before models
carried one). One run after the other; the reward of every step is recorded, and the mean of the
first and last ``--window`` steps.

    python bench/form_defaults.py [--steps 40] [--window 10] [--seed 0]

Results: bench/results/form_defaults.json.

``--speed`` instead times a step (the median of the trainer's ``step_time``, the first step left
out) of three FrozenLake runs on tiny-char, one after the other: the empty form as it was (torch's
default threads, the library's 8 tasks a step), the empty form now (the seeded defaults: 1 thread,
4 tasks) and the demo recipe `make run` queues. Results: bench/results/form_speed.json.

    python bench/form_defaults.py --speed [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
LR = "actor_rollout_ref.actor.optim.lr"


def empty_form_config() -> dict:
    """The config keys an empty run form adds to the library's defaults for FrozenLake on tiny-char."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from webapp.registry.seed import AGENTS, MODELS

    agent = next(a for a in AGENTS if a["name"] == "frozenlake")
    model = next(m for m in MODELS if m["name"] == "tiny-char")
    return {**model.get("default_config", {}), **agent.get("default_config", {})}


def demo_config() -> dict:
    """The demo run's overrides (what `make run` queues), as config keys."""
    import yaml

    from webapp.registry.seed import demo_run

    return {key: yaml.safe_load(value) for key, value in
            (line.split("=", 1) for line in demo_run()["overrides"].splitlines())}


def train(config: dict, steps: int, seed: int) -> dict:
    import examples  # noqa: F401 (registers the frozenlake dataset)
    from examples.frozenlake import FrozenLakeAgent, FrozenLakeEnv
    from training import AgentTrainer

    with tempfile.TemporaryDirectory() as run_path:
        started = time.perf_counter()
        AgentTrainer(
            agent_class=FrozenLakeAgent, env_class=FrozenLakeEnv, train_dataset="frozenlake:train", backend="trl",
            config={**config, "actor_rollout_ref.model.path": "tiny-char", "trainer.total_training_steps": steps,
                    "trainer.seed": seed},
            run_path=run_path,
        ).train()
        wall = time.perf_counter() - started
        rows = [json.loads(line) for line in (Path(run_path) / "metrics.jsonl").read_text().splitlines()]
    step_times = sorted(row["step_time"] for row in rows[1:] if "step_time" in row)
    return {"rewards": [round(row["reward"], 4) for row in rows if "reward" in row], "wall_s": round(wall, 1),
            "median_step_s": round(step_times[len(step_times) // 2], 3) if step_times else None}


def speed(steps: int, seed: int) -> None:
    form = empty_form_config()
    before = {key: value for key, value in form.items() if key not in ("trainer.cpu_threads", "data.train_batch_size")}
    runs = []
    for label, config in (("empty form before", before), ("empty form now", form), ("demo recipe", demo_config())):
        config = {k: v for k, v in config.items() if k != "trainer.total_training_steps"}
        result = train(config, steps, seed)
        runs.append({"label": label, "cpu_threads": config.get("trainer.cpu_threads", 0),
                     "train_batch_size": config.get("data.train_batch_size", 8), "config": config,
                     "median_step_s": result["median_step_s"], "wall_s": result["wall_s"]})
        print(f"{label:18} threads {runs[-1]['cpu_threads']} batch {runs[-1]['train_batch_size']}: "
              f"{result['median_step_s']} s per step ({steps} steps, {result['wall_s']} s in all)")
    out = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_end": round(os.getloadavg()[0], 2)},
        "task": "frozenlake on tiny-char, trl backend: median seconds per step, the first step left out",
        "steps": steps, "seed": seed, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs,
    }
    path = ROOT / "bench" / "results" / "form_speed.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {path.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speed", action="store_true", help="Time a step of the empty form before and now, and of the demo.")
    args = parser.parse_args()
    if args.speed:
        return speed(args.steps if args.steps != 40 else 8, args.seed)
    form = empty_form_config()
    runs = []
    for label, lr in (("seeded model's rate", form[LR]), ("library's rate", 1e-6)):
        result = train({**form, LR: lr}, args.steps, args.seed)
        rewards = result["rewards"]
        first, last = rewards[: args.window], rewards[-args.window:]
        runs.append({"label": label, "lr": lr, "first_mean": round(sum(first) / len(first), 3),
                     "last_mean": round(sum(last) / len(last), 3), **result})
        print(f"{label:22} lr {lr:<8g} reward {runs[-1]['first_mean']:.3f} -> {runs[-1]['last_mean']:.3f} in {args.steps} steps"
              f" ({result['wall_s']} s)")
    out = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_end": round(os.getloadavg()[0], 2)},
        "task": "frozenlake on tiny-char, trl backend, every common field of the run form empty",
        "empty_form_keys": form, "steps": args.steps, "window": args.window, "seed": args.seed,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs,
    }
    path = ROOT / "bench" / "results" / "form_defaults.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
