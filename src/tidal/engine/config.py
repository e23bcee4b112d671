"""Inference engine: batching limits and the sampler."""

from typing import Literal

from pydantic import Field, model_validator

from tidal.section import Section


class EngineConfig(Section):
    max_batch_size: int = Field(128, ge=1)
    """Sequences decoded together (KV-cache slots). Requests beyond it wait in a queue."""
    max_seq_len: int = Field(256, ge=8)
    """Longest prompt + completion in tokens a slot can hold."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature; 0 = greedy. Logprobs are of the distribution actually sampled."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass (1.0 = off)."""
    max_new_tokens: int = Field(96, ge=1)
    """Completion length cap per request, in tokens."""
    stop: list[str] = ["\n\n"]
    """Stop strings: generation ends once the decoded completion contains one (kept in output)."""
    seed: int = 0
    """Seed of the engine's generator, which seeds the requests that carry no seed of their own
    (GenerationRequest.seed). RL rollouts and held-out evaluation carry their own, derived from
    run.seed, so in `tidal train` this one plays no part."""
    max_prefill_tokens: int = Field(8192, ge=1)
    """Padded tokens (requests x longest prompt) per prefill forward; bounds the activation and
    logits memory of admitting many requests at once. A single longer prompt still runs alone."""
    numerics: Literal["deterministic", "fast"] = "deterministic"
    """deterministic: batch-invariant kernels (tidal.numerics), so every sampling logprob is bit
    for bit what the trainer recomputes for that token (the trainer runs the same forward);
    fast: the fused forward on fast ops (numerics/fast.py), faster per step but off by ~1e-6 from the trainer,
    and with it MoE routing that can flip."""
    prefix_cache: bool = True
    """Keep a finished request's KV cache in its (now free) slot, and when a new prompt starts
    with that request's tokens, prefill only the rest. A multi-turn episode sends its whole
    context again each turn (context + last turn + observation), so this turns its prefill from
    the whole context into the new observation. Prefixes match in whole blocks of 16 tokens.
    A parked cache in the way of an admission moves to an empty free slot, or is dropped if
    none is left; a weight update drops them all (their keys are of the old weights)."""
    recompute_kv_on_reload: bool = True
    """On a weight update, recompute the KV cache of in-flight sequences with the new weights, so
    every token after the update is exactly what the new policy gives for its whole context (one
    prefill of the running batch per update). False keeps the stale cache: faster, slightly
    off-policy."""

    @model_validator(mode="after")
    def _check(self) -> "EngineConfig":
        if self.max_new_tokens >= self.max_seq_len:
            raise ValueError(
                f"engine.max_new_tokens ({self.max_new_tokens}) must be below "
                f"engine.max_seq_len ({self.max_seq_len}) to leave room for the prompt"
            )
        return self
