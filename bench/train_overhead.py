"""Overhead of the ``trl`` backend against TRL's GRPOTrainer called directly, and the demo's
time to reward 0.9.

Both trainers get the same tiny model (saved once, loaded from disk), the same copy task, the
same seed and the same GRPO settings; they run alternately, ``--repeats`` times each, and the
median steps/s of each is compared (target: ours >= 0.97 x direct). Timing starts after
``--warmup`` steps so that model loading and the first step's allocations are not counted.

Two clocks: wall time, and the process's CPU time (one torch thread, so CPU seconds are the
work done). On a shared machine the wall-clock ratio swings with the neighbours' load; the
CPU-time ratio is the overhead measure that holds still.

    python bench/train_overhead.py [--steps 60] [--repeats 3] [--skip-demo]

Results: bench/results/train_overhead.json (and the table printed at the end).
"""

from __future__ import annotations

import argparse
import json
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
    reached = [line for line in result.stdout.splitlines() if line.startswith("reward passed")]
    done = [line for line in result.stdout.splitlines() if line.startswith("done:")]
    return {
        "exit_code": result.returncode,
        "wall_seconds_including_startup": round(wall, 1),
        "training_seconds_to_target": float(reached[0].split("after ")[1].rstrip("s of training")) if reached else None,
        "summary": (done + reached)[-2:] if done else result.stderr[-2000:],
    }


def median_of(pairs: list[tuple[float, float]], index: int) -> float:
    return statistics.median(pair[index] for pair in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "train_overhead.json"))
    args = parser.parse_args()

    import torch

    from training.tiny import save_tiny_model

    # One thread for both: on a small shared machine two threads make the timings several times
    # noisier (and slower) for a model this size.
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model(Path(tmp) / "model", seed=SEED)
        direct, ours = [], []
        for repeat in range(args.repeats):
            direct.append(run_direct(model_dir, args.steps, args.warmup, Path(tmp) / f"direct{repeat}"))
            ours.append(run_ours(model_dir, args.steps, args.warmup, Path(tmp) / f"ours{repeat}"))
            print(f"repeat {repeat}: direct {direct[-1][0]:.2f} steps/s ({direct[-1][1]:.2f} per CPU s), "
                  f"ours {ours[-1][0]:.2f} steps/s ({ours[-1][1]:.2f} per CPU s)", flush=True)
    results = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch_threads": torch.get_num_threads()},
        "task": f"copy, tiny-char model (2 layers, hidden 64), {PROMPTS} prompts x {GENERATIONS} generations, "
        f"{MAX_TOKENS} tokens, lr {LR}, {args.steps} steps ({args.warmup} warm-up)",
        "direct_steps_per_wall_s": [round(wall, 3) for wall, _ in direct],
        "ours_steps_per_wall_s": [round(wall, 3) for wall, _ in ours],
        "direct_steps_per_cpu_s": [round(cpu, 3) for _, cpu in direct],
        "ours_steps_per_cpu_s": [round(cpu, 3) for _, cpu in ours],
        "ratio_of_medians_wall": round(median_of(ours, 0) / median_of(direct, 0), 3),
        "ratio_of_medians_cpu": round(median_of(ours, 1) / median_of(direct, 1), 3),
        "target_ratio": 0.97,
    }
    if not args.skip_demo:
        results["demo"] = {**run_demo(), "target_seconds": 180}
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
