"""The deterministic forward of ``CausalLM``: the engine (KV cache, any batch) and the trainer
(full sequences, with autograd) run this one function, built from ops.py's batch-invariant ops,
so a token's logits have the same bits whichever of them computes it.

    engine:  model(ids, positions, cache, slots, deterministic=True)   (prefill, decode)
    trainer: model(ids, deterministic=True, dtype=compute dtype)       (autograd through it)

It is qwen3.py's math (same norms, RoPE table, routing), with fused q/k/v and gate/up matrices
and, in fp32, the norm weights folded into the matrices (DeterministicWeights); it differs from
the fast paths (module forward, serving.py) only in rounding (~1e-6). MoE layers: moe.py.

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

from tidal.model.rope import apply_rope_fused
from tidal.numerics.moe import sparse_moe
from tidal.numerics.ops import (
    KEY_BLOCK, DeterministicLinear, attention, attention_bias, fold_norm_weight, folded_rms_norm,
    rms_norm, silu,
)
from tidal.numerics.probe import ProbeShapes, choose_paths

if TYPE_CHECKING:
    from tidal.model.kv_cache import KVCache
    from tidal.model.qwen3 import CausalLM


@dataclass
class _Layer:
    input_norm: torch.Tensor | None  # [H]; None: folded into qkv
    qkv: DeterministicLinear  # [(heads + 2 * kv_heads) * D, H]
    qk_norm: torch.Tensor  # [heads + kv_heads, D]: q_norm per q head, then k_norm per kv head
    o: DeterministicLinear  # [H, heads * D]
    post_norm: torch.Tensor | None  # [H]; None: folded into gate_up (dense), router and experts
    gate_up: DeterministicLinear | None  # [2 * I, H] (dense)
    down: DeterministicLinear | None  # [H, I] (dense)
    router: DeterministicLinear | None  # [E, H] (MoE)
    experts_gate_up: list[DeterministicLinear]  # E x [2 * I, H] (MoE)
    experts_down: list[DeterministicLinear]  # E x [H, I] (MoE)
    router_gate_up: DeterministicLinear | None = None  # [E + E*2I, H]: router, experts' gate_up
    down_blocks: DeterministicLinear | None = None  # [H, E * I]: experts' down side by side


class DeterministicWeights:
    """The forward's tensors in the compute dtype. ``trainable``: built from the parameters with
    autograd (the trainer); otherwise detached copies, packed once (the engine).

    fp32 folds every RMSNorm's weight (and sqrt of its width) into the matmul after it, as the
    serving path does (serving.py), with ops.fold_norm_weight: the trainer's folded matrices are
    differentiable functions of its parameters and have the same bits as the engine's. The q
    norm's sqrt(D) cancels the attention scale 1/sqrt(D); the k norm keeps its sqrt(D). bf16
    keeps RMSNorm's exact form (folding would round W * w to bf16) and scales q by 1/sqrt(D) in
    its norm weight.
    """

    def __init__(self, model: CausalLM, dtype: torch.dtype, trainable: bool):
        cfg = model.config
        self.dtype, self.trainable = dtype, trainable
        self.eps = cfg.rms_norm_eps
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.top_k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.folded = dtype == torch.float32
        self.paths = choose_paths(dtype, ProbeShapes.of_model(cfg))
        """The ops' paths that hold on this machine (probe.py), the same in every process."""
        self.hidden_eps = torch.tensor(cfg.hidden_size * self.eps, dtype=dtype)
        self.head_eps = torch.tensor(cfg.head_dim * self.eps, dtype=dtype)
        self._sources = [p for p in model.parameters()]
        self._stamp = self._versions()
        backbone = model.model
        with torch.set_grad_enabled(trainable and torch.is_grad_enabled()):
            self.embed = self._cast(backbone.embed_tokens.weight)
            self.norm = self._norm_weight(backbone.norm.weight)
            self.lm_head = self._linear(model.lm_head.weight, norm=backbone.norm.weight)
            self.layers = [self._layer(layer) for layer in backbone.layers]

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self.dtype)
        return t if self.trainable else t.detach()

    def _folded(self, matrix: torch.Tensor, norm: torch.Tensor | None) -> torch.Tensor:
        """matrix (cast) with the norm weight before it folded in, where folding applies."""
        matrix = self._cast(matrix)
        if norm is None or not self.folded:
            return matrix
        return fold_norm_weight(matrix, self._cast(norm))

    def _linear(self, *parts: torch.Tensor, norm: torch.Tensor | None = None) -> DeterministicLinear:
        return DeterministicLinear(self._folded(torch.cat(parts) if len(parts) > 1 else parts[0], norm),
                                   self.paths.linear)

    def _norm_weight(self, weight: torch.Tensor) -> torch.Tensor | None:
        """The weight a norm applies itself: None when folded into the matmul after it."""
        return None if self.folded else self._cast(weight)

    def _layer(self, layer) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        dense = hasattr(mlp, "gate_proj")
        post = layer.post_attention_layernorm.weight
        d = self.head_dim
        q_scale, k_scale = (1.0, d**0.5) if self.folded else (d**-0.5, 1.0)
        q_norm, k_norm = self._cast(attn.q_norm.weight), self._cast(attn.k_norm.weight)
        experts_gate_up = None if dense else self._folded(mlp.experts.gate_up_proj, post)  # [E, 2I, H]
        experts_down = None if dense else self._cast(mlp.experts.down_proj)  # [E, H, I]
        return _Layer(
            input_norm=self._norm_weight(layer.input_layernorm.weight),
            qkv=self._linear(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight,
                             norm=layer.input_layernorm.weight),
            qk_norm=torch.cat(((q_norm * q_scale).expand(self.heads, -1),
                               (k_norm * k_scale).expand(self.kv_heads, -1))),
            o=self._linear(attn.o_proj.weight),
            post_norm=self._norm_weight(post),
            gate_up=self._linear(mlp.gate_proj.weight, mlp.up_proj.weight, norm=post) if dense else None,
            down=self._linear(mlp.down_proj.weight) if dense else None,
            router=None if dense else self._linear(mlp.gate.weight, norm=post),
            experts_gate_up=[] if dense else [DeterministicLinear(w, self.paths.linear)
                                              for w in experts_gate_up.unbind(0)],
            experts_down=[] if dense else [DeterministicLinear(w, self.paths.linear)
                                           for w in experts_down.unbind(0)],
            **({} if dense else self._few_token_experts(mlp, post, experts_gate_up, experts_down)),
        )

    def _few_token_experts(self, mlp, post: torch.Tensor, gate_up: torch.Tensor,
                           down: torch.Tensor) -> dict:
        """numerics/moe.py's fused matrices, for the engine only (the trainer never runs few
        tokens through them), where the probe found the stacked route equal to the per-expert
        one (``paths.moe_stacked``). gate_up [E, 2I, H] (norm folded) and down [E, H, I]: the
        layer's expert weights."""
        if self.trainable or not self.paths.moe_stacked:
            return {"router_gate_up": None, "down_blocks": None}
        path = self.paths.linear
        return {
            "router_gate_up": DeterministicLinear(torch.cat(
                (self._folded(mlp.gate.weight, post), gate_up.flatten(0, 1))), path),
            "down_blocks": DeterministicLinear(down.permute(1, 0, 2).flatten(1), path),
        }

    def _versions(self) -> list[int]:
        return [t._version for t in self._sources]

    def is_current(self, dtype: torch.dtype) -> bool:
        """Same dtype and no parameter changed in place since the build (replaced parameters are
        caught by CausalLM, which drops this object like its serving weights)."""
        return dtype == self.dtype and self._versions() == self._stamp

    def norm_hidden(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        """RMSNorm over the hidden size; weight None: folded (ops.folded_rms_norm)."""
        if weight is None:
            return folded_rms_norm(x, self.hidden_eps)
        return rms_norm(x, weight, self.eps, self.paths.rms_norm)

    def norm_heads(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """q_norm / k_norm over each head's D, times the per-head weight [heads, D]."""
        if self.folded:
            return folded_rms_norm(x, self.head_eps) * weight
        return rms_norm(x, None, self.eps, self.paths.rms_norm) * weight


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
    bias = attention_bias(query_at, length)
    expert_ids: list[torch.Tensor | None] = []
    for i, layer in enumerate(w.layers):
        kv = None if cache is None else (cache.k[i], cache.v[i])
        x = x + _attention(w, layer, x, cos, sin, bias, plan, kv, length)
        h = w.norm_hidden(x, layer.post_norm)
        if layer.router is None:
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(silu(gate, w.paths.silu) * up)
            expert_ids.append(None)
        else:
            out, ids = sparse_moe(layer, h, w.top_k, w.norm_topk_prob,
                                  None if replay is None else replay[:, i], w.paths.silu)
            x = x + out
            expert_ids.append(ids)
    if logits_at is not None:
        x = x[torch.arange(b, device=x.device), logits_at]
    return w.lm_head(w.norm_hidden(x, w.norm)).float(), expert_ids


def _round_up(n: int) -> int:
    return max(-(-n // KEY_BLOCK), 1) * KEY_BLOCK


def _attention(w: DeterministicWeights, layer: _Layer, x, cos, sin, bias, plan, kv, length):
    b, t, _ = x.shape
    heads, kv_heads, d = w.heads, w.kv_heads, w.head_dim
    qkv = layer.qkv(w.norm_hidden(x, layer.input_norm)).view(b, t, heads + 2 * kv_heads, d)
    qk = apply_rope_fused(w.norm_heads(qkv.narrow(2, 0, heads + kv_heads), layer.qk_norm), cos, sin)
    q, k = qk.narrow(2, 0, heads), qk.narrow(2, heads, kv_heads)
    v = qkv.narrow(2, heads + kv_heads, kv_heads)
    if plan is None:
        pad = (0, 0, 0, length - t)
        keys, values = F.pad(k.transpose(1, 2), pad), F.pad(v.transpose(1, 2), pad)
    else:
        kc, vc = kv
        plan.through_cache(kc, vc, k, v)  # writes the new keys/values; we read whole blocks
        keys = kc[plan.rows, :, :length].to(x.dtype)
        values = vc[plan.rows, :, :length].to(x.dtype)
    return layer.o(attention(q, keys, values, bias, w.paths.attention))
