"""The swift backend on the CPU with the tiny model: where a run's time goes.

For a single-turn run (the copy-style prompts of the tests) and a FrozenLake multi-turn run
(through ms-swift's multi-turn scheduler), it measures the wall time of ``AgentTrainer.train()``,
the time until the first step is reported (the training process's start: interpreter, ms-swift's
imports, model and dataset), and the steps' own time (ms-swift's ``step_time``, median). It also
times the environment check the admin page and the run form make (an isolated subprocess in
``.venv-swift``), cold and cached.

    python bench/swift.py [--steps 20]

Results: bench/results/swift.json. On a shared machine wall times swing with the neighbours' load.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "training")]


class TimingSink:
    def __init__(self, started: float) -> None:
        self.started, self.first_step_at, self.metrics = started, None, []

    def log_metrics(self, step, metrics):
        if self.first_step_at is None:
            self.first_step_at = time.perf_counter() - self.started
        self.metrics.append({"step": step, **metrics})

    def log_episodes(self, step, episodes):
        pass

    def close(self):
        pass


def timed_run(name: str, steps: int, **kwargs) -> dict:
    from training import AgentTrainer

    with tempfile.TemporaryDirectory() as run_path:
        started = time.perf_counter()
        sink = TimingSink(started)
        result = AgentTrainer(backend="swift", run_path=run_path, sinks=[sink], **kwargs).train()
        wall = time.perf_counter() - started
    step_times = [m["step_time"] for m in sink.metrics if "step_time" in m]
    rewards = [m["reward"] for m in sink.metrics]
    return {
        "run": name, "steps": result.steps, "wall_s": round(wall, 2), "until_first_step_s": round(sink.first_step_at, 2),
        "median_step_time_s": round(statistics.median(step_times), 3) if step_times else None,
        "turns_mean": round(statistics.mean(m["turns"] for m in sink.metrics), 2) if "turns" in sink.metrics[0] else 1.0,
        "reward_first_5": round(statistics.mean(rewards[:5]), 3), "reward_last_5": round(statistics.mean(rewards[-5:]), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    import examples  # noqa: F401  (registers the frozenlake dataset)
    from task_rewards import PROMPTS

    from training.isolation import interpreters
    from training.backends.swift.backend import DEFAULT_PYTHON, environment_problem

    interpreters.forget()
    started = time.perf_counter()
    problem = environment_problem(DEFAULT_PYTHON)
    cold = time.perf_counter() - started
    started = time.perf_counter()
    environment_problem(DEFAULT_PYTHON)
    cached = time.perf_counter() - started
    if problem:
        sys.exit(f"the swift environment is not usable: {problem}")

    reward = str(ROOT / "tests" / "training" / "task_rewards.py") + ":starts_a_to_m"
    tiny = {"actor_rollout_ref.model.path": "tiny-char", "trainer.total_training_steps": args.steps, "trainer.logger": []}
    runs = [
        timed_run("single-turn", args.steps, train_dataset=PROMPTS, reward_func=reward, config={
            **tiny, "actor_rollout_ref.actor.optim.lr": 3e-2, "actor_rollout_ref.rollout.n": 8, "data.train_batch_size": 4,
            "data.max_response_length": 2}),
        timed_run("frozenlake multi-turn", args.steps, agent_class="examples.frozenlake.FrozenLakeAgent",
                  env_class="examples.frozenlake.FrozenLakeEnv", train_dataset="frozenlake:train", config={
                      **tiny, "actor_rollout_ref.actor.optim.lr": 3e-3, "actor_rollout_ref.rollout.n": 8,
                      "data.train_batch_size": 4, "data.max_response_length": 48, "rllm.agent.max_steps": 7,
                      "rllm.agent.max_tokens_per_turn": 1}),
    ]
    results = {
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "environment_check_s": {"cold": round(cold, 3), "cached": round(cached, 6)},
        "runs": runs,
    }
    target = ROOT / "bench" / "results" / "swift.json"
    target.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
