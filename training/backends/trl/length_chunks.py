"""Rows of similar length scored together, without the padding they share.

TRL scores a training batch (the log-probabilities of its completions, with gradients) in chunks of
``per_device_train_batch_size`` rows, each padded to the batch's longest row. When an agent's rows
differ in length (a judge's prompt of 1,000 tokens beside solvers' of 200, a multi-turn episode beside a
one-turn one), most of that work is on padding: attention costs the square of the padded length.

``length_chunks`` orders the rows by their real length and cuts them into chunks of rows whose lengths
are close; each chunk is scored with only the columns that some row of it uses (the padding every row of
it shares, on the left of the prompts and the right of the completions, is cut off). The scores are then
put back in the batch's order and width. This is verl's ``use_remove_padding`` / ``use_dynamic_bsz``
for the trl backend, where it is always on: a row's tokens attend to the same tokens as before, so
what is learnt does not change (the positions the model is given shift by the padding cut off, which a
model with rotary position embeddings does not see; TRL's own positions already depend on the longest
row of the batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# A row joins a chunk while its length is at least this share of the chunk's longest row's: a chunk then
# spends at most a quarter of its tokens on padding, and a batch whose lengths span 1:1000 makes at most
# 25 chunks.
SHARE_OF_LONGEST = 0.75


@dataclass(frozen=True)
class Chunk:
    rows: torch.Tensor  # indices into the batch, longest first
    first_column: int  # the columns [first_column, last_column) are the ones some row of the chunk uses
    last_column: int


def length_chunks(attention_mask: torch.Tensor, most_rows: int) -> list[Chunk]:
    """Chunks of at most ``most_rows`` rows covering every row of ``attention_mask`` (rows x columns,
    1 where a row has a token) once, each row with the rows closest to it in length."""
    present = attention_mask.bool()
    columns = attention_mask.size(1)
    lengths = present.sum(dim=1)
    order = torch.argsort(lengths, descending=True, stable=True)
    position = torch.arange(columns, device=attention_mask.device)
    # A row without any token (not made by TRL, but possible) counts as using the last column only.
    first_used = torch.where(present, position, columns).min(dim=1).values.clamp(max=columns - 1)
    last_used = torch.where(present, position, -1).max(dim=1).values.clamp(min=first_used)

    chunks: list[Chunk] = []
    start = 0
    sorted_lengths = lengths[order].tolist()
    while start < len(sorted_lengths):
        end = start + 1
        while end < len(sorted_lengths) and end - start < most_rows and sorted_lengths[end] >= SHARE_OF_LONGEST * sorted_lengths[start]:
            end += 1
        rows = order[start:end]
        chunks.append(Chunk(rows, int(first_used[rows].min()), int(last_used[rows].max()) + 1))
        start = end
    return chunks


def score_in_chunks(score, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, most_rows: int):
    """``score(input_ids, attention_mask, logits_to_keep, rows)`` -> (log-probabilities, entropies or None)
    for the last ``logits_to_keep`` columns, called once per chunk on the chunk's own columns; the
    results for the whole batch, in its row order and ``logits_to_keep`` columns wide (columns cut off
    on the right are zeros: they are padding, masked out of every loss and metric)."""
    rows = input_ids.size(0)
    columns = input_ids.size(1)
    first_scored = columns - logits_to_keep
    logps, entropies, order = [], [], []
    for chunk in length_chunks(attention_mask, most_rows):
        # Keep every scored column up to the chunk's last used one, and at least one scored column.
        first, last = min(chunk.first_column, first_scored), max(chunk.last_column, first_scored + 1)
        chunk_logps, chunk_entropies = score(
            input_ids[chunk.rows, first:last], attention_mask[chunk.rows, first:last], last - first_scored, len(chunk.rows)
        )
        cut = columns - last
        logps.append(torch.nn.functional.pad(chunk_logps, (0, cut)))
        if chunk_entropies is not None:
            entropies.append(torch.nn.functional.pad(chunk_entropies, (0, cut)))
        order.append(chunk.rows)
    back = torch.empty(rows, dtype=torch.long, device=input_ids.device)
    back[torch.cat(order)] = torch.arange(rows, device=input_ids.device)
    return torch.cat(logps)[back], (torch.cat(entropies)[back] if entropies else None)
