"""The deterministic forward of ``CausalLM``: the engine (KV cache, any batch) and the trainer
(full sequences, with autograd) run this one function, built from ops.py's batch-invariant ops,
so a token's logits have the same bits whichever of them computes it.

    engine:  model(ids, positions, cache, slots, deterministic=True)   (prefill, decode)
    trainer: model(ids, deterministic=True, dtype=compute dtype)       (autograd through it)

It is qwen3.py's math (same norms, RoPE table, routing), with fused q/k/v and gate/up matrices;
it differs from the fast paths (module forward, serving.py) only in rounding (~1e-6).

Dtype policy: everything runs in one compute dtype (the parameters', or ``dtype``): the trainer
with fp32 master weights casts them to the engine's dtype inside the forward, so a bf16 engine
and a bf16-computing trainer see identical weights and identical ops. Norm statistics, softmaxes
and logits are fp32 in both.

Weights: the engine's copies (fused, cast, packed for oneDNN) are built once per weight version
and cached on the model (``DeterministicWeights.is_current``); the trainer's are built per
forward from the parameters, differentiably.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from tidal.model.moe_dispatch import dispatch_to_experts
from tidal.model.rope import apply_rope
from tidal.numerics.ops import (
    KEY_BLOCK, DeterministicLinear, attention, pad_visible, rms_norm, silu,
)

if TYPE_CHECKING:
    from tidal.model.kv_cache import KVCache
    from tidal.model.qwen3 import CausalLM


@dataclass
class _Layer:
    input_norm: torch.Tensor  # [H]
    qkv: DeterministicLinear  # [(heads + 2 * kv_heads) * D, H]
    q_norm: torch.Tensor  # [D]
    k_norm: torch.Tensor  # [D]
    o: DeterministicLinear  # [H, heads * D]
    post_norm: torch.Tensor  # [H]
    gate_up: DeterministicLinear | None  # [2 * I, H] (dense)
    down: DeterministicLinear | None  # [H, I] (dense)
    router: DeterministicLinear | None  # [E, H] (MoE)
    experts_gate_up: list[DeterministicLinear]  # E x [2 * I, H] (MoE)
    experts_down: list[DeterministicLinear]  # E x [H, I] (MoE)


class DeterministicWeights:
    """The forward's tensors in the compute dtype. ``trainable``: built from the parameters with
    autograd (the trainer); otherwise detached copies, packed once (the engine)."""

    def __init__(self, model: CausalLM, dtype: torch.dtype, trainable: bool):
        cfg = model.config
        self.dtype, self.trainable = dtype, trainable
        self.eps = cfg.rms_norm_eps
        self.top_k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self._sources = [p for p in model.parameters()]
        self._stamp = self._versions()
        backbone = model.model
        with torch.set_grad_enabled(trainable and torch.is_grad_enabled()):
            self.embed = self._cast(backbone.embed_tokens.weight)
            self.norm = self._cast(backbone.norm.weight)
            self.lm_head = self._linear(model.lm_head.weight)
            self.layers = [self._layer(layer) for layer in backbone.layers]

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self.dtype)
        return t if self.trainable else t.detach()

    def _linear(self, *parts: torch.Tensor) -> DeterministicLinear:
        return DeterministicLinear(self._cast(torch.cat(parts) if len(parts) > 1 else parts[0]))

    def _layer(self, layer) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        dense = hasattr(mlp, "gate_proj")
        experts = None if dense else mlp.experts
        return _Layer(
            input_norm=self._cast(layer.input_layernorm.weight),
            qkv=self._linear(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight),
            q_norm=self._cast(attn.q_norm.weight),
            k_norm=self._cast(attn.k_norm.weight),
            o=self._linear(attn.o_proj.weight),
            post_norm=self._cast(layer.post_attention_layernorm.weight),
            gate_up=self._linear(mlp.gate_proj.weight, mlp.up_proj.weight) if dense else None,
            down=self._linear(mlp.down_proj.weight) if dense else None,
            router=None if dense else self._linear(mlp.gate.weight),
            experts_gate_up=[] if dense else [self._linear(w) for w in experts.gate_up_proj],
            experts_down=[] if dense else [self._linear(w) for w in experts.down_proj],
        )

    def _versions(self) -> list[int]:
        return [t._version for t in self._sources]

    def is_current(self, dtype: torch.dtype) -> bool:
        """Same dtype and no parameter changed in place since the build (replaced parameters are
        caught by CausalLM, which drops this object like its serving weights)."""
        return dtype == self.dtype and self._versions() == self._stamp


def deterministic_forward(
    model: CausalLM,
    weights: DeterministicWeights,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    cache: KVCache | None,
    slots: torch.Tensor | range | None,
    replay: torch.Tensor | None,
    logits_at: torch.Tensor | None,
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """input_ids, positions [B, T] (positions < 0: padding) -> (fp32 logits [B, T, V] or [B, V] at
    ``logits_at``, per-layer router top-k [B*T, k] or Nones). Without a cache attention is causal
    over the given order (positions only set RoPE), as in qwen3.py."""
    w = weights
    b, t = input_ids.shape
    cfg = model.config
    x = F.embedding(input_ids, w.embed)
    rope_positions = positions.clamp(min=0)
    if cache is None:
        plan = None
        length = _round_up(t)
        query_at = torch.arange(t, device=x.device).expand(b, t)
        needed = int(rope_positions.max()) + 1 if rope_positions.numel() else 1
    else:
        from tidal.model.serving import make_plan

        plan = make_plan(cache, slots, positions)
        length = _round_up(plan.kv_len)
        if length > cache.max_len:
            raise ValueError(
                f"the deterministic forward reads keys in blocks of {KEY_BLOCK}: the KV cache needs "
                f"max_len >= {length} (use KVCache.for_model, which rounds it up)"
            )
        query_at = rope_positions
        needed = plan.kv_len
    cos, sin = model.rope.lookup(rope_positions, x.dtype, needed)
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # [B, T, 1, D]: broadcast over heads
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    key_at = torch.arange(length, device=x.device)
    visible = (key_at <= query_at.unsqueeze(-1)).unsqueeze(2).expand(b, t, group, length)
    visible = pad_visible(visible.reshape(b, 1, t * group, length))  # rows: (query, q head)
    expert_ids: list[torch.Tensor | None] = []
    for i, layer in enumerate(w.layers):
        kv = None if cache is None else (cache.k[i], cache.v[i])
        x = x + _attention(cfg, w, layer, x, cos, sin, visible, plan, kv, length)
        h = rms_norm(x, layer.post_norm, w.eps)
        if layer.router is None:
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(silu(gate) * up)
            expert_ids.append(None)
        else:
            out, ids = _moe(w, layer, h, None if replay is None else replay[:, i])
            x = x + out
            expert_ids.append(ids)
    if logits_at is not None:
        x = x[torch.arange(b, device=x.device), logits_at]
    return w.lm_head(rms_norm(x, w.norm, w.eps)).float(), expert_ids


def _round_up(n: int) -> int:
    return max(-(-n // KEY_BLOCK), 1) * KEY_BLOCK


def _attention(cfg, w: DeterministicWeights, layer: _Layer, x, cos, sin, visible, plan, kv, length):
    b, t, _ = x.shape
    heads, kv_heads, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    qkv = layer.qkv(rms_norm(x, layer.input_norm, w.eps)).view(b, t, heads + 2 * kv_heads, d)
    q = apply_rope(rms_norm(qkv[:, :, :heads], layer.q_norm, w.eps), cos, sin)
    k = apply_rope(rms_norm(qkv[:, :, heads : heads + kv_heads], layer.k_norm, w.eps), cos, sin)
    v = qkv[:, :, heads + kv_heads :]
    if plan is None:
        pad = (0, 0, 0, length - t)
        keys, values = F.pad(k.transpose(1, 2), pad), F.pad(v.transpose(1, 2), pad)
    else:
        kc, vc = kv
        plan.through_cache(kc, vc, k, v)  # writes the new keys/values; we read whole blocks
        keys = kc[plan.rows, :, :length].to(x.dtype)
        values = vc[plan.rows, :, :length].to(x.dtype)
    group = heads // kv_heads
    rows = q.reshape(b, t, kv_heads, group, d).permute(0, 2, 1, 3, 4).reshape(b, kv_heads, t * group, d)
    out = attention(rows, keys, values, visible)  # [B, kv_heads, T * group, D]
    out = out.view(b, kv_heads, t, group, d).permute(0, 2, 1, 3, 4).reshape(b, t, heads * d)
    return layer.o(out)


def _moe(w: DeterministicWeights, layer: _Layer, h: torch.Tensor, replay: torch.Tensor | None):
    """SparseMoE's math on deterministic matmuls -> (out [B, T, H], the router's own top-k
    [B*T, k]); replay [B*T, k] picks the experts, gate weights from this router's probabilities."""
    flat = h.reshape(-1, h.shape[-1])
    probs = torch.softmax(layer.router(flat).float(), dim=-1)
    weights, own = torch.topk(probs, w.top_k, dim=-1)
    ids = own
    if replay is not None:
        ids = replay
        weights = probs.gather(-1, ids)
    if w.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = _experts(layer, flat, ids, weights.to(h.dtype))
    return out.view_as(h), own


def _experts(layer: _Layer, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """qwen3.Experts.forward on deterministic matmuls."""

    def mlp(e: int, rows: torch.Tensor) -> torch.Tensor:
        gate, up = layer.experts_gate_up[e](rows).chunk(2, dim=-1)
        return layer.experts_down[e](silu(gate) * up)

    return dispatch_to_experts(x, ids, weights, len(layer.experts_down), mlp)
