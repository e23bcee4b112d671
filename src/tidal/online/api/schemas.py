"""Request bodies of the API (pydantic, strict: a wrong type is an error, not a coercion; an
unknown field is an error, not ignored), in OpenAI's shapes.

Responses are OpenAI's shapes (built in api/render.py) plus two fields naming the exact policy:
``tidal_version`` (int) and ``tidal_manifest_sha256`` (hex, tidal.online.version_sync.weights_digest),
also sent as the headers X-Tidal-Version and X-Tidal-Manifest-Sha256.

Limits that depend on the config (max_tokens, n, body size) are checked in api/app.py.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tidal.chat.template import ROLES
from tidal.chat.tool_calls import TOOL_NAME, check_parameters
from tidal.online.records import SIGNALS

MAX_STOP = 4
"""Stop strings per request (OpenAI's limit)."""
MAX_TOOLS = 128
"""Tools per request (OpenAI's limit)."""
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


class CalledFunction(Body):
    name: NonEmpty
    arguments: str
    """A JSON object as text (OpenAI's shape; api/tools.template_messages parses it)."""


class MessageToolCall(Body):
    """A tool call an earlier assistant message made (as a response returned it)."""

    id: NonEmpty
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(Body):
    role: Literal[ROLES]
    content: str | list[TextPart] | None = None
    """Required, except in an assistant message with tool_calls (then it may be null)."""
    name: str | None = None
    tool_calls: Annotated[list[MessageToolCall], Field(min_length=1)] | None = None
    """Assistant messages only: the calls it made."""
    tool_call_id: NonEmpty | None = None
    """Tool messages only (and required there): the id of the call this message answers."""

    @model_validator(mode="after")
    def _tool_fields(self):
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls is only for assistant messages, not {self.role!r}")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message needs tool_call_id (the id of the call it answers)"
                             if self.role == "tool" else
                             f"tool_call_id is only for tool messages, not {self.role!r}")
        if self.content is None and self.tool_calls is None:
            raise ValueError("content is required (null only in an assistant message with "
                             "tool_calls)")
        return self


class FunctionDef(Body):
    name: Annotated[str, Field(pattern=TOOL_NAME)]
    """Letters, digits, _ and -, at most 64 (OpenAI's rule)."""
    description: str | None = None
    parameters: dict | None = None
    """A JSON Schema (checked as draft 2020-12) of the arguments object."""
    strict: bool | None = None
    """OpenAI's structured-output promise; tidal does not constrain decoding, so only false or
    absent is accepted."""

    @field_validator("parameters")
    @classmethod
    def _schema(cls, value):
        return value if value is None else check_parameters(value)

    @field_validator("strict")
    @classmethod
    def _not_strict(cls, value):
        if value:
            raise ValueError("tidal serve does not constrain decoding to a schema; send strict: "
                             "false or leave it out")
        return value


class Tool(Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Body):
    name: NonEmpty


class NamedToolChoice(Body):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(Sampled):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = Field(None, ge=1)
    """OpenAI's newer name for max_tokens (either may be given)."""
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    """Functions the model may call (api/tools.py: how calls are parsed back)."""
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    """None = "auto" with tools; only with tools."""
    parallel_tool_calls: bool | None = None
    """None = true; false keeps a reply's first call only."""


class FeedbackRequest(Body):
    response_id: NonEmpty
    """The id of a response this server returned (cmpl-... / chatcmpl-...)."""
    index: int = Field(0, ge=0, lt=1024)
    """Which choice of that response."""
    signal: Literal[SIGNALS]
    """accepted | edited | rejected | dissatisfied | scalar (tidal.online.records.Signal)."""
    value: float | None = Field(None, ge=-1, le=1)
    """Only with signal "scalar": a number in [-1, 1]."""
