"""Sending each token to its top-k experts and adding the weighted outputs back, shared by the
module forward (qwen3.Experts) and the deterministic forward (tidal.numerics.forward)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def dispatch_to_experts(
    x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, num_experts: int,
    expert_mlp: Callable[[int, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """x [N, H], ids/weights [N, k] -> [N, H]. Assignments are sorted by expert so each expert
    runs ``expert_mlp(e, rows)`` once over a contiguous block (the loop is over experts, never
    tokens); a token's k contributions are added in expert order (index_add_ walks the index in
    order), whatever else is in the batch."""
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    xs = x.index_select(0, token)
    outs, start = [], 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        outs.append(expert_mlp(e, xs[start : start + n]))
        start += n
    if not outs:  # no tokens at all
        return torch.zeros_like(x)
    y = torch.cat(outs) * weights.reshape(-1).index_select(0, order).unsqueeze(1)
    return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))
