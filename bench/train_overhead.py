"""Overhead of the ``trl`` backend against TRL's GRPOTrainer called directly, and the demo's
time to reward 0.9.

Both trainers get the same tiny model (saved once, loaded from disk), the same copy task, the
same seed and the same GRPO settings. They run in pairs, one of each, the order alternating from
pair to pair (ours first, then direct first), so that both runs of a pair see about the same
neighbours' load; the figure is the median of the per-pair ratios (ours / direct, steps per
second; above 1: ours faster) with a distribution-free 95 % interval for that median (order
statistics of the ratios, from the binomial distribution: no assumption about the noise).
Timing starts after ``--warmup`` steps so that model loading and the first step's allocations
are not counted.

Both sides must do the same work, and each pair is checked: the same prompts in the same order,
the same number of completion tokens generated and the same number of optimizer steps (read from
TRL's generation step and torch's optimizer hooks, the same on both sides). A pair that differs
stops the benchmark.

Two clocks: wall time, and the process's CPU time (one torch thread, so CPU seconds are the
work done). The load average is recorded beside each pair.

    python bench/train_overhead.py [--steps 40] [--pairs 9] [--skip-demo]

Results: bench/results/train_overhead.json (and the summary printed at the end).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

SEED = 42
LR = 1e-3
PROMPTS, GENERATIONS, MAX_TOKENS = 8, 8, 4


class Work:
    """What one training run did: the prompts TRL generated for (in order), the completion tokens
    it generated and the optimizer steps taken. Recorded from GRPOTrainer's generation step, which
    our backend's trainer calls through ``super()``, and from torch's global optimizer hook."""

    current: Work | None = None

    def __init__(self) -> None:
        self.prompts: list = []
        self.completion_tokens = 0
        self.optimizer_steps = 0

    def __enter__(self) -> Work:
        Work.current = self
        return self

    def __exit__(self, *exc) -> None:
        Work.current = None

    def summary(self) -> dict:
        return {"prompts": len(self.prompts), "completion_tokens": self.completion_tokens,
                "optimizer_steps": self.optimizer_steps}


def record_work() -> None:
    """Hook the recording into TRL and torch once, before either trainer is built."""
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from trl import GRPOTrainer

    generate = GRPOTrainer._generate_and_score_completions

    def recorded(self, inputs):
        output = generate(self, inputs)
        if Work.current is not None:
            Work.current.prompts.extend(row["prompt"] for row in inputs)
            Work.current.completion_tokens += int(output["completion_mask"].sum())
        return output

    def count_step(optimizer, args, kwargs):
        if Work.current is not None:
            Work.current.optimizer_steps += 1

    GRPOTrainer._generate_and_score_completions = recorded
    register_optimizer_step_post_hook(count_step)


def same_work(direct: Work, ours: Work) -> None:
    if direct.prompts != ours.prompts:
        first = next((i for i, (a, b) in enumerate(zip(direct.prompts, ours.prompts)) if a != b), None)
        raise SystemExit(f"the two sides trained on different prompts ({len(direct.prompts)} vs {len(ours.prompts)}; "
                         f"first difference at {first}): the comparison would not be of the same work")
    if (direct.completion_tokens, direct.optimizer_steps) != (ours.completion_tokens, ours.optimizer_steps):
        raise SystemExit(f"different work: direct {direct.summary()}, ours {ours.summary()}")


def median_interval(ratios: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The interval [r_(k), r_(n+1-k)] of the sorted ratios holds the true median with probability
    1 - 2 P(Binomial(n, 1/2) < k); the widest k keeping that >= ``confidence``. Its coverage is
    returned too (exact, above ``confidence`` because n is small)."""
    n = len(ratios)
    ordered = sorted(ratios)
    below = lambda k: sum(math.comb(n, i) for i in range(k)) / 2**n  # noqa: E731  P(B < k)
    k = 1
    while k + 1 <= n // 2 and 1 - 2 * below(k + 1) >= confidence:
        k += 1
    coverage = 1 - 2 * below(k)
    if coverage < confidence:
        raise SystemExit(f"{n} pairs cannot give a {confidence:.0%} interval for the median; run at least 6")
    return ordered[k - 1], ordered[n - k], coverage


def copy_dataset():
    from examples.copy_task import make_copy_tasks

    return make_copy_tasks(256, seed=0)


def run_direct(model_dir: Path, steps: int, warmup: int, out_dir: Path) -> tuple[float, float]:
    """TRL's GRPOTrainer with a plain reward function: the baseline."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(SEED)
    stamps: dict[int, float] = {}

    class Stamp(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            stamps[state.global_step] = (time.perf_counter(), time.process_time())

    def char_accuracy(completions, ground_truth, **kwargs):
        return [sum(a == b for a, b in zip(c, t)) / len(t) for c, t in zip(completions, ground_truth)]

    args = GRPOConfig(
        output_dir=str(out_dir), max_steps=steps, per_device_train_batch_size=PROMPTS * GENERATIONS,
        num_generations=GENERATIONS, max_completion_length=MAX_TOKENS, learning_rate=LR,
        lr_scheduler_type="constant", logging_steps=1, save_strategy="no", seed=SEED, report_to="none",
        use_cpu=True, disable_tqdm=True, remove_unused_columns=False, beta=0.0,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=char_accuracy, args=args,
        train_dataset=Dataset.from_list(copy_dataset()), processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=[Stamp()],
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return rates(stamps, steps, warmup)


def run_ours(model_dir: Path, steps: int, warmup: int, out_dir: Path) -> tuple[float, float]:
    """The same run through AgentTrainer(backend="trl")."""
    import examples  # noqa: F401  (registers the copy dataset)
    from training import AgentTrainer

    stamps: dict[int, float] = {}

    class Stamp:
        def log_metrics(self, step, metrics):
            stamps[step] = (time.perf_counter(), time.process_time())

        def log_episodes(self, step, episodes):
            pass

        def close(self):
            pass

    trainer = AgentTrainer(
        train_dataset=copy_dataset(), reward_func="char_accuracy", backend="trl", run_path=str(out_dir),
        sinks=[Stamp()],
        config={
            "actor_rollout_ref.model.path": str(model_dir), "actor_rollout_ref.actor.optim.lr": LR,
            "actor_rollout_ref.rollout.n": GENERATIONS, "data.train_batch_size": PROMPTS,
            "data.max_response_length": MAX_TOKENS, "trainer.total_training_steps": steps,
            "trainer.logger": [], "trainer.seed": SEED, "trainer.resume_mode": "disable", "trainer.cpu_threads": 1,
        },
    )
    trainer.train()
    return rates(stamps, steps, warmup)


def rates(stamps: dict[int, tuple[float, float]], steps: int, warmup: int) -> tuple[float, float]:
    """Steps per wall second and per CPU second between the warm-up step and the last."""
    (wall_end, cpu_end), (wall_start, cpu_start) = stamps[steps], stamps[warmup]
    return (steps - warmup) / (wall_end - wall_start), (steps - warmup) / (cpu_end - cpu_start)


def run_demo() -> dict:
    """``python -m training demo`` in a fresh process, as a newcomer runs it."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "training", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    wall = time.perf_counter() - started
    done = [line for line in result.stdout.splitlines() if line.startswith("training ")]
    reached = [line.split("(", 1)[1] for line in done if "(reward passed" in line]
    return {
        "exit_code": result.returncode,
        "wall_seconds_including_startup": round(wall, 1),
        "training_seconds_to_target": float(reached[0].split("after ")[1].split("s of training")[0]) if reached else None,
        "summary": done[-1:] if done else result.stderr[-2000:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "train_overhead.json"))
    args = parser.parse_args()

    import torch

    from training.rollouts.tiny import save_tiny_model

    # One thread for both: on a small shared machine two threads make the timings several times
    # noisier (and slower) for a model this size.
    torch.set_num_threads(1)
    record_work()

    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model(Path(tmp) / "model", seed=SEED)
        for pair in range(args.pairs):
            load_before = os.getloadavg()[0]
            order = ("ours", "direct") if pair % 2 == 0 else ("direct", "ours")
            rates_of, work_of = {}, {}
            for side in order:
                with Work() as work:
                    run = run_ours if side == "ours" else run_direct
                    rates_of[side] = run(model_dir, args.steps, args.warmup, Path(tmp) / f"{side}{pair}")
                work_of[side] = work
            same_work(work_of["direct"], work_of["ours"])
            (direct_wall, direct_cpu), (ours_wall, ours_cpu) = rates_of["direct"], rates_of["ours"]
            pairs.append({
                "order": list(order), "direct_steps_per_wall_s": round(direct_wall, 3), "ours_steps_per_wall_s": round(ours_wall, 3),
                "direct_steps_per_cpu_s": round(direct_cpu, 3), "ours_steps_per_cpu_s": round(ours_cpu, 3),
                "ratio_wall": round(ours_wall / direct_wall, 4), "ratio_cpu": round(ours_cpu / direct_cpu, 4),
                "work": work_of["ours"].summary(), "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            })
            print(f"pair {pair} ({' then '.join(order)}): ratio {pairs[-1]['ratio_wall']:.3f} per wall s, "
                  f"{pairs[-1]['ratio_cpu']:.3f} per CPU s; same work {pairs[-1]['work']}; load {pairs[-1]['load_average']}",
                  flush=True)

    def figure(clock: str) -> dict:
        ratios = [p[f"ratio_{clock}"] for p in pairs]
        low, high, coverage = median_interval(ratios)
        return {"median_ratio": round(statistics.median(ratios), 3), "interval_95": [round(low, 3), round(high, 3)],
                "interval_coverage": round(coverage, 3), "ours_faster_in": f"{sum(r > 1 for r in ratios)} of {len(ratios)} pairs"}

    loads = [value for p in pairs for value in p["load_average"]]
    results = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch_threads": torch.get_num_threads(),
                    "load_average_range": [min(loads), max(loads)]},
        "task": f"copy, tiny-char model (2 layers, hidden 64), {PROMPTS} prompts x {GENERATIONS} generations, "
        f"{MAX_TOKENS} tokens, lr {LR}, {args.steps} steps ({args.warmup} warm-up)",
        "method": "pairs of one run each, order alternating; ratio = ours / direct steps per second (above 1: ours "
        "faster); median of the per-pair ratios with a distribution-free 95 % interval (binomial order statistics); "
        "every pair checked for the same prompts, completion tokens and optimizer steps",
        "wall": figure("wall"),
        "cpu": figure("cpu"),
        "pairs": pairs,
        "target_ratio": 0.97,
    }
    if not args.skip_demo:
        results["demo"] = {**run_demo(), "target_seconds": 180}
    elif Path(args.out).exists():  # keep the demo's last figures
        previous = json.loads(Path(args.out).read_text()).get("demo")
        if previous:
            results["demo"] = previous
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "pairs"}, indent=2))


if __name__ == "__main__":
    main()
