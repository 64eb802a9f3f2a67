"""A tiny model taught rLLM's answer formats in a few seconds of supervised training, so that RL
tests of rLLM's own examples start from a model whose answers vary (a randomly initialised
character model never writes ```Up``` or ``<answer>7</answer>``, and every reward would be 0).

The warm-up is deterministic (same pairs, steps, seed, code, library versions and torch threads:
same weights, byte for byte), and it costs tens of CPU seconds where the prompts are long (about
150 CPU-s for the suite's warm-ups). So each warmed model is kept under a digest of all of those,
and copied from there when the same warm-up is asked for again:

- ``tests/fixtures/warm-models/<digest>``: committed, what a fresh checkout (CI) starts from. The
  learning tests then train from the same bytes on every machine (a float kernel of another CPU
  could change the last bits of a warm-up made there, and the recipes are sensitive to those).
  ``make warm-models`` runs every warm-up anew and keeps exactly those the suite asks for.
- ``var/test-cache/warm-models/<digest>``: made by this checkout's runs when no committed one
  matches (a change to the warm-up, the tiny model or the chat rendering, another torch or
  transformers, another thread count). ``rm -r var/test-cache`` drops them.

What a test trains from is what the warm-up makes, either way."""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from training.rendering import encode, render_messages
from training.rollouts.tiny import build_char_tokenizer, build_tiny_model


def warm_tiny_model(
    directory: Path, pairs: list[tuple[list[dict], str]], steps: int = 40, seed: int = 0, context: int | None = None,
    lr: float = 3e-3,
) -> str:
    """The tiny model after ``steps`` of supervised training on (chat messages -> reply) pairs,
    saved to ``directory`` as a checkpoint the trainer loads like any other. ``context`` keeps only
    the last tokens of each prompt (cheaper; the reply's format depends on the prompt's end).

    A long start that every prompt shares (rLLM's FrozenLake system prompt, ~1,100 tokens) is run
    once per step without gradients and its key/value cache reused by every row: the rows then
    cost only their own tokens, and the model still learns to answer with that start in view."""
    digest = _digest(pairs, steps=steps, seed=seed, context=context, lr=lr)
    kept = WARM_MODELS / digest
    committed = COMMITTED_WARM_MODELS / digest
    if committed.is_dir() and os.environ.get("WARM_MODELS_COMMITTED", "1") != "0":
        kept = committed
    elif not kept.is_dir():
        WARM_MODELS.mkdir(parents=True, exist_ok=True)
        made = Path(tempfile.mkdtemp(dir=WARM_MODELS, prefix=".making-"))
        try:
            _warm(made, pairs, steps, seed, context, lr)
            try:
                os.rename(made, kept)  # atomic: another process asking for the same warm-up sees all or nothing
            except OSError:  # that process kept the same model first
                pass
        finally:
            shutil.rmtree(made, ignore_errors=True)
    shutil.copytree(kept, directory, dirs_exist_ok=True)
    return str(directory)


# What a tiny-model training run sets: it trains faster keeping its activations than recomputing them,
# with the same gradients bit for bit.
NO_CHECKPOINTING = {"actor_rollout_ref.model.enable_gradient_checkpointing": False}

_ROOT = Path(__file__).resolve().parents[2]
WARM_MODELS = _ROOT / "var" / "test-cache" / "warm-models"
COMMITTED_WARM_MODELS = _ROOT / "tests" / "fixtures" / "warm-models"
# Whatever the warmed weights depend on, besides the arguments: the modules' code, and the warm-up's
# own functions (this file's docstrings and the other helpers do not change the weights).
_CODE = [_ROOT / "training" / name for name in ("rollouts/tiny.py", "rendering.py")]


def _digest(pairs, **arguments) -> str:
    import transformers

    digest = hashlib.sha256()
    for path in _CODE:
        digest.update(path.read_bytes())
    for function in (_warm, _common_prefix):
        digest.update(inspect.getsource(function).encode())
    digest.update(json.dumps([pairs, arguments, torch.__version__, transformers.__version__, torch.get_num_threads()],
                             sort_keys=True, default=repr).encode())
    return digest.hexdigest()[:24]


def _warm(directory: Path, pairs: list[tuple[list[dict], str]], steps: int, seed: int, context: int | None, lr: float) -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed)
    prompts = [encode(tokenizer, render_messages(tokenizer, messages))[-(context or 0):] for messages, _ in pairs]
    shared = _common_prefix(prompts)[:-1]  # every row keeps at least one prompt token of its own
    prefix = shared if len(shared) >= 64 else []
    rows = []
    for prompt, (_, reply) in zip(prompts, pairs):
        prompt = prompt[len(prefix):]
        target = encode(tokenizer, reply) + [tokenizer.eos_token_id]
        rows.append((prompt + target, [-100] * len(prompt) + target))
    batches = {}  # rows of about one length together, so short rows are not padded to the longest
    for ids, labels in rows:
        batches.setdefault(len(ids) // 64, []).append((ids, labels))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        cache = None
        if prefix:
            with torch.no_grad():
                cache = model(input_ids=torch.tensor([prefix]), use_cache=True).past_key_values
        for batch in batches.values():
            width = max(len(ids) for ids, _ in batch)
            input_ids = torch.tensor([ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids, _ in batch])
            labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
            extra = {}
            if cache is not None:  # the shared start's cache, once per row (the forward pass extends it)
                rows_cache = copy.deepcopy(cache)
                rows_cache.batch_repeat_interleave(len(batch))
                mask = torch.tensor([[1] * (len(prefix) + len(ids)) + [0] * (width - len(ids)) for ids, _ in batch])
                extra = {"past_key_values": rows_cache, "attention_mask": mask}
            loss = model(input_ids=input_ids, labels=labels, **extra).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def answer_logprob(model, prompts: list[list[dict]], answer: str) -> float:
    """Mean log-probability of ``answer`` after each rendered chat prompt: the policy, not a sample."""
    tokenizer = build_char_tokenizer()
    target = encode(tokenizer, answer)
    total = 0.0
    with torch.no_grad():
        for messages in prompts:
            prompt = encode(tokenizer, render_messages(tokenizer, messages))
            logits = model(input_ids=torch.tensor([prompt + target])).logits[0, len(prompt) - 1 : -1]
            total += torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(target)[:, None]).sum().item()
    return total / len(prompts)


def _common_prefix(sequences: list[list[int]]) -> list[int]:
    first = sequences[0] if sequences else []
    length = len(first)
    for other in sequences[1:]:
        length = next((i for i, (a, b) in enumerate(zip(first[:length], other)) if a != b), min(length, len(other)))
    return first[:length]


def sampled_accuracy(model, prompts: list[list[dict]], is_right, samples: int = 64, max_new_tokens: int = 12, seed: int = 0,
                     temperature: float = 1.0) -> float:
    """The share of ``samples`` replies per prompt, sampled from the policy at ``temperature`` (give
    the recipe's: what training samples with), that ``is_right(reply)`` accepts: what the reward
    measures. The log-probability of one exact string at temperature 1 can fall while the policy at
    the recipe's temperature answers right more often (its tail grows as its mode sharpens)."""
    tokenizer = build_char_tokenizer()
    generator = torch.Generator().manual_seed(seed)
    right = 0
    with torch.no_grad():
        for messages in prompts:
            prompt = encode(tokenizer, render_messages(tokenizer, messages))
            rows = torch.tensor([prompt] * samples)
            for _ in range(max_new_tokens):
                probs = torch.softmax(model(input_ids=rows).logits[:, -1].float() / temperature, -1)
                rows = torch.cat([rows, torch.multinomial(probs, 1, generator=generator)], 1)
            for row in rows[:, len(prompt):].tolist():
                if tokenizer.eos_token_id in row:
                    row = row[: row.index(tokenizer.eos_token_id)]
                right += bool(is_right(tokenizer.decode(row)))
    return right / (samples * len(prompts))
