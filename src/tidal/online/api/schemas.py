"""Request bodies of the API (pydantic, strict: a wrong type is an error, not a coercion; an
unknown field is an error, not ignored), in OpenAI's shapes.

Responses are OpenAI's shapes (built in api/render.py) plus two fields naming the exact policy:
``tidal_version`` (int) and ``tidal_manifest_sha256`` (hex, tidal.online.weights.weights_digest),
also sent as the headers X-Tidal-Version and X-Tidal-Manifest-Sha256.

Limits that depend on the config (max_tokens, n, body size) are checked in api/app.py.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tidal.online.api.chat import ROLES
from tidal.online.records import SIGNALS

MAX_STOP = 4
"""Stop strings per request (OpenAI's limit)."""
MAX_SEED = 2**63
"""Seeds are in [0, MAX_SEED) (the harness derives 63-bit seeds: tidal.harness.seeds): choice i
of a request samples with seed + i."""

NonEmpty = Annotated[str, Field(min_length=1, max_length=256)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Sampled(Body):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    """The served model's id (serve.model_name); None = it. Another name is a 404."""
    max_tokens: int | None = Field(None, ge=1)
    """Completion tokens at most; None = serve.max_tokens (also the largest accepted)."""
    temperature: float | None = Field(None, ge=0, le=2)
    """None = engine.temperature; 0 = greedy."""
    top_p: float | None = Field(None, gt=0, le=1)
    """None = engine.top_p."""
    n: int = Field(1, ge=1)
    """Choices (at most serve.max_n); each is recorded and can get its own feedback."""
    stop: NonEmpty | Annotated[list[NonEmpty], Field(max_length=MAX_STOP)] | None = None
    """Generation ends at a stop string, which is cut from the text (OpenAI's behaviour);
    None = engine.stop."""
    seed: int | None = Field(None, ge=0, lt=MAX_SEED)
    stream: bool = False
    user: str | None = Field(None, max_length=256)
    ignore_eos: bool = False
    """vLLM's extension: keep generating past the end-of-sequence token (benchmarks use it to
    make every request the same length)."""
    presence_penalty: float | None = None
    """OpenAI's; tidal does not implement it: accepted only at its neutral value (0 or absent)."""
    frequency_penalty: float | None = None
    """As presence_penalty."""
    logit_bias: dict[str, float] | None = None
    """OpenAI's; accepted only empty or absent."""

    @field_validator("presence_penalty", "frequency_penalty", "logit_bias")
    @classmethod
    def _neutral_only(cls, value, info):
        """Clients often send these at their defaults; anything else would be silently ignored,
        so it is refused, naming the field."""
        if value not in (None, 0, 0.0, {}):
            raise ValueError(f"tidal serve does not implement {info.field_name}; send its "
                             "neutral value (0, or {} for logit_bias) or leave it out")
        return value


class CompletionRequest(Sampled):
    prompt: str | list[Annotated[int, Field(ge=0)]]
    """Text, or token ids."""
    logprobs: int | None = Field(None, ge=0, le=5)
    """Return per-token logprobs; top_logprobs holds the sampled token (the engine keeps no
    other alternatives)."""
    return_token_ids: bool = False
    """vLLM's extension: each choice also carries ``prompt_token_ids`` and ``token_ids`` (every
    sampled token, the eos or stop-string tokens included), and tidal's own per-token fields
    for a rollout worker (tidal.engine.remote): ``tidal_logprobs`` (the sampling logprob of
    every token id), ``tidal_versions``, ``tidal_finish_reason`` (eos | stop | length)."""
    tidal_return_experts: bool = False
    """MoE: with return_token_ids, each choice also carries ``tidal_experts`` and
    ``tidal_prompt_experts`` (tidal.engine.request.GenerationResult: the experts the router
    chose), so the trainer can replay the routing; null for a dense model."""


class UpdateWeightsRequest(Body):
    """POST /v1/tidal/update_weights: load ``version`` from a training run's weight transport and
    serve it live (a rollout worker's reload call, tidal.engine.remote)."""

    version: int = Field(ge=0)
    weights: NonEmpty
    """Where the version is: the run's weight origin URL (transport "http", pulled as a delta
    against the version held, every tensor verified) or its weights folder ("filesystem")."""
    transport: Literal["http", "filesystem"] = "http"


class TextPart(Body):
    type: Literal["text"]
    text: str


class ChatMessage(Body):
    role: Literal[ROLES]
    content: str | list[TextPart]
    name: str | None = None


class ChatRequest(Sampled):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = Field(None, ge=1)
    """OpenAI's newer name for max_tokens (either may be given)."""
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class FeedbackRequest(Body):
    response_id: NonEmpty
    """The id of a response this server returned (cmpl-... / chatcmpl-...)."""
    index: int = Field(0, ge=0, lt=1024)
    """Which choice of that response."""
    signal: Literal[SIGNALS]
    """accepted | edited | rejected | dissatisfied | scalar (tidal.online.records.Signal)."""
    value: float | None = Field(None, ge=-1, le=1)
    """Only with signal "scalar": a number in [-1, 1]."""
