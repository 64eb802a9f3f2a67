"""Rows of similar length scored together, without the padding they share.

TRL scores a training batch (the log-probabilities of its completions, with gradients) in chunks of
``per_device_train_batch_size`` rows, each padded to the batch's longest row. When an agent's rows
differ in length (a judge's prompt of 1,000 tokens beside solvers' of 200, a multi-turn episode beside a
one-turn one), most of that work is on padding: attention costs the square of the padded length.

``length_chunks`` orders the rows by their real length and cuts them into chunks of rows whose lengths
are close, cutting where that saves more padding than another chunk costs. Each chunk is scored with
only the columns that some row of it uses (the padding every row of it shares, on the left of the
prompts and the right of the completions, is cut off). The scores are then
put back in the batch's order and width. This is verl's ``use_remove_padding`` / ``use_dynamic_bsz``
for the trl backend, where it is always on: a row's tokens attend to the same tokens as before, so
what is learnt does not change (the positions the model is given shift by the padding cut off, which a
model with rotary position embeddings does not see; TRL's own positions already depend on the longest
row of the batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# What one more chunk costs beyond its tokens, counted in tokens: each chunk is a forward and a backward
# call of its own. On the tiny model on one CPU thread a chunk's calls cost 4.5 ms before their tokens,
# about 200 of its tokens (bench: a 1x4 chunk against 32x28); a real model on a GPU launches a kernel per
# layer and operation, a larger share of its time. Erring towards fewer chunks costs at most this many
# padded tokens per chunk not made.
TOKENS_PER_CHUNK = 1024


@dataclass(frozen=True)
class Chunk:
    rows: torch.Tensor  # indices into the batch, longest first
    first_column: int  # the columns [first_column, last_column) are the ones some row of the chunk uses
    last_column: int


def length_chunks(attention_mask: torch.Tensor, most_rows: int) -> list[Chunk]:
    """Chunks of at most ``most_rows`` rows covering every row of ``attention_mask`` (rows x columns,
    1 where a row has a token) once, each row with the rows closest to it in length.

    The rows, longest first, are cut where it costs least: a chunk costs its rows times the columns
    they use, plus ``TOKENS_PER_CHUNK``. A batch whose rows are all of about one length stays one chunk;
    a judge's 1,000-token rows beside solvers' 200-token rows make two."""
    present = attention_mask.bool()
    columns = attention_mask.size(1)
    lengths = present.sum(dim=1)
    order = torch.argsort(lengths, descending=True, stable=True)
    position = torch.arange(columns, device=attention_mask.device)
    # A row without any token (not made by TRL, but possible) counts as using the last column only.
    first_used = torch.where(present, position, columns).min(dim=1).values.clamp(max=columns - 1)
    last_used = torch.where(present, position, -1).max(dim=1).values.clamp(min=first_used)

    firsts, lasts = first_used[order].tolist(), last_used[order].tolist()
    rows = len(firsts)
    # cheapest[end]: the least cost of the first `end` rows (in order); start[end]: where its last chunk starts
    cheapest = [0] + [float("inf")] * rows
    start = [0] * (rows + 1)
    for end in range(1, rows + 1):
        first, last = columns, -1
        for begin in range(end - 1, max(end - most_rows, 0) - 1, -1):
            first, last = min(first, firsts[begin]), max(last, lasts[begin])
            cost = cheapest[begin] + (end - begin) * (last - first + 1) + TOKENS_PER_CHUNK
            if cost < cheapest[end]:
                cheapest[end], start[end] = cost, begin
    chunks: list[Chunk] = []
    end = rows
    while end > 0:
        begin = start[end]
        chunk_rows = order[begin:end]
        chunks.append(Chunk(chunk_rows, int(first_used[chunk_rows].min()), int(last_used[chunk_rows].max()) + 1))
        end = begin
    return chunks[::-1]


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
