"""LoRA against full fine-tuning on the ``trl`` backend: peak memory and steps per second.

Both get the same saved Qwen2-shaped model (random weights, the character tokenizer: bench/
gpu_overhead.py's ``save_model``), the same prompts, seed and GRPO settings; they differ only in
``actor_rollout_ref.model.lora_rank`` (0 against ``--rank``). Each run is a process of its own, so
its peak resident memory (``ru_maxrss``) is its own; on CUDA, torch's peak allocated memory too.
They run in pairs, the order alternating; each pair's ratios (LoRA / full) are recorded and
summarised by their median. Steps per second are timed after ``--warmup`` steps. The machine, its
load average before and after, and the settings are written with the results.

    python bench/lora.py [--pairs 3] [--steps 6] [--warmup 2]           # CPU, a 4-layer 512-wide model
    python bench/lora.py --device cuda --shape qwen2-0.5b --pairs 3     # a GPU, Qwen2-0.5B's shape, bf16

Results: bench/results/lora.json (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_overhead import QWEN2_05B, save_model  # noqa: E402  (bench/ is this script's directory)

SEED = 42
SHAPES = {
    "qwen2-0.5b": QWEN2_05B,
    "cpu-small": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8,
                  "num_key_value_heads": 2},
}


class _Stamps:
    """A metric sink that keeps when each step was reported."""

    def __init__(self, device: str) -> None:
        self.device, self.times = device, {}

    def log_metrics(self, step, metrics):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
        self.times[step] = time.perf_counter()

    def log_episodes(self, step, episodes):
        pass

    def close(self):
        pass


def child(args: argparse.Namespace) -> None:
    """One training run; prints its figures as one JSON line."""
    import torch

    from training import AgentTrainer

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    stamps = _Stamps(args.device)
    rows = [{"prompt": f"{i}=", "ground_truth": "a"} for i in range(args.prompts)]
    config = {
        "actor_rollout_ref.model.path": args.model, "actor_rollout_ref.model.dtype": args.dtype,
        "actor_rollout_ref.model.lora_rank": args.rank if args.child == "lora" else 0,
        "actor_rollout_ref.model.lora_alpha": 2 * args.rank,
        "actor_rollout_ref.actor.optim.lr": 1e-5 if args.child == "full" else 1e-4,
        "actor_rollout_ref.rollout.n": args.generations, "data.train_batch_size": args.prompts,
        "data.max_response_length": args.tokens, "trainer.total_training_steps": args.steps, "trainer.logger": [],
        "trainer.seed": SEED, "trainer.resume_mode": "disable", "trainer.device": args.device,
        "trainer.val_before_train": False, "trainer.save_freq": -1, "trainer.cpu_threads": args.threads,
        "trainer.system_metrics_interval": 0,
    }
    with tempfile.TemporaryDirectory() as run_path:
        AgentTrainer(train_dataset=rows, reward_func=lambda task, response: float(response.startswith("a")),
                     backend="trl", run_path=run_path, sinks=[stamps], config=config).train()
    timed = [stamps.times[s] for s in sorted(stamps.times) if s >= args.warmup]
    figures = {
        "steps_per_s": (len(timed) - 1) / (timed[-1] - timed[0]),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if args.device == "cuda":
        figures["max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print("FIGURES " + json.dumps(figures))


def run_one(args: argparse.Namespace, mode: str, model: Path) -> dict:
    command = [sys.executable, __file__, "--child", mode, "--model", str(model)] + [
        f"--{name}={getattr(args, name)}" for name in ("device", "dtype", "rank", "steps", "warmup", "prompts",
                                                      "generations", "tokens", "threads")]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (os.environ.get("PYTHONPATH"), str(ROOT))))})
    lines = [line for line in done.stdout.splitlines() if line.startswith("FIGURES ")]
    if done.returncode or not lines:
        raise SystemExit(f"the {mode} run failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("FIGURES "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None, help="default: cpu-small on CPU, qwen2-0.5b on CUDA")
    parser.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "lora.json"))
    parser.add_argument("--child", choices=("full", "lora"), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.child:
        child(args)
        return 0
    import torch
    from safetensors.torch import load_file

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here; use --device cpu")
        return 1
    shape_name = args.shape or ("qwen2-0.5b" if args.device == "cuda" else "cpu-small")
    results = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "load_average_before": os.getloadavg(), "torch": torch.__version__,
        "shape": {"name": shape_name, **SHAPES[shape_name]}, "settings": {k: v for k, v in vars(args).items() if k not in ("child", "model", "out")},
        "pairs": [],
    }
    with tempfile.TemporaryDirectory() as scratch:
        model = save_model(Path(scratch) / "model", SHAPES[shape_name], args.dtype)
        results["parameters"] = sum(t.numel() for t in load_file(str(model / "model.safetensors")).values())
        for pair in range(args.pairs):
            order = ("full", "lora") if pair % 2 == 0 else ("lora", "full")
            figures = {mode: run_one(args, mode, model) for mode in order}
            ratios = {name: figures["lora"][name] / figures["full"][name] for name in figures["full"]}
            results["pairs"].append({"order": list(order), **figures, "lora_over_full": ratios})
            print(f"pair {pair + 1}: {json.dumps(figures)}", flush=True)
            write(results, args.out)  # after each pair: a run cut short keeps what it measured
    return write(results, args.out)


def write(results: dict, out: str) -> int:
    """Summarise the pairs so far (medians of each side and of the ratios) and write the results file."""
    results["load_average_after"] = os.getloadavg()
    results["median_lora_over_full"] = {
        name: statistics.median(p["lora_over_full"][name] for p in results["pairs"]) for name in results["pairs"][0]["lora_over_full"]
    }
    for mode in ("full", "lora"):
        results[f"median_{mode}"] = {name: statistics.median(p[mode][name] for p in results["pairs"]) for name in results["pairs"][0][mode]}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: results[k] for k in ("median_full", "median_lora", "median_lora_over_full")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
