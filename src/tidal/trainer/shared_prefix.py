"""Micro-batches whose rows share their prompts: the trainer's side of model/shared_prefix.py.

A batch's rows are grouped by prompt (same tokens, and for MoE the same recorded experts at
them); each micro-batch holds whole groups where it can (a group larger than the micro-batch is
cut), longest groups first so rows of similar length pad together. A micro-batch becomes a
``SharedPrefix`` (each distinct prompt minus its last token, once) and a suffix view of the
rows: columns prompt_length - 1 .. length - 1 of each row, left-aligned. Every trained token sits
in the suffix (completion token j is predicted at position prompt_length + j - 1), so the loss,
the mismatch metrics and router replay run on the view unchanged.

Where sharing does not apply the batch is left to the plain path (``micro_batches`` returns
None): a row whose prompt has fewer than 2 tokens, a row without completion tokens, or MoE rows with positions the engine did not
record (the trainer fills those from its own router in a forward of the full rows).
"""

from __future__ import annotations

import torch

from tidal.model.shared_prefix import SharedPrefix
from tidal.trainer.grpo import NO_REPLAY, PER_ROW, TrainBatch


def micro_batches(tb: TrainBatch, size: int, pad_id: int,
                  replay: bool) -> list[tuple[TrainBatch, SharedPrefix]] | None:
    """The batch as shared-prefix micro-batches of at most ``size`` rows, or None where sharing
    does not apply (see the module docs). ``replay``: route through recorded experts (MoE)."""
    if tb.num_rows == 0 or int(tb.prompt_lengths.min()) < 2:
        return None
    if bool((tb.lengths < tb.prompt_lengths).any()):  # a row with no completion: no suffix
        return None
    if replay and tb.experts is not None and _unrecorded(tb):
        return None
    return [shared_view(tb, rows, pad_id, replay) for rows in _pack(prompt_groups(tb, replay), tb, size)]


def _unrecorded(tb: TrainBatch) -> bool:
    """Whether any real position lacks recorded experts."""
    real = torch.arange(tb.input_ids.shape[1]) < tb.lengths.unsqueeze(1)
    return bool(((tb.experts == NO_REPLAY).any(-1).any(-1) & real).any())


def prompt_groups(tb: TrainBatch, replay: bool) -> list[list[int]]:
    """Row indices grouped by equal prompt (and, with replay, equal prompt experts), in order of
    first appearance."""
    groups: dict[tuple, list[int]] = {}
    for b in range(tb.num_rows):
        groups.setdefault(prefix_key(tb, b, replay), []).append(b)
    return list(groups.values())


def prefix_key(tb: TrainBatch, b: int, replay: bool) -> tuple:
    """What row ``b``'s prefix (its prompt minus the last token) is: its tokens and, with
    replay, the experts recorded at them; rows with equal keys share one prefix."""
    p = int(tb.prompt_lengths[b]) - 1
    key: tuple = (tuple(tb.input_ids[b, :p].tolist()),)
    if replay and tb.experts is not None:
        key += (tb.experts[b, :p].numpy().tobytes(),)
    return key


def _pack(groups: list[list[int]], tb: TrainBatch, size: int) -> list[list[int]]:
    """Micro-batches of <= size rows: groups longest first (their longest row), each group's rows
    longest first, whole groups together while they fit, a larger group cut into pieces."""
    lengths = tb.lengths.tolist()
    pieces = []
    for rows in sorted(groups, key=lambda rows: -max(lengths[r] for r in rows)):
        rows = sorted(rows, key=lambda r: -lengths[r])
        pieces += [rows[i:i + size] for i in range(0, len(rows), size)]
    batches: list[list[int]] = []
    for piece in pieces:
        if batches and len(batches[-1]) + len(piece) <= size:
            batches[-1] += piece
        else:
            batches.append(list(piece))
    return batches


def shared_view(tb: TrainBatch, rows: list[int], pad_id: int,
                replay: bool) -> tuple[TrainBatch, SharedPrefix]:
    """Rows ``rows`` of ``tb`` as (suffix view, their prefixes): see the module docs."""
    index = torch.tensor(rows, dtype=torch.long)
    sub = tb.select(index)
    starts = sub.prompt_lengths - 1  # [B]
    keys = [prefix_key(sub, b, replay) for b in range(len(rows))]
    first: dict[tuple, int] = {}
    for b, key in enumerate(keys):
        first.setdefault(key, b)
    owners = list(first.values())  # the row whose prompt stands for each prefix
    row = torch.tensor([owners.index(first[k]) for k in keys], dtype=torch.long)
    lengths = starts[owners]
    tp = int(lengths.max())
    ids = torch.full((len(owners), tp), pad_id, dtype=torch.long)
    for g, b in enumerate(owners):
        ids[g, :int(lengths[g])] = sub.input_ids[b, :int(lengths[g])]
    prefix_replay = None
    if replay and sub.experts is not None:
        prefix_replay = sub.experts[owners, :tp].clone()
        for g in range(len(owners)):
            prefix_replay[g, int(lengths[g]):] = 0  # padding: any valid expert
    return _suffix(sub, starts, pad_id), SharedPrefix(ids, lengths, row, prefix_replay)


def _suffix(sub: TrainBatch, starts: torch.Tensor, pad_id: int) -> TrainBatch:
    """Each row's columns starts[b] .. lengths[b] - 1, left-aligned and padded (pad_id, mask 0,
    logprob 0, version -1, expert 0) to the longest."""
    suffix_len = sub.lengths - starts
    ts = int(suffix_len.max())
    cols = starts.unsqueeze(1) + torch.arange(ts)  # [B, Ts]
    real = torch.arange(ts) < suffix_len.unsqueeze(1)
    cols = torch.where(real, cols, 0)
    fill = {"input_ids": pad_id, "targets": pad_id, "loss_mask": 0.0, "old_logprobs": 0.0,
            "versions": -1, "experts": 0}
    out = {}
    for name, t in vars(sub).items():
        if name in PER_ROW or t is None:
            out[name] = t
            continue
        picked = t.gather(1, cols.view(*cols.shape, *([1] * (t.dim() - 2))).expand(-1, -1, *t.shape[2:]))
        mask = real.view(*real.shape, *([1] * (t.dim() - 2)))
        out[name] = torch.where(mask, picked, torch.as_tensor(fill[name], dtype=t.dtype))
    out["lengths"] = suffix_len
    out["prompt_lengths"] = torch.ones_like(starts)  # the view's prompt: its first (last prompt) token
    return TrainBatch(**out)
