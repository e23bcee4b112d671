"""The typed records real-time RL passes between its parts (server, store, learner, gate).

    ServedResponse   one completion the server returned (one per choice of a request)
    FeedbackEvent    what a user said about one of them
    LearnEvent       a feedback event joined to its response: what the learner trains on
    VersionRecord    one policy version in the registry: parent, manifest hash, gate and canary
                     results, status, traffic share

Plain dataclasses, no I/O: the store (online/store) writes and reads them, the rest compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Signal = Literal["accepted", "edited", "rejected", "dissatisfied", "scalar"]
"""accepted: kept as it was; edited: edited, then kept; rejected; dissatisfied: a follow-up
saying it did not help; scalar: a number in [-1, 1] (``FeedbackEvent.value``)."""

SIGNALS: tuple[str, ...] = ("accepted", "edited", "rejected", "dissatisfied", "scalar")

Behaviour = Literal["action", "question", "empty", "invalid_tool_call", "other"]
"""What a response did (online/behaviour.py classifies): acted (code or a valid tool call),
asked a question instead, showed nothing, wrote a tool call that does not parse, or none."""

Status = Literal["candidate", "blocked", "canary", "live", "retired", "rolled_back"]
"""A version's place: made by the learner (candidate), failed the gate (blocked), serving a
share of traffic (canary), the incumbent (live; one at a time), replaced by a promoted one
(retired), failed its canary or rolled back by hand (rolled_back)."""

STATUSES: tuple[str, ...] = ("candidate", "blocked", "canary", "live", "retired", "rolled_back")


@dataclass
class ServedResponse:
    """One choice of one API response, recorded before the response is returned.

    id: the response id the API returned (``cmpl-...`` / ``chatcmpl-...``); with ``n`` > 1 each
        choice is its own record, told apart by ``index``.
    version / manifest_sha256: the exact policy version that produced every token and the
        sha256 of that version's weight manifest (as named in the response).
    prompt_ids, token_ids, logprobs: the engine's tokens and sampling logprobs (the behaviour
        policy's, for the learner's off-policy correction); experts / prompt_experts: MoE
        router choices (tidal.engine.request.GenerationResult), None for dense models.
    key_id: the API key that received it (tidal.online.api.auth.key_id); feedback on it is
        taken from that key only. None: served without keys (``--no-auth``), anyone's feedback.
    """

    id: str
    index: int
    created: float
    version: int
    manifest_sha256: str
    endpoint: Literal["completions", "chat"]
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    temperature: float
    latency_ms: float
    behaviour: str
    experts: list | None = None
    prompt_experts: list | None = None
    key_id: str | None = None


@dataclass
class FeedbackEvent:
    """POST /v1/feedback, validated: ``value`` is set only for signal = "scalar", in [-1, 1].
    ``key_id``: the API key that sent it; it must be the response's own key_id when that is set
    (else the outcome is "not_owner"). Not stored: a stored event's sender is its response's."""

    response_id: str
    signal: str
    index: int = 0
    value: float | None = None
    received: float = 0.0
    key_id: str | None = None


FeedbackOutcome = Literal["stored", "unknown_response", "not_owner", "duplicate"]
"""What writing one FeedbackEvent did (only "stored" stored anything)."""


@dataclass
class LearnEvent:
    """A stored feedback event with its response: ``seq`` orders events (the learner's cursor)."""

    seq: int
    feedback: FeedbackEvent
    response: ServedResponse


@dataclass
class VersionRecord:
    """One row of the version registry.

    weights: where the version's weights are (the run's sync store folder); gate / canary:
    the results of each stage as JSON-able dicts (what was tested, the statistics, the verdict);
    share: fraction of traffic it serves now (1 - canary share for the live one, 0 when off).
    """

    version: int
    parent: int | None
    manifest_sha256: str
    status: str
    created: float
    weights: str = ""
    share: float = 0.0
    gate: dict[str, Any] = field(default_factory=dict)
    canary: dict[str, Any] = field(default_factory=dict)
    note: str = ""
