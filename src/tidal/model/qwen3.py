"""The Qwen3 / Llama decoder (dense) and Qwen3-MoE (every layer sparse), matching transformers'
numerics. Llama is Qwen3 without the per-head q/k RMSNorms (``ModelConfig.qk_norm = False``); its
state_dict then has exactly transformers' LlamaForCausalLM tensor names.

Module and parameter names equal Hugging Face's (``model.layers.3.self_attn.q_proj.weight``), so a
state_dict is an HF checkpoint up to one difference: experts are stored fused, as transformers
5.x does in memory (``mlp.experts.gate_up_proj`` [E, 2*I, H], ``mlp.experts.down_proj`` [E, H, I]);
checkpoint.py converts to and from the per-expert names that published checkpoints use.

One forward serves three callers:
- the trainer: ``model(ids)`` (causal over the given tokens; pad on the right), optionally with
  ``replay_experts`` so the MoE uses the experts the sampler used (router replay);
- the engine: ``model(ids, positions, cache, slots)`` writes k/v into per-slot cache rows and
  attends to positions 0..p of the slot (prefill T>1, decode T=1, mixed lengths in one batch);
- either may ask ``return_experts=True`` to get the router's own top-k ids [B, T, layers, k]
  (under replay too: the replayed ids are the caller's already; these show where they differ).

The modules here are the Hugging Face reference (the trainer's fast path). Everything else runs
the one fused forward (fused.py) on an op set: the KV-cached engine path (fast ops), and with
``deterministic=True`` the batch-invariant ops, with or without a cache: the engine's default, and
what the trainer runs to reproduce the engine's sampling logprobs bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tidal.model.config import ModelConfig
from tidal.model.fused import FusedWeights, fused_forward
from tidal.model.kv_cache import KVCache, make_plan
from tidal.model.shared_prefix import SharedPrefix, shared_prefix_forward
from tidal.model.rope import RopeTable, apply_rope
from tidal.numerics import make_ops
from tidal.numerics.moe import dispatch_to_experts
from tidal.numerics.probe import ProbeShapes


class RMSNorm(nn.Module):
    """Normalises in fp32 and casts back before the weight, exactly as transformers does, so
    bf16 results agree bit for bit with the reference."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        # Qwen3's per-head norms; Llama has none (and no such tensors in its state_dict)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x, cos, sin) -> torch.Tensor:
        """x [B, T, H], cos/sin [B, 1, T, D] -> [B, T, H], causal over T (no cache: the cached
        forward is fused.py's)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """Dense SwiGLU."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Experts(nn.Module):
    """E SwiGLU experts as two 3-D tensors (transformers 5.x layout: gate rows, then up rows)."""

    def __init__(self, num_experts: int, hidden: int, inter: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inter))

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, H], ids/weights [N, k] -> [N, H] (numerics/moe.py)."""
        return dispatch_to_experts(x, ids, weights, self.gate_up_proj.shape[0], self._mlp)

    def _mlp(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[e])


class SparseMoE(nn.Module):
    """Qwen3-MoE block: router -> softmax -> top-k (or replayed ids) -> optional renorm -> experts."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)

    def forward(self, x: torch.Tensor, replay: torch.Tensor | None):
        """x [B, T, H]; replay [B*T, k] or None -> (out [B, T, H], router's own top-k [B*T, k]).

        With replay the experts are the replayed ids and the gate weights are this model's own
        router probabilities gathered at them, so the router keeps its gradient while the experts
        match the sampler's."""
        flat = x.reshape(-1, x.shape[-1])
        probs = F.softmax(self.gate(flat), dim=-1, dtype=torch.float)
        weights, own = torch.topk(probs, self.top_k, dim=-1)
        ids = own
        if replay is not None:
            ids = replay
            weights = probs.gather(-1, ids)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = self.experts(flat, ids, weights.to(x.dtype))
        return out.view_as(x), own


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = SparseMoE(cfg) if cfg.is_moe else MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, replay):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        h = self.post_attention_layernorm(x)
        if isinstance(self.mlp, SparseMoE):
            out, ids = self.mlp(h, replay)
            return x + out, ids
        return x + self.mlp(h), None


class Backbone(nn.Module):
    """HF's ``model.`` prefix: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope = RopeTable(config.head_dim, config.rope_theta)
        self._fused: dict[str, FusedWeights] = {}
        self.register_load_state_dict_post_hook(_drop_fused_weights_after_load)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share lm_head with the embeddings when the config says so (call again after any
        operation that replaces parameters, e.g. load_state_dict(assign=True))."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.drop_fused_weights()

    def fused_weights(self, mode: str, dtype: torch.dtype) -> FusedWeights:
        """The fused forward's weights for op set ``mode`` ("fast" | "deterministic") in
        ``dtype``: inference copies cached per mode until a parameter changes (engine), or built
        per call with autograd when grad is enabled (trainer, deterministic only)."""
        grad = torch.is_grad_enabled()
        cached = self._fused.get(mode)
        if not grad and cached is not None and cached.is_current(mode, dtype):
            return cached
        device = self.model.embed_tokens.weight.device
        ops = make_ops(mode, dtype, ProbeShapes.of_model(self.config), device)
        if grad:
            if not ops.trainable:
                raise RuntimeError(f"the {mode} op set is inference-only; run it under "
                                   "torch.inference_mode() or torch.no_grad()")
            return FusedWeights(self, ops, dtype, trainable=True)
        cached = self._fused[mode] = FusedWeights(self, ops, dtype, trainable=False)
        return cached

    def drop_fused_weights(self) -> None:
        """Forget the derived inference weights (parameters were replaced); the next inference
        forward rebuilds them."""
        self._fused = {}

    def __getstate__(self):
        """Pickle and deepcopy without the fused weights: derived data, and oneDNN-packed
        tensors cannot be serialised. A copy rebuilds them on its first fused forward."""
        state = dict(super().__getstate__())
        state["_fused"] = {}
        return state

    def _apply(self, fn, recurse=True):
        """.to() / .float() / .cuda() may replace every parameter: drop the fused copies."""
        self.drop_fused_weights()
        return super()._apply(fn, recurse)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        slots: torch.Tensor | range | None = None,
        replay_experts: torch.Tensor | None = None,
        return_experts: bool = False,
        logits_at: torch.Tensor | None = None,
        deterministic: bool = False,
        dtype: torch.dtype | None = None,
        prefix: SharedPrefix | None = None,
    ):
        """input_ids [B, T] -> fp32 logits [B, T, vocab], or (logits, experts [B, T, layers, k] |
        None) with return_experts.

        cache + slots (engine): slot ids [B], or a ``range`` of consecutive slots (read without a
        copy); the forward writes k/v at ``positions`` and attends to 0..p of each slot.
        Positions < 0 mark padding: not written, garbage logits and experts. Inference only.
        Without a cache attention is causal over the given order and positions only set RoPE.
        logits_at [B]: compute logits only at column ``logits_at[b]`` of each row -> [B, vocab]
        (prefill needs only each prompt's last position; experts stay [B, T, layers, k]).
        deterministic: the batch-invariant forward (tidal.numerics), with or without a cache,
        computing in ``dtype`` (None: the parameters' dtype; the trainer passes the engine's).
        prefix: rows continue shared prefixes computed once (model/shared_prefix.py; deterministic,
        no cache, positions implied); logits and experts cover the given suffix tokens only.
        """
        b, t = input_ids.shape
        if prefix is not None:
            return self._prefix_forward(input_ids, prefix, replay_experts, return_experts, dtype)
        explicit = positions is not None
        if positions is None:
            positions = torch.arange(t, device=input_ids.device).expand(b, t)
        elif positions.shape != (b, t):
            raise ValueError(
                f"positions has shape {tuple(positions.shape)}, expected {(b, t)} like input_ids"
            )
        replay = self._check_replay(replay_experts, b, t)
        if deterministic or cache is not None:
            plan = None if cache is None else make_plan(cache, slots, positions)  # clear errors first
            if cache is not None and torch.is_grad_enabled():
                raise RuntimeError("the KV-cached forward is inference-only; run it under "
                                   "torch.inference_mode() or torch.no_grad()")
            mode = "deterministic" if deterministic else "fast"
            weights = self.fused_weights(mode, dtype or self.model.embed_tokens.weight.dtype)
            logits, expert_ids = fused_forward(
                self, weights, input_ids, positions, cache, plan, replay, logits_at
            )
        else:
            logits, expert_ids = self._forward(input_ids, positions, explicit, replay, logits_at)
        if not return_experts:
            return logits
        if not self.config.is_moe:
            return logits, None
        return logits, torch.stack(expert_ids, dim=1).view(b, t, len(expert_ids), -1)

    def _prefix_forward(self, input_ids, prefix: SharedPrefix, replay_experts, return_experts, dtype):
        """model/shared_prefix.py's forward of suffix rows over shared prefixes (deterministic)."""
        b, t = input_ids.shape
        replay = self._check_replay(replay_experts, b, t)
        if prefix.replay is not None:
            self._check_replay(prefix.replay, *prefix.ids.shape)
        weights = self.fused_weights("deterministic", dtype or self.model.embed_tokens.weight.dtype)
        logits, expert_ids = shared_prefix_forward(self, weights, prefix, input_ids, replay)
        if not return_experts:
            return logits
        if not self.config.is_moe:
            return logits, None
        return logits, torch.stack(expert_ids, dim=1).view(b, t, len(expert_ids), -1)

    def _forward(self, input_ids, positions, explicit: bool, replay, logits_at):
        """The module forward (trainer, reference): causal over the given tokens, no cache."""
        b, t = input_ids.shape
        if explicit:
            positions = positions.clamp(min=0)
            needed = int(positions.max()) + 1 if positions.numel() else 1
        else:
            needed = t
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rope.lookup(positions, x.dtype, needed)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, D]: broadcast over heads
        expert_ids = []
        for i, layer in enumerate(self.model.layers):
            x, ids = layer(x, cos, sin, None if replay is None else replay[:, i])
            expert_ids.append(ids)
        if logits_at is not None:
            x = x[torch.arange(b, device=x.device), logits_at]
        return self.lm_head(self.model.norm(x)).float(), expert_ids

    def _check_replay(self, replay: torch.Tensor | None, b: int, t: int) -> torch.Tensor | None:
        """Validate replayed ids [B, T, layers, k] and flatten them to [B*T, layers, k]."""
        if replay is None:
            return None
        cfg = self.config
        if not cfg.is_moe:
            raise ValueError("replay_experts was given but the model is dense (model.num_experts = 0)")
        want = (b, t, cfg.num_hidden_layers, cfg.num_experts_per_tok)
        if tuple(replay.shape) != want:
            raise ValueError(
                f"replay_experts has shape {tuple(replay.shape)}, expected [B, T, layers, k] = {want}"
            )
        if replay.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"replay_experts must hold integer expert ids, got {replay.dtype}")
        if replay.numel() and (int(replay.min()) < 0 or int(replay.max()) >= cfg.num_experts):
            raise ValueError(
                f"replay_experts holds ids outside [0, {cfg.num_experts}); pad with any valid id "
                "(padding tokens' logits are ignored anyway)"
            )
        return replay.reshape(b * t, cfg.num_hidden_layers, -1).long()


def _drop_fused_weights_after_load(model: CausalLM, incompatible_keys) -> None:
    """A load may replace parameters (assign=True); in-place copies are caught by versions too.
    A module-level function, not a lambda, so the model still pickles."""
    model.drop_fused_weights()


@torch.no_grad()
def init_weights(model: CausalLM, generator: torch.Generator | None = None) -> None:
    """transformers' Qwen3 (and Llama) init: every matrix (embeddings, projections, router,
    experts) from normal(0, initializer_range), norm weights 1."""
    std = model.config.initializer_range
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, std, generator=generator)


def build_model(cfg: ModelConfig, seed: int | None = None,
                device: torch.device | str = "cpu") -> CausalLM:
    """A randomly initialised model in cfg.dtype on ``device`` (made and initialised there: a
    2B-parameter model needs no fp32 copy in host memory); seed makes it reproducible without
    touching the global RNG (a generator on ``device``: other numbers on a GPU than on the CPU)."""
    generator = None if seed is None else torch.Generator(device).manual_seed(seed)
    with torch.device(device):
        model = CausalLM(cfg)
    init_weights(model, generator)
    return model.to(getattr(torch, cfg.dtype))
