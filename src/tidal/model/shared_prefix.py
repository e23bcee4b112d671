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

from tidal.model.fused import FusedWeights, fused_forward
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
    [B*Ts, k] or Nones). ``replay`` [B*Ts, layers, k]: the suffix tokens' experts.

    The one fused forward (fused.py) runs every prefix token and every suffix token as one row
    (each op but attention is row-invariant, so the row they share changes no bit);
    ``PrefixAttention`` says who attends to whom."""
    ops = w.ops
    if not hasattr(ops, "paths"):
        raise ValueError(f"the shared-prefix forward runs the deterministic op set, not {ops.name!r}")
    if (replay is None) != (prefix.replay is None):
        raise ValueError("route the prefix and the suffix through recorded experts together: "
                         "give both SharedPrefix.replay and replay, or neither")
    g, tp = prefix.ids.shape
    b, ts = input_ids.shape
    device = input_ids.device
    starts = prefix.lengths[prefix.row]  # [B]
    positions = starts.unsqueeze(1) + torch.arange(ts, device=device)  # [B, Ts]
    prefix_positions = torch.arange(tp, device=device).expand(g, tp)
    ids = torch.cat((prefix.ids.reshape(1, -1), input_ids.reshape(1, -1)), dim=1)
    both = torch.cat((prefix_positions.reshape(1, -1), positions.reshape(1, -1)), dim=1)
    if replay is not None:
        replay = torch.cat((prefix.replay.flatten(0, 1), replay))
    attend = PrefixAttention(w, prefix, starts, positions)
    logits, expert_ids = fused_forward(model, w, ids, both, None, None, replay, None, attend,
                                       logits_from=g * tp, logits_rows=b)
    return logits, [None if e is None else e[g * tp:] for e in expert_ids]


class PrefixAttention:
    """fused_forward's attention for the shared-prefix row: the prefix tokens attend causally
    within their prefix, each suffix token to its prefix's keys (gathered into place) and to its
    own row's up to itself, in the same key blocks and order as the full rows'."""

    def __init__(self, w: FusedWeights, prefix: SharedPrefix, starts: torch.Tensor,
                 positions: torch.Tensor):
        self.w, self.ops, self.path = w, w.ops, w.ops.paths.attention
        (self.g, self.tp), (self.b, self.ts) = prefix.ids.shape, positions.shape
        prefix_positions = torch.arange(self.tp, device=positions.device).expand(self.g, self.tp)
        self.prefix_ctx = self.ops.attention_context(prefix_positions, None, None, self.tp)
        length = round_up(int(positions.max()) + 1)
        self.suffix_bias = attention_bias(positions, length)
        self.index = _key_index(prefix, starts, self.ts, length)

    def __call__(self, qkv: torch.Tensor, qk_norm, cos, sin) -> torch.Tensor:
        q, k, v = self.ops.rotate_qk(qkv, qk_norm, cos, sin, self.w)  # [1, N, heads, D]
        n = self.g * self.tp
        qp, kp, vp = (x[0, :n].unflatten(0, (self.g, self.tp)) for x in (q, k, v))
        qs, ks, vs = (x[0, n:].unflatten(0, (self.b, self.ts)) for x in (q, k, v))
        keys, values = _gather_keys(self.index, kp, ks), _gather_keys(self.index, vp, vs)
        out_p = _causal(qp, kp, vp, self.prefix_ctx, self.path)
        out_s = attention(qs, keys, values, self.suffix_bias, self.path)
        return torch.cat((out_p.flatten(0, 1), out_s.flatten(0, 1))).unsqueeze(0)


def _causal(q, k, v, ctx, path: str) -> torch.Tensor:
    """Causal attention of a prefix over itself, as DeterministicOps.self_attention without a cache."""
    bias, length, _ = ctx
    pad = (0, 0, 0, length - q.shape[1])
    return attention(q, F.pad(k.transpose(1, 2), pad), F.pad(v.transpose(1, 2), pad), bias, path)


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
