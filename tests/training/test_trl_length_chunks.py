"""The trl backend scores a batch's rows in chunks of similar length without their shared padding
(training/backends/trl/length_chunks.py): the log-probabilities, entropies and gradients are TRL's own."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from training.backends.trl.length_chunks import length_chunks, score_in_chunks
from training.rollouts.tiny import build_char_tokenizer, build_tiny_model

pytest.importorskip("trl")
from trl import GRPOTrainer  # noqa: E402
from trl.trainer.utils import add_fused_lm_head  # noqa: E402


def padded_batch(prompts: list[int], completions: list[int], seed: int = 0):
    """Rows as TRL builds them: prompts padded on the left, completions on the right."""
    generator = torch.Generator().manual_seed(seed)
    width_prompt, width_completion = max(prompts), max(completions)
    ids = torch.zeros(len(prompts), width_prompt + width_completion, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
        used = slice(width_prompt - prompt, width_prompt + completion)
        ids[row, used] = torch.randint(5, 90, (prompt + completion,), generator=generator)
        mask[row, used] = 1
    return ids, mask, width_completion


def test_chunks_cover_each_row_once_with_rows_of_close_length():
    _, mask, _ = padded_batch([900, 40, 880, 35, 300, 870, 38], [20, 5, 12, 20, 1, 3, 9])
    chunks = length_chunks(mask, most_rows=2)
    assert sorted(torch.cat([c.rows for c in chunks]).tolist()) == list(range(7))
    assert all(len(c.rows) <= 2 for c in chunks)
    lengths = mask.sum(1)
    for chunk in chunks:
        assert lengths[chunk.rows].min() >= 0.75 * lengths[chunk.rows].max()
        used = mask[chunk.rows].nonzero()[:, 1]
        assert (chunk.first_column, chunk.last_column) == (int(used.min()), int(used.max()) + 1)
    # the long rows are scored apart from the short ones
    assert [sorted(c.rows.tolist()) for c in chunks] == [[0, 2], [5], [4], [3, 6], [1]]


@pytest.mark.parametrize("compute_entropy", [False, True])
def test_chunked_scores_and_gradients_equal_trls_whole_batch(compute_entropy):
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=3)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    trainer = types.SimpleNamespace(accelerator=types.SimpleNamespace(autocast=contextlib.nullcontext))
    trl_scores = GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__.__get__(trainer)  # without TRL's profiling wrapper

    ids, mask, keep = padded_batch([300, 25, 290, 30, 28, 120], [24, 7, 3, 24, 1, 16], seed=1)
    completion_mask = mask[:, -keep:].float()

    def scored(chunked: bool):
        model.zero_grad()
        if chunked:
            logps, entropies = score_in_chunks(
                lambda i, m, k, rows: trl_scores(model, i, m, k, rows, compute_entropy)[:2], ids, mask, keep, most_rows=6
            )
        else:
            logps, entropies, _ = trl_scores(model, ids, mask, keep, 6, compute_entropy)
        (logps * completion_mask).sum().backward()
        gradients = [p.grad.clone() for p in model.parameters()]
        return logps.detach(), entropies, gradients

    whole, whole_entropies, whole_gradients = scored(chunked=False)
    chunked, chunked_entropies, chunked_gradients = scored(chunked=True)
    assert chunked.shape == whole.shape == (6, keep)
    torch.testing.assert_close(chunked * completion_mask, whole * completion_mask, rtol=1e-4, atol=1e-5)
    if compute_entropy:
        torch.testing.assert_close(chunked_entropies.detach() * completion_mask, whole_entropies.detach() * completion_mask,
                                   rtol=1e-4, atol=1e-5)
    else:
        assert chunked_entropies is whole_entropies is None
    for chunked_gradient, whole_gradient in zip(chunked_gradients, whole_gradients):
        torch.testing.assert_close(chunked_gradient, whole_gradient, rtol=1e-3, atol=1e-5)
    # and the rows really were scored apart: the long ones and the short ones in chunks of their own
    assert len(length_chunks(mask, 6)) > 1
