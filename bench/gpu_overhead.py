"""The ``trl`` backend against TRL's GRPOTrainer called directly, on a GPU, with a Qwen2-0.5B-shaped
model (random weights, bf16, the character tokenizer), and the multi-turn FrozenLake path's
tokens/s and episodes/s on the same model.

Both single-turn trainers get the same saved model, the copy task, 16 prompts x 8 generations x
64 tokens, the same seed and GRPO settings. They run in pairs, the order alternating, each pair
checked for the same work (bench/train_overhead.py's method); the figure is the median of the
per-pair ratios (ours / direct steps per second; target >= 0.97) with its distribution-free 95 %
interval where there are 6 pairs or more. Timing starts after ``--warmup`` steps. The device's
name is recorded with the results, which are written after every pair.

    python bench/gpu_overhead.py [--steps 30] [--pairs 6]
    python bench/gpu_overhead.py --device cpu --small --steps 3 --warmup 1 --pairs 1   # a smoke run

Results: bench/results/gpu_overhead.json (``--out`` to change).
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
sys.path.insert(0, str(ROOT))

from train_overhead import Work, median_interval, rates, record_work, same_work  # noqa: E402  (bench/ is this script's directory)

SEED = 42
LR = 1e-5
PROMPTS, GENERATIONS, MAX_TOKENS = 16, 8, 64
QWEN2_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2}
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}


def save_model(directory: Path, shape: dict, dtype: str) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from training.rollouts.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **shape)
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def copy_rows() -> list[dict]:
    from examples.copy_task import make_copy_tasks

    return make_copy_tasks(512, seed=0, length=16)


def run_direct(model_dir: Path, steps: int, warmup: int, out_dir: Path, device: str, dtype: str) -> tuple[float, float]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    stamps: dict[int, tuple[float, float]] = {}

    class Stamp(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if device == "cuda":
                torch.cuda.synchronize()
            stamps[state.global_step] = (time.perf_counter(), time.process_time())

    def char_accuracy(completions, ground_truth, **kwargs):
        return [sum(a == b for a, b in zip(c, t)) / len(t) for c, t in zip(completions, ground_truth)]

    args = GRPOConfig(
        output_dir=str(out_dir), max_steps=steps, per_device_train_batch_size=PROMPTS * GENERATIONS,
        num_generations=GENERATIONS, max_completion_length=MAX_TOKENS, learning_rate=LR,
        lr_scheduler_type="constant", logging_steps=1, save_strategy="no", seed=SEED, report_to="none",
        use_cpu=device == "cpu", disable_tqdm=True, remove_unused_columns=False, beta=0.0,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    trainer = GRPOTrainer(model=model, reward_funcs=char_accuracy, args=args, train_dataset=Dataset.from_list(copy_rows()),
                          processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[Stamp()])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return rates(stamps, steps, warmup)


class _Stamp:
    def __init__(self, device: str) -> None:
        self.device, self.stamps, self.metrics = device, {}, {}

    def log_metrics(self, step, metrics):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
        self.stamps[step] = (time.perf_counter(), time.process_time())
        self.metrics[step] = metrics

    def log_episodes(self, step, episodes):
        pass

    def close(self):
        pass


def _our_config(model_dir: Path, steps: int, device: str, dtype: str, **extra) -> dict:
    return {
        "actor_rollout_ref.model.path": str(model_dir), "actor_rollout_ref.model.dtype": dtype,
        "actor_rollout_ref.actor.optim.lr": LR, "actor_rollout_ref.rollout.n": GENERATIONS,
        "data.train_batch_size": PROMPTS, "data.max_response_length": MAX_TOKENS,
        "trainer.total_training_steps": steps, "trainer.logger": [], "trainer.seed": SEED,
        "trainer.resume_mode": "disable", "trainer.device": device, "trainer.val_before_train": False, **extra,
    }


def run_ours(model_dir: Path, steps: int, warmup: int, out_dir: Path, device: str, dtype: str) -> tuple[float, float]:
    import examples  # noqa: F401  (registers the example datasets)
    from training import AgentTrainer

    stamp = _Stamp(device)
    AgentTrainer(train_dataset=copy_rows(), reward_func="char_accuracy", backend="trl", run_path=str(out_dir),
                 sinks=[stamp], config=_our_config(model_dir, steps, device, dtype)).train()
    return rates(stamp.stamps, steps, warmup)


def run_multi_turn(model_dir: Path, steps: int, warmup: int, out_dir: Path, device: str, dtype: str) -> dict:
    """FrozenLake through the rollout engine: seconds per step, model tokens/s and episodes/s."""
    from training import AgentTrainer

    stamp = _Stamp(device)
    AgentTrainer(
        agent_class="examples.frozenlake.FrozenLakeAgent", env_class="examples.frozenlake.FrozenLakeEnv",
        train_dataset="frozenlake:train", backend="trl", run_path=str(out_dir), sinks=[stamp],
        config=_our_config(model_dir, steps, device, dtype, **{
            "data.max_response_length": 256, "rllm.agent.max_steps": 7, "rllm.agent.max_tokens_per_turn": 16,
            "rllm.agent.trajectory_timeout": 600,
        }),
    ).train()
    (wall_end, _), (wall_start, _) = stamp.stamps[steps], stamp.stamps[warmup]
    seconds = (wall_end - wall_start) / (steps - warmup)
    episodes = PROMPTS * GENERATIONS
    tokens = [stamp.metrics[s].get("num_tokens") for s in range(warmup + 1, steps + 1)]
    lengths = [stamp.metrics[s].get("response_length", 0.0) for s in range(warmup + 1, steps + 1)]
    return {
        "seconds_per_step": round(seconds, 3),
        "episodes_per_s": round(episodes / seconds, 2),
        "mean_response_tokens": round(sum(lengths) / len(lengths), 1),
        "response_tokens_per_s": round(episodes * sum(lengths) / len(lengths) / seconds, 1),
        "num_tokens_logged": tokens[-1],
    }


def summary(ratios: list[float]) -> dict:
    figure = {"median_ratio": round(statistics.median(ratios), 3), "ours_faster_in": f"{sum(r > 1 for r in ratios)} of {len(ratios)} pairs"}
    if len(ratios) >= 6:
        low, high, coverage = median_interval(ratios)
        figure.update(interval_95=[round(low, 3), round(high, 3)], interval_coverage=round(coverage, 3))
    return figure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--small", action="store_true", help="a 2-layer model instead of the Qwen2-0.5B shape")
    parser.add_argument("--skip-multi-turn", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_overhead.json"))
    args = parser.parse_args()

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: this benchmark measures the GPU path (use --device cpu --small for a smoke run)")
        return 2
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    results = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "model": f"Qwen2 {'2-layer' if args.small else '0.5B'} shape, random weights, {dtype}, character tokenizer",
        "task": f"copy, {PROMPTS} prompts x {GENERATIONS} generations x {MAX_TOKENS} tokens, {args.steps} steps ({args.warmup} warm-up)",
        "method": "pairs of one run each, order alternating, each pair checked for the same prompts and optimizer steps "
        "(and, on the CPU, completion tokens: bf16 sampling on a GPU is not bit-reproducible, so each side's token count "
        "is recorded); ratio = ours / direct steps per wall second",
        "target_ratio": 0.97,
        "pairs": [],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }

    def write() -> None:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")

    record_work()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_model(Path(tmp) / "model", SMALL if args.small else QWEN2_05B, dtype)
        for pair in range(args.pairs):
            order = ("ours", "direct") if pair % 2 == 0 else ("direct", "ours")
            rates_of, work_of = {}, {}
            for side in order:
                with Work() as work:
                    run = run_ours if side == "ours" else run_direct
                    rates_of[side] = run(model_dir, args.steps, args.warmup, Path(tmp) / f"{side}{pair}", args.device, dtype)
                work_of[side] = work
            if args.device == "cpu":
                same_work(work_of["direct"], work_of["ours"])
            elif work_of["direct"].prompts != work_of["ours"].prompts or work_of["direct"].optimizer_steps != work_of["ours"].optimizer_steps:
                raise SystemExit(f"different work: direct {work_of['direct'].summary()}, ours {work_of['ours'].summary()}")
            direct, ours = rates_of["direct"][0], rates_of["ours"][0]
            results["pairs"].append({"order": list(order), "direct_steps_per_s": round(direct, 3), "ours_steps_per_s": round(ours, 3),
                                     "ratio": round(ours / direct, 4), "work": {side: work_of[side].summary() for side in order}})
            results["wall"] = summary([p["ratio"] for p in results["pairs"]])
            write()
            print(f"pair {pair} ({' then '.join(order)}): direct {direct:.3f} steps/s, ours {ours:.3f} steps/s", flush=True)
        if not args.skip_multi_turn:
            results["frozenlake_multi_turn"] = run_multi_turn(model_dir, max(args.steps // 3, args.warmup + 1), args.warmup,
                                                              Path(tmp) / "frozenlake", args.device, dtype)
            write()
    print(json.dumps({k: v for k, v in results.items() if k != "pairs"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
