"""The deterministic forward's sparse MoE block: qwen3.SparseMoE's math on row-invariant matmuls,
with a second route for a few tokens (a decode step) that gives the same bits in fewer calls.

Why a second route: oneDNN costs ~10 us per call whatever its size, and the per-expert route
makes 1 + 2 x (active experts) calls per layer (~15 at 8 decode rows), most of a small decode
step. For at most ``FEW_TOKENS`` tokens the router and every expert's gate/up run as one matmul
over their stacked matrices, and each (token, expert) pair's down projection as one matmul over
all experts' down matrices side by side, its input zero outside its expert's block. Measured on
this CPU (oneDNN packed, 1, 2 and 4 threads, 1..1000 rows): a column of the stacked matmul has
the bits of the same column of the expert's own matmul, and zeros in the other experts' blocks
add nothing (oneDNN sums each output over the input dim in order, and 0 * w + s = s), so both
routes give every token the same bits; tests compare them. It computes every expert's gate/up
(E / k times the work), so it pays only for few tokens; the trainer always takes the per-expert
route.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tidal.model.moe_dispatch import dispatch_to_experts
from tidal.numerics.ops import silu

if TYPE_CHECKING:
    from tidal.numerics.forward import _Layer

FEW_TOKENS = 64
"""Tokens up to which the stacked route runs. Measured on tiny-moe (8 experts, top-2), engine
decode steps, stacked vs per-expert: 0.7x the time at 4 rows, 0.95x at 32, even at 64."""


def sparse_moe(layer: _Layer, h: torch.Tensor, top_k: int, norm_topk_prob: bool,
               replay: torch.Tensor | None, silu_path: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """h [B, T, H] -> (out [B, T, H], the router's own top-k [B*T, k]); replay [B*T, k] picks the
    experts, gate weights from this router's probabilities."""
    flat = h.reshape(-1, h.shape[-1])
    num_experts = len(layer.experts_down)
    stacked = None
    if layer.router_gate_up is not None and flat.shape[0] <= FEW_TOKENS:
        stacked = layer.router_gate_up(flat)  # [N, E + E * 2I]
        logits = stacked[:, :num_experts]
    else:
        logits = layer.router(flat)
    probs = torch.softmax(logits.float(), dim=-1)
    weights, own = torch.topk(probs, top_k, dim=-1)
    ids = own
    if replay is not None:
        ids = replay
        weights = probs.gather(-1, ids)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights.to(h.dtype)
    if stacked is None:
        out = _per_expert(layer, flat, ids, weights, silu_path)
    else:
        gate_up = stacked[:, num_experts:].unflatten(1, (num_experts, -1))  # [N, E, 2I]
        out = _stacked(layer, flat, gate_up, ids, weights, silu_path)
    return out.view_as(h), own


def _per_expert(layer: _Layer, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                silu_path: str) -> torch.Tensor:
    """qwen3.Experts.forward on deterministic matmuls."""

    def mlp(e: int, rows: torch.Tensor) -> torch.Tensor:
        gate, up = layer.experts_gate_up[e](rows).chunk(2, dim=-1)
        return layer.experts_down[e](silu(gate, silu_path) * up)

    return dispatch_to_experts(x, ids, weights, len(layer.experts_down), mlp)


def _stacked(layer: _Layer, x: torch.Tensor, gate_up: torch.Tensor, ids: torch.Tensor,
             weights: torch.Tensor, silu_path: str) -> torch.Tensor:
    """dispatch_to_experts' result from every expert's gate/up of every token [N, E, 2I]: the
    same (token, expert) pairs in the same order (by expert, stable), added back the same way."""
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token, expert = order // k, flat.index_select(0, order)
    gate, up = gate_up[token, expert].chunk(2, dim=-1)  # [A, I] each
    act = silu(gate, silu_path) * up
    blocks = act.new_zeros(act.shape[0], gate_up.shape[1], act.shape[1])
    blocks[torch.arange(act.shape[0], device=x.device), expert] = act
    y = layer.down_blocks(blocks.flatten(1)) * weights.reshape(-1).index_select(0, order).unsqueeze(1)
    return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))
