"""The trainer's shared-prefix forward: a prompt that several rows share is computed once.

GRPO samples G completions of every prompt, and the trainer's batch holds each prompt G times.
On the funcs family a prompt is ~120 tokens and a completion ~46, so ~70% of the trainer's
forward and backward was the same prompt recomputed G times. Here each distinct prefix (a
prompt minus its last token) runs through the layers once; every row runs only its suffix (the
prompt's last token and the completion), and its attention reads the keys and values of its
prefix, gathered into place, beside its own. The prefix's gradient is the sum of its rows'
(autograd accumulates through the gather). The same idea as "Prefix Grouper" (Liu et al. 2025,
shared-prefix forward for GRPO) and the shared-prompt packing of verl / slime, on tidal's
deterministic op set.

Bits: every op of the deterministic forward is row-invariant (tidal.numerics.ops: a token's
output depends on its own inputs and the keys it sees, never on how many other rows or keys share
the call; attention sums keys in fixed blocks, a key past the query adds an exact zero). A
prefix token's hidden state is therefore the same whether it runs in its own short row or in
every full row, and a suffix query sees exactly the keys, at exactly the positions, of the full
row. So the suffix's logits equal the full forward's bit for bit, and with them the engine's
recorded logprobs (tests/test_model_prefix.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from tidal.model.fused import FusedWeights, _rope
from tidal.numerics.deterministic import round_up
from tidal.numerics.ops import attention, attention_bias

if TYPE_CHECKING:
    from tidal.model.qwen3 import CausalLM


@dataclass
class SharedPrefix:
    """Prefixes shared by the rows of a forward.

    ids [G, Tp] long: each prefix's tokens at positions 0.., right-padded (any id).
    lengths [G] long: real tokens per prefix (>= 1); a row's suffix starts at its prefix's length.
    row [B] long: which prefix each suffix row continues.
    replay [G, Tp, layers, k] long or None: MoE experts to route the prefix tokens through.
    """

    ids: torch.Tensor
    lengths: torch.Tensor
    row: torch.Tensor
    replay: torch.Tensor | None = None

    def to(self, device) -> SharedPrefix:
        return SharedPrefix(*(None if t is None else t.to(device) for t in
                              (self.ids, self.lengths, self.row, self.replay)))


def shared_prefix_forward(model: CausalLM, w: FusedWeights, prefix: SharedPrefix,
                          input_ids: torch.Tensor, replay: torch.Tensor | None):
    """Suffix rows input_ids [B, Ts] (row b at positions lengths[row[b]] + 0..Ts-1; padding after
    its real tokens) -> (fp32 logits [B, Ts, V], per-layer router top-k of the suffix tokens
    [B*Ts, k] or Nones). ``replay`` [B*Ts, layers, k]: the suffix tokens' experts."""
    ops = w.ops
    if not hasattr(ops, "paths"):
        raise ValueError(f"the shared-prefix forward runs the deterministic op set, not {ops.name!r}")
    g, tp = prefix.ids.shape
    ts = input_ids.shape[1]
    starts = prefix.lengths[prefix.row]  # [B]
    positions = starts.unsqueeze(1) + torch.arange(ts, device=input_ids.device)  # [B, Ts]
    prefix_positions = torch.arange(tp, device=input_ids.device).expand(g, tp)
    prefix_ctx = ops.attention_context(prefix_positions, None, None, tp)
    length = round_up(int(positions.max()) + 1)
    suffix_bias = attention_bias(positions, length)
    index = _key_index(prefix, starts, ts, length)
    xp, xs = F.embedding(prefix.ids, w.embed), F.embedding(input_ids, w.embed)
    rope_p, rope_s = _rope(model, prefix_positions, None, tp, xp), _rope(model, positions, None, ts, xs)
    prefix_replay = None if prefix.replay is None else prefix.replay.flatten(0, 1)
    expert_ids: list[torch.Tensor | None] = []
    for i, layer in enumerate(w.layers):
        qp, kp, vp = _qkv(ops, layer, xp, rope_p, w)
        qs, ks, vs = _qkv(ops, layer, xs, rope_s, w)
        keys = _gather_keys(index, kp, ks)
        values = _gather_keys(index, vp, vs)
        path = ops.paths.attention
        xp = ops.linear(layer.o, _causal(qp, kp, vp, prefix_ctx, path), xp)
        xs = ops.linear(layer.o, attention(qs, keys, values, suffix_bias, path), xs)
        xp, _ = _mlp(ops, layer, xp, None if prefix_replay is None else prefix_replay[:, i], w)
        xs, ids = _mlp(ops, layer, xs, None if replay is None else replay[:, i], w)
        expert_ids.append(ids)
    return ops.linear(w.lm_head, ops.norm(xs, w.norm, w)).float(), expert_ids


def _qkv(ops, layer, x: torch.Tensor, rope, w):
    """q [N, T, heads, D], k, v [N, T, kv_heads, D] of hidden states x [N, T, H] (norm, matmul,
    q/k norms, RoPE): the steps of DeterministicOps.self_attention before it attends."""
    n, t = x.shape[:2]
    qkv = ops.linear(layer.qkv, ops.norm(x, layer.input_norm, w)).view(n, t, w.heads + 2 * w.kv_heads, w.head_dim)
    return ops.rotate_qk(qkv, layer.qk_norm, rope[0], rope[1], w)


def _causal(q, k, v, ctx, path: str) -> torch.Tensor:
    """Causal attention of a prefix over itself, as DeterministicOps.self_attention without a cache."""
    bias, length, _ = ctx
    pad = (0, 0, 0, length - q.shape[1])
    return attention(q, F.pad(k.transpose(1, 2), pad), F.pad(v.transpose(1, 2), pad), bias, path)


def _mlp(ops, layer, x: torch.Tensor, replay, w):
    """x + the layer's MLP (dense or MoE) of its post-attention norm -> (x, own top-k or None)."""
    h = ops.norm(x, layer.post_norm, w)
    if layer.router is None:
        gate, up = ops.linear(layer.gate_up, h).chunk(2, dim=-1)
        return ops.linear(layer.down, ops.silu_mul(gate, up), x), None
    out, ids = ops.moe(layer, h, replay, w)
    return x + out, ids


def _key_index(prefix: SharedPrefix, starts: torch.Tensor, ts: int, length: int) -> torch.Tensor:
    """[B, L] indices into cat(prefix keys [G*Tp], suffix keys [B*Ts], one zero row): key j of
    row b is its prefix's j-th token below starts[b], its own (j - starts[b])-th token from there
    for Ts tokens, and the zero row after (never seen: every query of the row is below it)."""
    g, tp = prefix.ids.shape
    b = prefix.row.shape[0]
    j = torch.arange(length, device=starts.device).expand(b, length)
    start = starts.unsqueeze(1)
    from_prefix = prefix.row.unsqueeze(1) * tp + j
    from_suffix = g * tp + torch.arange(b, device=starts.device).unsqueeze(1) * ts + (j - start)
    zero = torch.full_like(j, g * tp + b * ts)
    return torch.where(j < start, from_prefix, torch.where(j < start + ts, from_suffix, zero))


def _gather_keys(index: torch.Tensor, prefix: torch.Tensor, suffix: torch.Tensor) -> torch.Tensor:
    """Keys (or values) [B, kv_heads, L, D], contiguous as the full forward's padded ones, from
    the prefix's [G, Tp, kv_heads, D] and the suffix's [B, Ts, kv_heads, D] (see _key_index)."""
    heads, d = prefix.shape[2], prefix.shape[3]
    source = torch.cat((prefix.reshape(-1, heads, d), suffix.reshape(-1, heads, d),
                        suffix.new_zeros(1, heads, d)))
    return source[index].transpose(1, 2).contiguous()
