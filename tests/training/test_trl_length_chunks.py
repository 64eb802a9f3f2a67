"""The trl backend scores a batch's rows in chunks of similar length without their shared padding
(training/backends/trl/length_chunks.py): the log-probabilities, entropies and gradients are TRL's own."""

from __future__ import annotations

import contextlib
import itertools
import types

import pytest
import torch

from training.backends.trl.length_chunks import TOKENS_PER_CHUNK, length_chunks, score_in_chunks
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


def chunk_cost(mask: torch.Tensor, chunk_rows: list[list[int]]) -> int:
    """What length_chunks minimises: each chunk's rows times the columns they use, plus TOKENS_PER_CHUNK."""
    cost = 0
    for rows in chunk_rows:
        used = mask[rows].nonzero()[:, 1]
        cost += len(rows) * (int(used.max()) - int(used.min()) + 1) + TOKENS_PER_CHUNK
    return cost


def test_chunks_cover_each_row_once_and_cost_least():
    _, mask, _ = padded_batch([900, 40, 880, 35, 300, 870, 38, 600], [20, 5, 12, 20, 1, 3, 9, 40])
    chunks = length_chunks(mask, most_rows=3)
    assert sorted(torch.cat([c.rows for c in chunks]).tolist()) == list(range(8))
    assert all(len(c.rows) <= 3 for c in chunks)
    for chunk in chunks:
        used = mask[chunk.rows].nonzero()[:, 1]
        assert (chunk.first_column, chunk.last_column) == (int(used.min()), int(used.max()) + 1)
    # every other way of cutting the rows (longest first) into chunks of at most 3 costs as much or more
    order = torch.argsort(mask.sum(1), descending=True, stable=True).tolist()
    chosen = chunk_cost(mask, [c.rows.tolist() for c in chunks])
    for cuts in itertools.product([False, True], repeat=len(order) - 1):
        pieces, piece = [], [order[0]]
        for row, cut in zip(order[1:], cuts):
            if cut:
                pieces.append(piece)
                piece = []
            piece.append(row)
        pieces.append(piece)
        if all(len(piece) <= 3 for piece in pieces):
            assert chosen <= chunk_cost(mask, pieces)
    # the long rows are scored apart from the short ones
    assert [sorted(c.rows.tolist()) for c in chunks] == [[0, 2, 5], [4, 7], [1, 3, 6]]


def test_rows_of_about_one_length_stay_one_chunk():
    """A FrozenLake step: 32 rows, most of 28 tokens, a few that ended early. Cutting them off would save
    fewer padded tokens than another forward and backward call costs."""
    _, mask, _ = padded_batch([12] * 32, [16] * 29 + [4, 8, 1])
    assert [len(c.rows) for c in length_chunks(mask, most_rows=32)] == [32]
    # TRL's own chunk size still bounds a chunk
    assert [len(c.rows) for c in length_chunks(mask, most_rows=8)] == [8, 8, 8, 8]


def test_a_judge_beside_its_solvers_is_two_chunks():
    _, mask, _ = padded_batch([1000] * 16 + [180] * 32, [40] * 16 + [24] * 32)
    chunks = length_chunks(mask, most_rows=48)
    assert [sorted(c.rows.tolist()) for c in chunks] == [list(range(16)), list(range(16, 48))]


@pytest.mark.parametrize("compute_entropy", [False, True])
def test_chunked_scores_and_gradients_equal_trls_whole_batch(compute_entropy):
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=3)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    trainer = types.SimpleNamespace(accelerator=types.SimpleNamespace(autocast=contextlib.nullcontext))
    trl_scores = GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__.__get__(trainer)  # without TRL's profiling wrapper

    ids, mask, keep = padded_batch([1200, 25, 1190, 30, 28, 400], [24, 7, 3, 24, 1, 16], seed=1)
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
