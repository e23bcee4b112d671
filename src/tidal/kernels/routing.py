"""Sorting (token, expert) assignments by expert, for both MoE paths, with no host sync.

``torch.bincount`` reads the largest id back to the host before it counts (a GPU sync per MoE
layer, which stalls a decode loop that otherwise queues work ahead); counting with
``scatter_add_`` into a fixed-size tensor does not.
"""

from __future__ import annotations

import torch


def sort_by_expert(ids: torch.Tensor, num_experts: int):
    """Flat expert ids [A] -> (order [A]: assignments sorted by expert, stable; sorted_ids [A];
    counts [E]; rank [A]: each sorted assignment's index within its expert's run)."""
    order = torch.argsort(ids, stable=True)
    sorted_ids = ids[order]
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device)
    counts.scatter_add_(0, ids, torch.ones_like(ids))
    rank = torch.arange(ids.numel(), device=ids.device) - (counts.cumsum(0) - counts)[sorted_ids]
    return order, sorted_ids, counts, rank


def align_by_expert(expert_ids: torch.Tensor, num_experts: int, block_m: int):
    """Flat expert ids [A] -> (rows [blocks * block_m], block_expert [blocks]) for the grouped
    matmul: assignments sorted by expert, each expert's run padded to whole tiles; rows holds
    assignment ids (-1 = padding), block_expert each tile's expert (-1 = past the end). The tile
    count is the static bound ceil(A / block_m) + E."""
    ids = expert_ids.reshape(-1)
    order, sorted_ids, counts, rank = sort_by_expert(ids, num_experts)
    blocks = -(-ids.numel() // block_m) + num_experts
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    rows = torch.full((blocks * block_m,), -1, dtype=torch.long, device=ids.device)
    rows[(padded_end - padded)[sorted_ids] + rank] = order
    starts = torch.arange(blocks, device=ids.device) * block_m
    block_expert = torch.searchsorted(padded_end, starts, right=True)
    return rows, torch.where(block_expert < num_experts, block_expert, -1)
