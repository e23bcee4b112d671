"""The one fused forward of ``CausalLM``: prefill, decode and the trainer's deterministic pass all
run this function over one fused weight layout; the op set (tidal.numerics.opset) is the seam.

    engine, fast:           model(ids, positions, cache, slots)                 FastOps
    engine, deterministic:  model(ids, positions, cache, slots, deterministic=True)
    trainer, deterministic: model(ids, deterministic=True, dtype=the engine's)  DeterministicOps
    trainer, shared prefix: model(suffix ids, prefix=..., deterministic=True)    (shared_prefix.py)
    GPU:                    the same calls on CUDA tensors        FastGpuOps / TritonOps

Why one: the engine's sampling logprob and the trainer's recomputation must come from the same
math; two forwards are two places to drift apart. The module forward (qwen3.py) stays the
Hugging Face reference that the logits tests check; this one is qwen3.py's math with

- fused matrices: q/k/v stacked into one [(heads + 2 kv_heads) D, H] matrix, gate/up into one
  [2I, H] (dense), the MoE router beside its experts' [E, 2I, H] and [E, H, I];
- folded norms in fp32: each RMSNorm's weight and sqrt(width) multiplied into the matmul after
  it, so the norm is x / sqrt(sum x^2 + width * eps) (ops.folded_rms_norm); q's sqrt(D) cancels
  the attention scale, so attention runs at scale 1. bf16 keeps RMSNorm's exact form (folding
  would round W * w to bf16) and carries 1/sqrt(D) in q's norm weight. Llama (no q/k norms,
  ``qk_normed`` False) keeps the same per-head multiplier, D**-0.5 for q and 1 for k, and the op
  sets only multiply by it (exact for k, and for q when D is a power of 4, e.g. 64);
- every matrix ``prepare``d by the op set once per weight version (packed for oneDNN, or the
  probed invariant path).

It differs from the module forward only in rounding (~1e-6 in fp32).

Weights: inference copies (detached, packed) are built once per weight version and cached on
the model (``FusedWeights.is_current``); the trainer's are built per forward from the parameters,
differentiably (``trainable``), so its folded matrices are functions of its parameters with the
same bits as the engine's.

Staleness: in-place updates (``load_state_dict``, optimizer steps, ``copy_`` under no_grad) bump a
tensor's version counter; ``is_current`` compares the parameters' counters with those seen at
build. Replaced parameters (``load_state_dict(assign=True)``, ``.to()``, ``tie_weights``) are caught
by CausalLM, which drops its cached weights. Writes through ``.data`` bypass the counter and are
not seen: don't update a serving model that way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from tidal.model.kv_cache import CachePlan, KVCache
from tidal.numerics.ops import fold_norm_weight

if TYPE_CHECKING:
    from tidal.model.qwen3 import CausalLM


@dataclass
class FusedLayer:
    input_norm: torch.Tensor | None  # [H]; None: folded into qkv
    qkv: object  # prepared [(heads + 2 * kv_heads) * D, H]: q_proj, k_proj, v_proj rows
    qk_norm: torch.Tensor  # [heads + kv_heads, D]: q_norm per q head, then k_norm per kv head
    # (with the attention scale); without q/k norms (Llama) only the scale: D**-0.5 (q), 1 (k)
    o: object  # prepared [H, heads * D]
    post_norm: torch.Tensor | None  # [H]; None: folded into gate_up (dense), router and experts
    gate_up: object | None  # prepared [2 * I, H]: gate_proj rows, then up_proj rows (dense)
    down: object | None  # prepared [H, I] (dense)
    router: object | None  # prepared [E, H] (MoE)
    experts_gate_up: list  # E x prepared [2 * I, H] (MoE)
    experts_down: list  # E x prepared [H, I] (MoE)
    experts_gate_up_weight: torch.Tensor | None = None  # [E, 2I, H] (MoE; grouped GPU kernels)
    experts_down_weight: torch.Tensor | None = None  # [E, H, I] (MoE)
    router_gate_up: object | None = None  # prepared [E + E*2I, H]: router, experts' gate_up
    down_blocks: object | None = None  # prepared [H, E * I]: experts' down side by side


class FusedWeights:
    """The forward's tensors in the compute dtype, prepared by one op set. ``trainable``: built
    from the parameters with autograd (the trainer); otherwise detached copies (the engine)."""

    def __init__(self, model: CausalLM, ops, dtype: torch.dtype, trainable: bool):
        cfg = model.config
        self.ops, self.dtype, self.trainable = ops, dtype, trainable
        self.eps = cfg.rms_norm_eps
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.top_k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.folded = dtype == torch.float32
        self.qk_normed = cfg.qk_norm
        """q and k are RMS-normalised per head before the qk_norm multiplier (Qwen3); False: only
        multiplied (Llama)."""
        device = model.model.embed_tokens.weight.device
        self.hidden_eps = torch.tensor(cfg.hidden_size * self.eps, dtype=dtype, device=device)
        self.head_eps = torch.tensor(cfg.head_dim * self.eps, dtype=dtype, device=device)
        self._sources = list(model.parameters())
        self._stamp = self._versions()
        backbone = model.model
        with torch.set_grad_enabled(trainable and torch.is_grad_enabled()):
            self.embed = self._cast(backbone.embed_tokens.weight)
            self.norm = self._norm_weight(backbone.norm.weight)
            tied = model.lm_head.weight is backbone.embed_tokens.weight and not self.folded
            # tied and unfolded: the embedding's one cast is the head's too (one copy, not two)
            self.lm_head = (self.ops.prepare(self.embed) if tied else
                            self._linear(model.lm_head.weight, norm=backbone.norm.weight))
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

    def _linear(self, *parts: torch.Tensor, norm: torch.Tensor | None = None):
        return self.ops.prepare(self._folded(torch.cat(parts) if len(parts) > 1 else parts[0], norm))

    def _norm_weight(self, weight: torch.Tensor) -> torch.Tensor | None:
        """The weight a norm applies itself: None when folded into the matmul after it."""
        return None if self.folded else self._cast(weight)

    def _layer(self, layer) -> FusedLayer:
        attn, mlp = layer.self_attn, layer.mlp
        dense = hasattr(mlp, "gate_proj")
        post = layer.post_attention_layernorm.weight
        common = dict(
            input_norm=self._norm_weight(layer.input_layernorm.weight),
            qkv=self._linear(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight,
                             norm=layer.input_layernorm.weight),
            qk_norm=self._qk_multiplier(attn),
            o=self._linear(attn.o_proj.weight),
            post_norm=self._norm_weight(post),
        )
        if dense:
            return FusedLayer(**common, router=None, experts_gate_up=[], experts_down=[],
                              gate_up=self._linear(mlp.gate_proj.weight, mlp.up_proj.weight, norm=post),
                              down=self._linear(mlp.down_proj.weight))
        gate_up = self._folded(mlp.experts.gate_up_proj, post)  # [E, 2I, H]
        down = self._cast(mlp.experts.down_proj)  # [E, H, I]
        stacked = self.ops.stacked_moe(self.trainable)
        prepare = self.ops.prepare
        return FusedLayer(
            **common, gate_up=None, down=None,
            router=self._linear(mlp.gate.weight, norm=post),
            experts_gate_up=[prepare(w) for w in gate_up.unbind(0)],
            experts_down=[prepare(w) for w in down.unbind(0)],
            experts_gate_up_weight=gate_up, experts_down_weight=down,
            # numerics/moe.py's few-token route: one matmul over router and every gate_up, one
            # over every expert's down side by side
            router_gate_up=prepare(torch.cat((self._folded(mlp.gate.weight, post),
                                              gate_up.flatten(0, 1)))) if stacked else None,
            down_blocks=prepare(down.permute(1, 0, 2).flatten(1)) if stacked else None,
        )

    def _qk_multiplier(self, attn) -> torch.Tensor:
        """[heads + kv_heads, D]: what each q and k head is multiplied by after its (optional)
        norm. The attention scale 1/sqrt(D) rides on q, so attention runs at scale 1; the folded
        norm leaves a factor sqrt(D) on q (cancelling that scale) and on k (multiplied back)."""
        d = self.head_dim
        if not self.qk_normed:
            ones = self.embed.new_ones(d)
            return torch.cat(((ones * d**-0.5).expand(self.heads, -1),
                              ones.expand(self.kv_heads, -1)))
        q_scale, k_scale = (1.0, d**0.5) if self.folded else (d**-0.5, 1.0)
        q_norm, k_norm = self._cast(attn.q_norm.weight), self._cast(attn.k_norm.weight)
        return torch.cat(((q_norm * q_scale).expand(self.heads, -1),
                          (k_norm * k_scale).expand(self.kv_heads, -1)))

    def _versions(self) -> list[int]:
        return [t._version for t in self._sources]

    def is_current(self, ops_name: str, dtype: torch.dtype) -> bool:
        """Same op set and dtype, and no parameter changed in place since the build."""
        return (ops_name == self.ops.name and dtype == self.dtype
                and self._versions() == self._stamp)


def fused_forward(
    model: CausalLM,
    w: FusedWeights,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    cache: KVCache | None,
    plan: CachePlan | None,
    replay: torch.Tensor | None,
    logits_at: torch.Tensor | None,
    attend=None,
    logits_from: int = 0,
    logits_rows: int = 1,
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """input_ids, positions [B, T] (positions < 0: padding) -> (fp32 logits [B, T, V] or [B, V] at
    ``logits_at``, per-layer router top-k [B*T, k] or Nones). With a cache (and its ``plan`` from
    kv_cache.make_plan) the tokens' keys and values are written at their positions and each
    attends to 0..p of its slot; without one attention is causal over the given order (positions
    only set RoPE), as in qwen3.py.

    ``attend(qkv, qk_norm, cos, sin) -> [B, T, heads * D]``: who attends to whom, in place of
    the op set's self-attention (the trainer's shared-prefix pass, model/shared_prefix.py: its tokens
    are one row whose attention reads each suffix's prefix); ``logits_from``: logits only for
    the tokens from there on (dim 1), folded into ``logits_rows`` rows (a new tensor, not a view
    of one: FSDP2 warns about views)."""
    ops = w.ops
    b, t = input_ids.shape
    ctx = ops.attention_context(positions, plan, cache, t) if attend is None else None
    x = F.embedding(input_ids, w.embed)
    cos, sin = _rope(model, positions, plan, t, x)
    expert_ids: list[torch.Tensor | None] = []
    for i, layer in enumerate(w.layers):
        kv = None if cache is None else (cache.k[i], cache.v[i])
        h = ops.norm(x, layer.input_norm, w)
        qkv = ops.linear(layer.qkv, h).view(b, t, w.heads + 2 * w.kv_heads, w.head_dim)
        attended = (ops.self_attention(qkv, layer.qk_norm, cos, sin, ctx, kv, w) if attend is None
                    else attend(qkv, layer.qk_norm, cos, sin))
        x = ops.linear(layer.o, attended, x)
        h = ops.norm(x, layer.post_norm, w)
        if layer.router is None:
            gate, up = ops.linear(layer.gate_up, h).chunk(2, dim=-1)
            x = ops.linear(layer.down, ops.silu_mul(gate, up), x)
            expert_ids.append(None)
        else:
            out, ids = ops.moe(layer, h, None if replay is None else replay[:, i], w)
            x = x + out
            expert_ids.append(ids)
    if logits_at is not None:
        x = x[torch.arange(b, device=x.device), logits_at]
    elif logits_from:
        x = x[:, logits_from:].reshape(logits_rows, -1, x.shape[-1])
    return ops.linear(w.lm_head, ops.norm(x, w.norm, w)).float(), expert_ids


def _rope(model: CausalLM, positions, plan, t: int, x: torch.Tensor):
    """cos, sin_signed broadcastable against [B, T, heads, D]: a slice of the table when every
    row sits at the same positions (no gather), else each row's positions looked up."""
    if plan is not None and plan.chunk_start is not None:
        cos, sin = model.rope.span(plan.chunk_start, t, x.dtype, x.device)  # [T, D]
        return cos.unsqueeze(-2), sin.unsqueeze(-2)
    rope_positions = positions.clamp(min=0) if plan is None else plan.rope_positions
    needed = plan.kv_len if plan is not None else (
        int(rope_positions.max()) + 1 if rope_positions.numel() else 1)
    cos, sin = model.rope.lookup(rope_positions, x.dtype, needed)  # [B, T, D]
    return cos.unsqueeze(2), sin.unsqueeze(2)
