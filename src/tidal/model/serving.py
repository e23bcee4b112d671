"""The KV-cached forward (the engine's prefill and decode): qwen3.py's math in fewer kernels.

Why a second forward: at the sizes tidal serves on CPU a decode step is bound by per-op
overhead, not arithmetic. The module forward (kept for the trainer and as the reference) ran
~270 small ops per decode step of the tiny model and copied every layer's cached keys/values out
of the cache with a gather. This path, per layer (~26 kernels):

- one QKV matmul and one gate+up matmul on fused weights derived from the HF-named parameters
  (``ServingWeights``; state_dict and checkpoints are untouched), each on the faster of MKL and
  oneDNN for its size (packed_linear.py), with the RMSNorm weights folded in (fp32);
- q_norm and k_norm as one norm over all q and k heads; RoPE for both from a position table in
  three ops (rope.py);
- cached keys/values read as a view, not a copy, when the batch's slots are a ``range`` (the
  engine keeps its running sequences in slots 0..n-1 for this); a step whose rows all sit at the
  same positions writes the cache through one slice and needs no mask (a fresh prefill attends
  causally to its own keys);
- decode attention with each kv head's group of q heads as one matmul's rows;

and logits only at the columns asked for (prefill needs each row's last one).

Numerics: the same math in the same precision as the module forward, in a different order
(fused and folded matmuls, norms as hypot), so the two agree to ~1e-6 rather than bit for bit;
tests hold them to 1e-5 and greedy tokens equal. Inference only: the serving weights are
detached copies, so a cached forward with grad enabled is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from tidal.model.kv_cache import KVCache
from tidal.model.packed_linear import PackedLinear
from tidal.model.rope import apply_rope_fused
from tidal.numerics.ops import fold_norm_weight

if TYPE_CHECKING:
    from tidal.model.qwen3 import CausalLM


@dataclass
class _Layer:
    input_norm: torch.Tensor | None  # [H]; None: folded into qkv
    qkv: PackedLinear  # [(heads + 2 * kv_heads) * D, H]: q_proj, k_proj, v_proj rows
    qk_norm: torch.Tensor  # [heads + kv_heads, D]: q_norm per q head, then k_norm per kv head
    o: PackedLinear  # [H, heads * D]
    post_norm: torch.Tensor | None  # [H]; None: folded into gate_up
    gate_up: PackedLinear | None  # [2 * I, H]: gate_proj rows, then up_proj rows (dense)
    down: PackedLinear | None  # [H, I] (dense)
    moe: torch.nn.Module | None  # the SparseMoE module itself (MoE)


class ServingWeights:
    """Tensors the cached forward uses. Embeddings and unfolded norm weights are the parameters
    themselves; matrices are derived copies (fused, norm-folded, and packed for oneDNN:
    packed_linear.py).

    Folding (fp32 only): RMSNorm(x) * w feeding a matmul W equals (x / ||x||_eps) @ (W * w *
    sqrt(H))^T with ||x||_eps = sqrt(sum x^2 + H * eps) = hypot(||x||, sqrt(H * eps)), so the
    norm is three kernels, vector_norm, hypot and a divide (~3.5 us against rms_norm's ~8 us at
    16 rows), and the weight multiply disappears into W. Likewise k_norm takes sqrt(D), and for
    q the norm's sqrt(D) and the attention scale 1/sqrt(D) cancel, so attention runs at scale 1.
    Rounding differs from the module forward by ~1e-7 relative. bf16 keeps RMSNorm's exact
    form: folding would round W * w to bf16.

    Memory: fused, folded and packed matrices are copies, so serving holds each matrix two or
    three times (the plain copy serves single-row calls on MKL, the packed one oneDNN).

    Staleness: in-place updates (``load_state_dict``, optimizer steps, ``copy_`` under no_grad)
    bump a tensor's version counter; ``is_current`` compares the derived tensors' sources'
    counters with those seen at build. Replaced parameters (``load_state_dict(assign=True)``,
    ``.to()``, ``tie_weights``) are caught by CausalLM, which drops this object. Writes through
    ``.data`` bypass the counter and are not seen: don't update a serving model that way.
    """

    def __init__(self, model: CausalLM):
        cfg = model.config
        self.eps = cfg.rms_norm_eps
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
        )
        backbone = model.model
        self.embed = backbone.embed_tokens.weight
        self.folded = self.embed.dtype == torch.float32
        # sqrt(n * eps): the folded norms divide by hypot(||x||, it) = sqrt(sum x^2 + n * eps).
        self.hidden_eps = torch.tensor((cfg.hidden_size * self.eps) ** 0.5, dtype=self.embed.dtype)
        self.head_eps = torch.tensor((cfg.head_dim * self.eps) ** 0.5, dtype=self.embed.dtype)
        self.attention_scale = 1.0 if self.folded else None  # None: SDPA's 1/sqrt(D)
        self._sources: list[torch.Tensor] = []
        with torch.no_grad():
            self.norm = self._norm_weight(backbone.norm.weight)
            self.lm_head = self._matrix(model.lm_head.weight, norm_weight=backbone.norm.weight)
            self.layers = [self._layer(layer) for layer in backbone.layers]
        self._stamp = self._versions()

    def _matrix(
        self, *parts: torch.Tensor, norm_weight: torch.Tensor | None = None
    ) -> PackedLinear:
        """A serving copy of the parameters ``parts`` [out_i, in] stacked by rows, with the
        preceding norm's weight [in] folded in if given (and folding applies)."""
        self._sources += parts
        weight = torch.cat(parts) if len(parts) > 1 else parts[0].detach()
        if norm_weight is not None and self.folded:
            self._sources.append(norm_weight)
            weight = fold_norm_weight(weight, norm_weight)
        return PackedLinear(weight)

    def _norm_weight(self, weight: torch.Tensor) -> torch.Tensor | None:
        """The weight a norm applies itself: None when folded into the matmul after it."""
        return None if self.folded else weight

    def _layer(self, layer) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        d = self.head_dim
        in_norm, post_norm = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        qn, kn = attn.q_norm.weight, attn.k_norm.weight
        self._sources += [qn, kn]
        if self.folded:  # q: sqrt(D) from the norm times 1/sqrt(D) attention scale = 1
            kn = kn * d**0.5
        dense = hasattr(mlp, "gate_proj")
        return _Layer(
            input_norm=self._norm_weight(in_norm),
            qkv=self._matrix(
                attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, norm_weight=in_norm
            ),
            qk_norm=torch.cat((qn.expand(self.heads, -1), kn.expand(self.kv_heads, -1))),
            o=self._matrix(attn.o_proj.weight),
            # The MoE router and experts are modules: their input norm stays explicit.
            post_norm=self._norm_weight(post_norm) if dense else post_norm,
            gate_up=self._matrix(mlp.gate_proj.weight, mlp.up_proj.weight, norm_weight=post_norm)
            if dense else None,
            down=self._matrix(mlp.down_proj.weight) if dense else None,
            moe=None if dense else mlp,
        )

    def _versions(self) -> list[int]:
        return [t._version for t in self._sources]

    def is_current(self) -> bool:
        return self._versions() == self._stamp

    def norm_hidden(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        """RMSNorm over the hidden size; with weight None, folded form (see the class docs)."""
        if weight is None:
            return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).hypot_(self.hidden_eps)
        return F.rms_norm(x, weight.shape, weight, self.eps)

    def norm_heads(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """q_norm/k_norm over each head's D, times the per-head weight [heads, D]."""
        if self.folded:
            norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True).hypot_(self.head_eps)
            return x / norm * weight
        return F.rms_norm(x, (self.head_dim,), None, self.eps) * weight


@dataclass
class _Plan:
    """How this forward's tokens go into the cache and what they attend to (built once, used by
    every layer).

    rows: the batch's cache rows: a slice (contiguous slots: read as a view) or slot ids [B].
    kv_len: keys read per row (longest position in the batch + 1).
    chunk_start: set when rows is a slice and every row holds positions chunk_start ..
        chunk_start + T - 1 (a decode step at one position, a fresh prefill of equal prompts):
        the new keys are written through one slice. None otherwise.
    causal_new: chunk_start == 0: the queries attend causally to the new keys alone, no cache
        read, no mask.
    write_slots/write_pos [N]: otherwise, cache slot and position of each written token, in
        row-major order (take None) or of the (row, column) pairs in ``take`` (padding skipped).
    mask [B, 1, T, kv_len] or None (chunks of one token, causal_new): True where a query may
        attend a cached key.
    rope_positions [B, T]: positions with padding clamped to 0 (its output is garbage anyway).
    """

    rows: slice | torch.Tensor
    kv_len: int
    chunk_start: int | None
    causal_new: bool
    write_slots: torch.Tensor | None
    write_pos: torch.Tensor | None
    take: tuple[torch.Tensor, torch.Tensor] | None
    mask: torch.Tensor | None
    rope_positions: torch.Tensor

    def through_cache(self, kc, vc, k, v) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new keys/values k, v [B, T, kv_heads, D] into one layer's cache kc, vc
        [slots, kv_heads, max_len, D]; return what the queries attend to [B, kv_heads, L, D]:
        the new keys themselves (causal_new) or each row's cache up to kv_len."""
        if self.chunk_start is None:
            if self.take is None:
                new_k, new_v = k.flatten(0, 1), v.flatten(0, 1)
            else:
                new_k, new_v = k[self.take], v[self.take]
            kc[self.write_slots, :, self.write_pos] = new_k.to(kc.dtype)
            vc[self.write_slots, :, self.write_pos] = new_v.to(vc.dtype)
            read_k, read_v = kc[self.rows, :, : self.kv_len], vc[self.rows, :, : self.kv_len]
            return read_k.to(k.dtype), read_v.to(v.dtype)
        # One strided copy per tensor into the window the queries then read (views, no gather).
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, kv_heads, T, D]
        first, count = self.rows.start, self.rows.stop - self.rows.start
        start, kv_len = self.chunk_start, self.kv_len
        read_k = kc.narrow(0, first, count).narrow(2, 0, kv_len)
        read_v = vc.narrow(0, first, count).narrow(2, 0, kv_len)
        read_k.narrow(2, start, kv_len - start).copy_(k)
        read_v.narrow(2, start, kv_len - start).copy_(v)
        if self.causal_new:
            return k, v
        if read_k.dtype != k.dtype:
            read_k, read_v = read_k.to(k.dtype), read_v.to(v.dtype)
        return read_k, read_v


def make_plan(cache: KVCache, slots: torch.Tensor | range | None, positions: torch.Tensor) -> _Plan:
    """Validate slots/positions against the cache (clear errors) and plan the cache traffic."""
    b, t = positions.shape
    if isinstance(slots, range):
        if len(slots) != b or slots.step != 1 or slots.start < 0 or slots.stop > cache.num_slots:
            raise ValueError(
                f"slots {slots} must be {b} consecutive slots within [0, {cache.num_slots})"
            )
        rows: slice | torch.Tensor = slice(slots.start, slots.stop)
    else:
        if slots is None or slots.shape != (b,):
            got = None if slots is None else tuple(slots.shape)
            raise ValueError(f"a cache needs slots of shape [B] = {(b,)} (or a range), got {got}")
        if int(slots.min()) < 0 or int(slots.max()) >= cache.num_slots:
            raise ValueError(f"slots must lie in [0, {cache.num_slots}), got {slots.tolist()}")
        rows = slots
    low, high = (int(p) for p in torch.aminmax(positions))
    kv_len = max(high + 1, 1)
    if kv_len > cache.max_len:
        raise ValueError(
            f"position {kv_len - 1} does not fit the KV cache (max_len {cache.max_len})"
        )
    device = positions.device
    if isinstance(rows, slice) and low >= 0 and high - low == t - 1 and (
        t == 1 or torch.equal(positions, torch.arange(low, high + 1, device=device).expand(b, t))
    ):
        mask = None
        if t > 1 and low > 0:
            mask = torch.arange(kv_len, device=device) <= positions[0].view(t, 1)  # [T, kv_len]
        return _Plan(rows, kv_len, low, low == 0, None, None, None, mask, positions)
    if isinstance(rows, slice):
        slot_ids = torch.arange(rows.start, rows.stop, device=device)
    else:
        slot_ids = rows
    if low >= 0:
        take = None
        write_slots = slot_ids.repeat_interleave(t) if t > 1 else slot_ids
        write_pos = positions.flatten()
        rope_positions = positions
    else:
        take = (positions >= 0).nonzero(as_tuple=True)
        write_slots, write_pos = slot_ids[take[0]], positions[take]
        rope_positions = positions.clamp(min=0)
    # Padding queries (position < 0) see key 0 so that softmax stays finite.
    key_pos = torch.arange(kv_len, device=device)
    mask = key_pos.view(1, 1, 1, -1) <= rope_positions.view(b, 1, t, 1)
    return _Plan(rows, kv_len, None, False, write_slots, write_pos, take, mask, rope_positions)


def cached_forward(
    model: CausalLM,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    cache: KVCache,
    slots: torch.Tensor | range | None,
    replay: torch.Tensor | None,
    logits_at: torch.Tensor | None,
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """input_ids, positions [B, T] -> (fp32 logits [B, T, V], or [B, V] at column ``logits_at[b]``
    of each row; per-layer expert ids [B*T, k], or Nones for a dense model)."""
    plan = make_plan(cache, slots, positions)
    if torch.is_grad_enabled():
        raise RuntimeError(
            "the KV-cached forward is inference-only; run it under torch.inference_mode() or "
            "torch.no_grad()"
        )
    w = model.serving_weights()
    b, t = input_ids.shape
    x = F.embedding(input_ids, w.embed)
    if plan.chunk_start is None:
        cos, sin = model.rope.lookup(plan.rope_positions, x.dtype, plan.kv_len)  # [B, T, D]
    else:  # every row at the same positions: a slice of the table, no gather
        cos, sin = model.rope.span(plan.chunk_start, t, x.dtype, x.device)  # [T, D]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [..., T, 1, D]: broadcast over heads
    expert_ids: list[torch.Tensor | None] = []
    for i, layer in enumerate(w.layers):
        x = x + _attention(w, layer, x, cos, sin, plan, cache.k[i], cache.v[i])
        if layer.moe is None:
            gate, up = layer.gate_up(w.norm_hidden(x, layer.post_norm)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
            expert_ids.append(None)
        else:
            h = F.rms_norm(x, layer.post_norm.shape, layer.post_norm, w.eps)
            out, ids = layer.moe(h, None if replay is None else replay[:, i])
            x = x + out
            expert_ids.append(ids)
    if logits_at is not None:
        x = x[torch.arange(b, device=x.device), logits_at]
    logits = w.lm_head(w.norm_hidden(x, w.norm)).float()
    return logits, expert_ids


def _attention(w: ServingWeights, layer: _Layer, x, cos, sin, plan: _Plan, kc, vc) -> torch.Tensor:
    b, t, _ = x.shape
    heads, kv_heads, d = w.heads, w.kv_heads, w.head_dim
    qkv = layer.qkv(w.norm_hidden(x, layer.input_norm)).view(b, t, heads + 2 * kv_heads, d)
    qk = w.norm_heads(qkv.narrow(2, 0, heads + kv_heads), layer.qk_norm)
    qk = apply_rope_fused(qk, cos, sin)  # [B, T, heads + kv_heads, D]
    q = qk.narrow(2, 0, heads)
    k, v = qk.narrow(2, heads, kv_heads), qkv.narrow(2, heads + kv_heads, kv_heads)
    k, v = plan.through_cache(kc, vc, k, v)
    if t == 1:
        out = _decode_attention(q.select(1, 0), k, v, plan.mask, w.attention_scale)
    else:
        q = q.transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=plan.mask, is_causal=plan.causal_new and t > 1,
            scale=w.attention_scale, enable_gqa=True,
        )
        out = out.transpose(1, 2)
    return layer.o(out.reshape(b, t, heads * d))


MATMUL_ATTENTION_MIN_ROWS = 4
"""Decode batches from this size attend with two batched matmuls, smaller ones with SDPA.
Measured (1 thread, kv_len 17-80, tiny's 6 q / 2 kv heads, us per call; SDPA with each kv
head's q heads as its queries): 1 row 11-13 vs 5-7; 16 rows 24-50 vs 23-51; 64 rows 65-175
vs 84-199. SDPA over the 6 heads with enable_gqa was slower than both (7-9, 29-60, 104-231)."""


def _decode_attention(q, k, v, mask, scale: float | None) -> torch.Tensor:
    """One query per row: q [B, heads, D], k/v [B, kv_heads, L, D], mask [B, 1, 1, L] | None
    -> [B, 1, heads, D]: softmax(q k^T * scale) v (scale None: 1/sqrt(D)). The q heads sharing a
    kv head are that kv head's queries (a [group, D] @ [D, L] product, no repeat_kv copy)."""
    b, heads, d = q.shape
    kv_heads = k.shape[1]
    q = q.reshape(b, kv_heads, heads // kv_heads, d)
    if b < MATMUL_ATTENTION_MIN_ROWS:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return out.view(b, 1, heads, d)
    scores = torch.matmul(q, k.transpose(-1, -2))  # [B, kv_heads, group, L]
    if scale != 1.0:
        scores = scores.mul_(d**-0.5 if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1), v).view(b, 1, heads, d)
