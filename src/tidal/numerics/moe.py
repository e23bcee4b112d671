"""Sparse MoE on an op set's linears: routing, the per-expert route, and a second route for a
few tokens (a decode step) that gives the same bits in fewer calls.

Per-expert route (``dispatch_to_experts``, also the module forward's): assignments sorted by
expert, each expert's MLP once over a contiguous block, a token's k contributions added back in
expert order (index_add_ walks the index in order), whatever else is in the batch.

Few-token route: oneDNN costs ~10 us per call whatever its size, and the per-expert route makes
1 + 2 x (active experts) calls per layer (~15 at 8 decode rows), most of a small decode step. For
at most ``FEW_TOKENS`` tokens the router and every expert's gate/up run as one matmul over their
stacked matrices, and each (token, expert) pair's down projection as one matmul over all experts'
down matrices side by side, its input zero outside its expert's block. That gives the per-expert
route's bits only where a column of a stacked matmul has the bits of the same column of its own
matrix's matmul and zero blocks add exact zeros: a fact of a kernel, which the start-up probe
(probe.py, ``moe_stacked``) checks before the engine's weights are built with stacked matrices.
It computes every expert's gate/up (E / k times the work), so it pays only for few tokens; the
trainer always takes the per-expert route.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

FEW_TOKENS = 64
"""Tokens up to which the stacked route runs. Measured on tiny-moe (8 experts, top-2), engine
decode steps, stacked vs per-expert: 0.7x the time at 4 rows, 0.95x at 32, even at 64."""


def dispatch_to_experts(
    x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, num_experts: int,
    expert_mlp: Callable[[int, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """x [N, H], ids/weights [N, k] -> [N, H]: ``expert_mlp(e, rows)`` once per active expert
    over its rows (the loop is over experts, never tokens), outputs weighted and added back."""
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


def route(logits: torch.Tensor, top_k: int, norm_topk_prob: bool, replay: torch.Tensor | None,
          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router logits [N, E] -> (ids [N, k], gate weights [N, k] in ``dtype``, the router's own
    top-k [N, k]): softmax in fp32, top-k or the replayed ids (gates are this router's
    probabilities at them), renormalised if ``norm_topk_prob``; qwen3.SparseMoE's math."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, own = torch.topk(probs, top_k, dim=-1)
    ids = own
    if replay is not None:
        ids = replay
        weights = probs.gather(-1, ids)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights.to(dtype), own


def sparse_moe(layer, h: torch.Tensor, top_k: int, norm_topk_prob: bool,
               replay: torch.Tensor | None, silu_mul: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """h [B, T, H] -> (out [B, T, H], the router's own top-k [B*T, k]); replay [B*T, k] picks the
    experts. ``layer``: model/fused.py's layer (router, experts_gate_up/down linears, and the
    stacked router_gate_up / down_blocks or None); ``silu_mul(gate, up)``: the op set's."""
    flat = h.reshape(-1, h.shape[-1])
    num_experts = len(layer.experts_down)
    stacked = None
    if layer.router_gate_up is not None and flat.shape[0] <= FEW_TOKENS:
        stacked = layer.router_gate_up(flat)  # [N, E + E * 2I]
        logits = stacked[:, :num_experts]
    else:
        logits = layer.router(flat)
    ids, weights, own = route(logits, top_k, norm_topk_prob, replay, h.dtype)
    if stacked is None:
        def mlp(e: int, rows: torch.Tensor) -> torch.Tensor:
            gate, up = layer.experts_gate_up[e](rows).chunk(2, dim=-1)
            return layer.experts_down[e](silu_mul(gate, up))

        out = dispatch_to_experts(flat, ids, weights, num_experts, mlp)
    else:
        gate_up = stacked[:, num_experts:].unflatten(1, (num_experts, -1))  # [N, E, 2I]
        out = _stacked(layer, flat, gate_up, ids, weights, silu_mul)
    return out.view_as(h), own


def _stacked(layer, x: torch.Tensor, gate_up: torch.Tensor, ids: torch.Tensor,
             weights: torch.Tensor, silu_mul: Callable) -> torch.Tensor:
    """dispatch_to_experts' result from every expert's gate/up of every token [N, E, 2I]: the
    same (token, expert) pairs in the same order (by expert, stable), added back the same way."""
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token, expert = order // k, flat.index_select(0, order)
    gate, up = gate_up[token, expert].chunk(2, dim=-1)  # [A, I] each
    act = silu_mul(gate, up)
    blocks = act.new_zeros(act.shape[0], gate_up.shape[1], act.shape[1])
    blocks[torch.arange(act.shape[0], device=x.device), expert] = act
    y = layer.down_blocks(blocks.flatten(1)) * weights.reshape(-1).index_select(0, order).unsqueeze(1)
    return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))
