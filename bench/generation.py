"""Rollout generation: our batched decoding loop (training/rollouts/generation.py, ``HFBatchGenerator``)
against transformers' continuous batching (``init_continuous_batching`` / ContinuousBatchingManager,
and ``generate_batch``, which drives the same manager), on the CPU with the tiny model.

Two workloads, each with sampling and log-probabilities returned (the trainer needs them):

- ``single_turn``: 64 prompts like the copy task (4 tokens), 8 new tokens each, one batch.
- ``multi_turn``: 32 episodes of 7 turns like FrozenLake; each turn's prompt is the conversation
  so far (grows by 4 tokens a turn) and asks for 1 token. Continuous batching keeps one manager
  running and takes each turn's requests as they come (as our asyncio episodes ask).

A third comparison runs TRL's own switch for single-turn: ``GRPOTrainer`` on the copy task (8
prompts x 8 generations x 4 tokens, the tiny model) with its default ``model.generate`` and with
``use_transformers_continuous_batching=True`` (which calls the same ``generate_batch``), steps per
second over the same number of optimizer steps.

Both clocks are recorded: wall seconds and the process's CPU seconds (one torch thread), so a
busy shared machine shows in the gap between them; the load average is written beside them.

    python bench/generation.py [--repeats 3]

Results: bench/results/generation.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SINGLE_PROMPTS, SINGLE_TOKENS = 64, 8
EPISODES, TURNS = 32, 7


def build():
    import torch

    from training.rollouts.tiny import build_char_tokenizer, build_tiny_model

    torch.set_num_threads(1)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer).eval()
    return model, tokenizer


def prompts(tokenizer, count: int) -> list[list[int]]:
    return [tokenizer(f"{i % 4}{(i // 4) % 4}>", add_special_tokens=False)["input_ids"] for i in range(count)]


def ours_single(model, tokenizer) -> int:
    from training.rollouts.generation import HFBatchGenerator

    generator = HFBatchGenerator(model, tokenizer, seed=0)
    outputs = generator.generate_batch(prompts(tokenizer, SINGLE_PROMPTS), [SINGLE_TOKENS] * SINGLE_PROMPTS)
    return sum(len(o.completion_ids) for o in outputs)


def ours_multi(model, tokenizer) -> int:
    from training.rollouts.generation import HFBatchGenerator

    generator = HFBatchGenerator(model, tokenizer, seed=0)
    histories = prompts(tokenizer, EPISODES)
    tokens = 0
    for _turn in range(TURNS):
        outputs = generator.generate_batch(histories, [1] * EPISODES)
        tokens += sum(len(o.completion_ids) for o in outputs)
        histories = [h + o.completion_ids + h[:3] for h, o in zip(histories, outputs)]  # reply + next observation
    return tokens


def _cb_configs(max_new_tokens: int):
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    generation = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=True, temperature=1.0, top_p=1.0)
    return generation, ContinuousBatchingConfig(return_logprobs=True, seed=0)


def cb_single(model, tokenizer) -> int:
    generation, cb = _cb_configs(SINGLE_TOKENS)
    results = model.generate_batch(prompts(tokenizer, SINGLE_PROMPTS), generation_config=generation,
                                   continuous_batching_config=cb, progress_bar=False)
    return sum(len(r.generated_tokens) for r in results.values())


def cb_multi(model, tokenizer) -> int:
    generation, cb = _cb_configs(1)
    manager = model.init_continuous_batching(generation_config=generation, continuous_batching_config=cb)
    manager.start()
    histories = prompts(tokenizer, EPISODES)
    tokens = 0
    try:
        for turn in range(TURNS):
            ids = [manager.add_request(h, request_id=f"{turn}-{i}", max_new_tokens=1) for i, h in enumerate(histories)]
            replies = {}
            while len(replies) < len(ids):
                result = manager.get_result(timeout=60)
                if result is None:
                    raise RuntimeError("continuous batching returned no result within 60 s")
                replies[result.request_id] = result.generated_tokens
            tokens += sum(len(replies[i]) for i in ids)
            histories = [h + replies[i] + h[:3] for h, i in zip(histories, ids)]
    finally:
        manager.stop(block=True)
    return tokens


def trl_steps(continuous_batching: bool, steps: int = 6, warmup: int = 1) -> dict:
    """GRPOTrainer called directly, generating with ``model.generate`` or continuous batching."""
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from examples.copy_task import make_copy_tasks
    from training.rollouts.tiny import save_tiny_model

    stamps: dict[int, tuple[float, float]] = {}

    class Stamp(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            stamps[state.global_step] = (time.perf_counter(), time.process_time())

    def char_accuracy(completions, ground_truth, **kwargs):
        return [sum(a == b for a, b in zip(c, t)) / len(t) for c, t in zip(completions, ground_truth)]

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model(Path(tmp) / "model", seed=0)
        torch.manual_seed(0)
        args = GRPOConfig(
            output_dir=str(Path(tmp) / "out"), max_steps=steps, per_device_train_batch_size=64, num_generations=8,
            max_completion_length=4, learning_rate=1e-3, logging_steps=1, save_strategy="no", seed=0,
            report_to="none", use_cpu=True, disable_tqdm=True, remove_unused_columns=False, beta=0.0,
            use_transformers_continuous_batching=continuous_batching,
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=char_accuracy, args=args,
            train_dataset=Dataset.from_list(make_copy_tasks(256, seed=0)),
            processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[Stamp()],
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    (wall_end, cpu_end), (wall_start, cpu_start) = stamps[steps], stamps[warmup]
    return {"steps_timed": steps - warmup, "steps_per_wall_s": round((steps - warmup) / (wall_end - wall_start), 3),
            "steps_per_cpu_s": round((steps - warmup) / (cpu_end - cpu_start), 3)}


def measure(fn, model, tokenizer, repeats: int) -> dict:
    fn(model, tokenizer)  # warm-up: first-call allocations and (for continuous batching) cache set-up
    walls, cpus, tokens = [], [], 0
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        tokens = fn(model, tokenizer)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {
        "tokens": tokens,
        "wall_s": [round(w, 3) for w in walls],
        "cpu_s": [round(c, 3) for c in cpus],
        "tokens_per_wall_s": round(tokens / statistics.median(walls), 1),
        "tokens_per_cpu_s": round(tokens / statistics.median(cpus), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model, tokenizer = build()
    results: dict = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch_threads": 1},
        "model": "tiny-char (2 layers, hidden 64), float32, CPU",
        "load_avg_before": round(os.getloadavg()[0], 2),
    }
    for name, fn in (("ours_single_turn", ours_single), ("continuous_batching_single_turn", cb_single),
                     ("ours_multi_turn", ours_multi), ("continuous_batching_multi_turn", cb_multi)):
        try:
            results[name] = measure(fn, model, tokenizer, args.repeats)
        except Exception as exc:  # a failing engine is a result too: recorded, not hidden
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(name, json.dumps(results[name]), flush=True)
    for name, flag in (("trl_grpo_generate", False), ("trl_grpo_continuous_batching", True)):
        try:
            results[name] = trl_steps(flag)
        except Exception as exc:
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(name, json.dumps(results[name]), flush=True)
    results["load_avg_after"] = round(os.getloadavg()[0], 2)
    results["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = ROOT / "bench" / "results" / "generation.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
