"""A functional Qwen3-MoE forward over flat token rows and a KV cache, on swappable ops.

Same architecture and math as ``tidal.model.qwen3`` (RMSNorm, GQA attention with q/k RMSNorm and
RoPE, softmax router with top-k and renormalised gates, SwiGLU experts); ``MoEShape`` uses
``ModelConfig``'s field names. It exists beside qwen3.py for the GPU numerics benchmark: every op
goes through an ``ops`` object (ops.py) so one forward runs in fast or deterministic mode, and it
imports nothing but torch (the GPU machine has no pydantic). ``from_tidal_state_dict`` loads a
tidal/HF state dict, and a test checks it against qwen3.py on the same weights.

One forward serves both sides: the engine (prefill: whole prompts; decode: one token per slot)
and the trainer (whole sequences into a fresh cache), each token given as (slot, position).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class MoEShape:
    """Architecture sizes, named as in ``tidal.model.config.ModelConfig``."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    max_position_embeddings: int = 1024
    """Longest sequence (prompt + completion) in tokens; the RoPE table is built once this long."""
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    norm_topk_prob: bool = True
    initializer_range: float = 0.02

    def param_count(self) -> int:
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (2 * self.num_attention_heads + 2 * self.num_key_value_heads) + 2 * d
        moe = self.num_experts * (h + 3 * h * self.moe_intermediate_size)
        return 2 * self.vocab_size * h + h + self.num_hidden_layers * (attn + moe + 2 * h)

    def as_dict(self) -> dict:
        return asdict(self)


SIZES: dict[str, MoEShape] = {
    # CPU runs and tests: a few seconds with the pure-torch reference ops.
    "tiny": MoEShape(vocab_size=260, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                     moe_intermediate_size=32),
    # GPU smoke: every kernel path at once, in seconds.
    "smoke": MoEShape(vocab_size=4096, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=128),
    # The GPU benchmark: ~2.1B parameters (Qwen3-30B-A3B's layer shapes, fewer layers/experts).
    "1b": MoEShape(vocab_size=32768, hidden_size=2048, num_hidden_layers=12, num_attention_heads=16,
                   num_key_value_heads=4, head_dim=128, num_experts=32, num_experts_per_tok=4,
                   moe_intermediate_size=768),
}


@dataclass
class Layer:
    input_norm: torch.Tensor   # [H]
    qkv: torch.Tensor          # [(Hq + 2 Hkv) D, H]: q_proj, k_proj, v_proj rows stacked
    q_norm: torch.Tensor       # [D]
    k_norm: torch.Tensor       # [D]
    o_proj: torch.Tensor       # [H, Hq D]
    post_norm: torch.Tensor    # [H]
    router: torch.Tensor       # [E, H]
    gate_up: torch.Tensor      # [E, 2 I, H]: gate rows, then up rows
    down: torch.Tensor         # [E, H, I]


class MoEModel:
    """Weights (bf16 or fp32, on one device) and the forward."""

    def __init__(self, shape: MoEShape, embed, layers: list[Layer], norm, lm_head):
        self.shape, self.embed, self.layers, self.norm, self.lm_head = shape, embed, layers, norm, lm_head
        # built once, full length: every caller looks up the same numbers (no per-call rebuild)
        self._rope = rope_table(shape.head_dim, shape.rope_theta, shape.max_position_embeddings,
                                embed.device)

    @classmethod
    def random(cls, shape: MoEShape, device, dtype=torch.bfloat16, seed: int = 0) -> MoEModel:
        """transformers' init: matrices from normal(0, initializer_range), norms 1."""
        gen = torch.Generator(device=device).manual_seed(seed)
        s, h, d, e, i = shape, shape.hidden_size, shape.head_dim, shape.num_experts, shape.moe_intermediate_size

        def normal(*size):
            return torch.empty(size, device=device, dtype=dtype).normal_(0.0, s.initializer_range, generator=gen)

        def ones(n):
            return torch.ones(n, device=device, dtype=dtype)

        qkv_rows = (s.num_attention_heads + 2 * s.num_key_value_heads) * d
        layers = [Layer(ones(h), normal(qkv_rows, h), ones(d), ones(d),
                        normal(h, s.num_attention_heads * d), ones(h), normal(e, h),
                        normal(e, 2 * i, h), normal(e, h, i)) for _ in range(s.num_hidden_layers)]
        return cls(shape, normal(s.vocab_size, h), layers, ones(h), normal(s.vocab_size, h))

    @classmethod
    def from_tidal_state_dict(cls, shape: MoEShape, sd: dict[str, torch.Tensor]) -> MoEModel:
        """From ``tidal.model.qwen3.CausalLM.state_dict()`` (HF names, fused experts)."""
        def layer(n):
            p = f"model.layers.{n}."
            return Layer(sd[p + "input_layernorm.weight"],
                         torch.cat([sd[p + f"self_attn.{x}_proj.weight"] for x in "qkv"]),
                         sd[p + "self_attn.q_norm.weight"], sd[p + "self_attn.k_norm.weight"],
                         sd[p + "self_attn.o_proj.weight"], sd[p + "post_attention_layernorm.weight"],
                         sd[p + "mlp.gate.weight"], sd[p + "mlp.experts.gate_up_proj"],
                         sd[p + "mlp.experts.down_proj"])

        return cls(shape, sd["model.embed_tokens.weight"],
                   [layer(n) for n in range(shape.num_hidden_layers)],
                   sd["model.norm.weight"], sd["lm_head.weight"])

    def new_cache(self, slots: int, max_len: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K and V caches [slots, Hkv, max_len, D], zeroed."""
        s = self.shape
        size = (slots, s.num_key_value_heads, max_len, s.head_dim)
        make = lambda: torch.zeros(size, dtype=self.embed.dtype, device=self.embed.device)
        return [make() for _ in self.layers], [make() for _ in self.layers]

    def forward(self, ops, tokens, slot, pos, cache, span: int, seg_lens=None, replay=None):
        """tokens/slot/pos [N] -> (final hidden [N, H], expert ids [N, layers, k]).

        Writes each token's K/V into ``cache`` at (slot, pos) and attends to 0..pos of its slot.
        span: 1 + the largest position (a host int, so nothing waits on the GPU; the fast
        decode's key window); seg_lens: lengths of whole sequences (from position 0) laid end to
        end, or None for decode (any positions, one token per slot).
        replay [N, layers, k]: use these experts instead of the router's top-k (router replay:
        gates are still this model's own softmax probabilities at those experts).
        """
        s = self.shape
        heads = (s.num_attention_heads, s.num_key_value_heads, s.head_dim)
        rope = ops.rope_at(self._rope, pos, self.embed.dtype)
        x = self.embed[tokens]
        chosen = []
        for i, layer in enumerate(self.layers):
            h = ops.rms_norm(x, layer.input_norm, s.rms_norm_eps)
            attn = ops.self_attention(ops.linear(h, layer.qkv), layer.q_norm, layer.k_norm, rope,
                                      cache[0][i], cache[1][i], slot, pos, seg_lens, span, heads,
                                      s.rms_norm_eps)
            x = ops.linear(attn.reshape(attn.shape[0], -1), layer.o_proj, residual=x)
            h = ops.rms_norm(x, layer.post_norm, s.rms_norm_eps)
            ids, gates = ops.route(ops.linear(h, layer.router), s.num_experts_per_tok,
                                   s.norm_topk_prob, None if replay is None else replay[:, i])
            x = ops.experts(h, ids, gates, layer.gate_up, layer.down, residual=x)
            chosen.append(ids)
        return ops.rms_norm(x, self.norm, s.rms_norm_eps), torch.stack(chosen, dim=1)

    def logprobs(self, ops, hidden) -> torch.Tensor:
        """Final hidden rows [R, H] -> fp32 log-probabilities [R, vocab]."""
        return ops.softmax(ops.linear(hidden, self.lm_head, out_dtype=torch.float32), log=True)


def rope_table(head_dim: int, theta: float, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """HF "default" RoPE cos/sin [n, D] in fp32 for positions 0..n-1."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim)
    freqs = torch.arange(n, device=device).float()[:, None] * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()
