"""What a caller asks the engine for, and what it gets back.

A request's sampling fields default to None, meaning "use the engine's EngineConfig value", so
defaults live in one place. A result carries, per generated token, everything the trainer needs
to learn off-policy from it: the token id, its sampling logprob, the policy version whose weights
produced it and, for MoE models, the experts the router chose (see ``GenerationResult.experts``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

FinishReason = Literal["stop", "eos", "length"]


@dataclass
class GenerationRequest:
    """One prompt to complete.

    prompt_ids: token ids, non-empty; at most ``max_seq_len - 1`` of them (checked on submit).
    max_new_tokens / temperature / top_p / stop: per-request overrides; None = engine default.
        temperature 0 means greedy; top_p in (0, 1]; stop strings end generation once the decoded
        completion contains one (the stop string is kept in the output).
    ignore_eos: keep generating past the end-of-sequence token (benchmarks use it to force a
        fixed length); eos is then an ordinary token.
    tag: any caller payload, handed back untouched on the result.
    seed: the request's own random stream (``sampling.request_stream``): the token sampled at
        position p of its sequence draws the stream's p-th number, so what it samples depends on
        its prompt, weights and seed only, not on the batch it ran in, what the engine ran
        before, or which worker ran it (with batch-invariant numerics: engine.numerics =
        "deterministic"). None = a seed drawn from the engine's generator (engine.seed) when
        the request is admitted, so unseeded requests depend on their order.
    """

    prompt_ids: list[int]
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    ignore_eos: bool = False
    tag: Any = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if len(self.prompt_ids) == 0:
            raise ValueError("GenerationRequest.prompt_ids is empty: give at least one token")
        if self.temperature is not None and not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(
                f"GenerationRequest.temperature must be a finite number >= 0 (0 = greedy), "
                f"got {self.temperature}"
            )
        if self.top_p is not None and not (0 < self.top_p <= 1):
            raise ValueError(f"GenerationRequest.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(
                f"GenerationRequest.max_new_tokens must be >= 1, got {self.max_new_tokens}"
            )
        if self.stop is not None and any(s == "" for s in self.stop):
            raise ValueError("GenerationRequest.stop contains an empty string; remove it")


@dataclass
class GenerationResult:
    """A finished request. Per-token lists all have ``len(token_ids)`` entries.

    token_ids: the completion (prompt excluded), including the eos token or the token that
        completed a stop string.
    logprobs: sampling logprob of each token: ``log_softmax(logits / T)`` at the token, T the
        request's temperature (T = 0: ``log_softmax(logits)``); see ``tidal.engine.sampling``.
    versions: policy version of the weights that produced each token's logits. A sequence may
        span a weight update, so versions can increase along it.
    experts: MoE only (None for dense): ``experts[i][layer]`` is the list of k expert ids the
        router chose *at the position whose logits token i was sampled from*, i.e. at the last
        prompt token for i = 0 and at completion token i - 1 otherwise. So a full forward of
        ``prompt_ids + token_ids[:-1]`` with ``return_experts=True`` gives these at positions
        ``len(prompt_ids) - 1 ...``, the positions a trainer reads token i's logprob from.
    prompt_experts: MoE only (None for dense): the router's experts at prompt positions
        0 .. len(prompt_ids) - 2 (recorded during prefill), so that ``prompt_experts + experts``
        covers every position of ``prompt_ids + token_ids[:-1]``: a trainer can replay all of it.
    finish_reason: "eos" (end-of-sequence token), "stop" (a stop string), "length"
        (max_new_tokens reached, or the KV-cache slot is full at max_seq_len).
    text: the decoded completion.
    """

    request_id: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    experts: list[list[list[int]]] | None
    finish_reason: FinishReason
    text: str
    tag: Any = None
    prompt_experts: list[list[list[int]]] | None = None
