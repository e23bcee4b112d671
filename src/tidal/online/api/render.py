"""Engine results -> OpenAI response bodies, stream chunks and the records the store keeps.

Text: the engine keeps a stop string in its output; OpenAI does not, so the text is cut before
the first stop string found (the recorded token ids stay what the policy sampled). Finish
reasons: the engine's "eos" and "stop" are OpenAI's "stop", "length" stays "length".
Logprobs: the engine records the sampled token's logprob only, so ``top_logprobs`` lists that
one token (completions' ``logprobs: k`` and chat's ``top_logprobs: k`` alike).
Streaming holds back text that could still become a stop string (and half a UTF-8 character).
"""

from __future__ import annotations

import json
import time

from tidal.chat.template import cut_at_stop
from tidal.engine.request import GenerationResult
from tidal.online.behaviour import classify
from tidal.online.records import ServedResponse

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


def final_text(result: GenerationResult, stop: list[str]) -> tuple[str, str]:
    """(text, OpenAI finish_reason) of a finished choice."""
    text, hit = cut_at_stop(result.text, stop)
    return text, "stop" if hit else FINISH[result.finish_reason]


def kept_tokens(tokenizer, token_ids: list[int], text: str) -> int:
    """How many leading tokens make up ``text`` (the rest was cut with a stop string, or is eos)."""
    eos = getattr(tokenizer, "eos_id", None)
    n = len(token_ids) - (1 if token_ids and token_ids[-1] == eos else 0)
    if tokenizer.decode(token_ids[:n]) == text:
        return n
    for k in range(n + 1):
        if len(tokenizer.decode(token_ids[:k])) >= len(text):
            return k
    return n


def token_strings(tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode([i]) for i in ids]


def completion_logprobs(tokenizer, ids: list[int], logprobs: list[float], offset: int = 0) -> dict:
    """OpenAI completions ``logprobs``: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens = token_strings(tokenizer, ids)
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": logprobs,
            "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs)], "text_offset": offsets}


def chat_logprobs(tokenizer, ids: list[int], logprobs: list[float], top: int) -> dict:
    """OpenAI chat ``logprobs``: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    content = []
    for t, lp in zip(token_strings(tokenizer, ids), logprobs):
        entry = {"token": t, "logprob": lp, "bytes": list(t.encode())}
        entry["top_logprobs"] = [dict(entry)] if top > 0 else []
        content.append(entry)
    return {"content": content}


def usage(prompt_ids: list[int], results: list[GenerationResult]) -> dict:
    completion = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": len(prompt_ids), "completion_tokens": completion,
            "total_tokens": len(prompt_ids) + completion}


def served(response_id: str, endpoint: str, gen, results: list[GenerationResult],
           texts: list[tuple[str, str]], temperature: float) -> list[ServedResponse]:
    """One ServedResponse per choice (what the store records before the answer goes out)."""
    now = time.time()
    return [ServedResponse(
        id=response_id, index=i, created=now, version=gen.version,
        manifest_sha256=gen.manifest_sha256, endpoint=endpoint, prompt_ids=list(r.prompt_ids),
        token_ids=list(r.token_ids), logprobs=list(r.logprobs), text=text,
        finish_reason=finish, temperature=temperature, latency_ms=gen.latency_ms[i],
        behaviour=classify(text), experts=r.experts, prompt_experts=r.prompt_experts)
        for i, (r, (text, finish)) in enumerate(zip(results, texts))]


def sse(obj) -> bytes:
    """One server-sent event: ``data: {json}\\n\\n``."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


class StreamText:
    """The text of one streaming choice: what may be sent now, without a stop string or the
    part of one that may still complete, nor half a UTF-8 character."""

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0
        self.stopped = False

    def add(self, token_ids: list[int]) -> str:
        """The new text that can be sent after ``token_ids`` arrived."""
        self.ids += token_ids
        if self.stopped:
            return ""
        text, self.stopped = cut_at_stop(self.tokenizer.decode(self.ids), self.stop)
        if not self.stopped:
            text = text[: max(self.sent, len(text) - self.hold)].rstrip("\ufffd")
        return self._take(text)

    def finish(self, text: str) -> str:
        """The rest of the final ``text`` (final_text's)."""
        return self._take(text)

    def _take(self, text: str) -> str:
        new = text[self.sent:]
        self.sent = max(self.sent, len(text))
        return new
