"""Records <-> rows: token lists packed little-endian, expert ids as compact JSON.

Token ids are int32 (4 bytes each instead of ~6 as JSON text); logprobs are float64, the exact
Python floats the engine produced (the learner's off-policy ratios need them bit for bit).
"""

from __future__ import annotations

import json

import numpy as np

from tidal.online.records import FeedbackEvent, ServedResponse

INT32_MAX = 2 ** 31 - 1


def pack_ids(ids: list[int]) -> bytes:
    a = np.asarray(ids, dtype=np.int64)
    if a.ndim != 1 or (a.size and (a.min() < 0 or a.max() > INT32_MAX)):
        raise ValueError("token ids must be a flat list of ints in [0, 2**31)")
    return a.astype("<i4").tobytes()


def unpack_ids(b: bytes) -> list[int]:
    return np.frombuffer(b, dtype="<i4").tolist()


def pack_floats(xs: list[float]) -> bytes:
    return np.asarray(xs, dtype="<f8").reshape(-1).tobytes()


def unpack_floats(b: bytes) -> list[float]:
    return np.frombuffer(b, dtype="<f8").tolist()


def pack_experts(experts: list | None) -> str | None:
    return None if experts is None else json.dumps(experts, separators=(",", ":"))


def unpack_experts(s: str | None) -> list | None:
    return None if s is None else json.loads(s)


def response_row(r: ServedResponse) -> dict:
    if len(r.logprobs) != len(r.token_ids):
        raise ValueError(f"response {r.id}[{r.index}]: {len(r.token_ids)} tokens but "
                         f"{len(r.logprobs)} logprobs")
    if r.endpoint not in ("completions", "chat"):
        raise ValueError(f"response {r.id}[{r.index}]: endpoint {r.endpoint!r} is not completions or chat")
    return {"id": r.id, "index": r.index, "created": r.created, "version": r.version,
            "manifest_sha256": r.manifest_sha256, "endpoint": r.endpoint,
            "prompt_ids": pack_ids(r.prompt_ids), "token_ids": pack_ids(r.token_ids),
            "logprobs": pack_floats(r.logprobs), "experts": pack_experts(r.experts),
            "prompt_experts": pack_experts(r.prompt_experts), "text": r.text,
            "finish_reason": r.finish_reason, "temperature": r.temperature,
            "latency_ms": r.latency_ms, "behaviour": r.behaviour, "key_id": r.key_id}


def response_of(row) -> ServedResponse:
    m = row._mapping
    return ServedResponse(
        id=m["id"], index=m["index"], created=m["created"], version=m["version"],
        manifest_sha256=m["manifest_sha256"], endpoint=m["endpoint"],
        prompt_ids=unpack_ids(m["prompt_ids"]), token_ids=unpack_ids(m["token_ids"]),
        logprobs=unpack_floats(m["logprobs"]), text=m["text"], finish_reason=m["finish_reason"],
        temperature=m["temperature"], latency_ms=m["latency_ms"], behaviour=m["behaviour"],
        experts=unpack_experts(m["experts"]), prompt_experts=unpack_experts(m["prompt_experts"]),
        key_id=m["key_id"])


def feedback_row(e: FeedbackEvent) -> dict:
    return {"response_id": e.response_id, "index": e.index, "signal": e.signal, "value": e.value,
            "received": e.received}


def feedback_of(m) -> FeedbackEvent:
    return FeedbackEvent(response_id=m["response_id"], signal=m["signal"], index=m["index"],
                         value=m["value"], received=m["received"])
