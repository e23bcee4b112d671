"""A scripted stand-in for the engine, so harness tests control exactly what the "model" writes.

It has the slice of Engine's interface the harness uses (submit, step, tokenizer, cfg, is_moe,
model) and honours max_new_tokens, stop strings and max_seq_len like the real one. ``policy``
maps the prompt text to the completion text; every generated token gets logprob -0.5 and the
engine's version.
"""

from __future__ import annotations

from tidal.engine.config import EngineConfig
from tidal.engine.request import GenerationResult
from tidal.model.tokenizer import ByteTokenizer


class ScriptedEngine:
    is_moe = False

    def __init__(self, policy, max_seq_len: int = 512, max_new_tokens: int = 96, version: int = 0):
        self.policy = policy
        self.tokenizer = ByteTokenizer()
        self.cfg = EngineConfig(max_seq_len=max_seq_len, max_new_tokens=max_new_tokens, stop=["\n\n"])
        self.version = version
        self.requests = []  # every request seen, in order
        self.steps = 0
        self.max_batch = 0  # most requests finished by one step (they were batched together)
        self._queue = []
        self._next = 0

    def submit(self, request) -> int:
        assert len(request.prompt_ids) <= self.cfg.max_seq_len - 1, "prompt beyond max_seq_len"
        rid = self._next
        self._next += 1
        self.requests.append(request)
        self._queue.append((rid, request))
        return rid

    def step(self) -> list[GenerationResult]:
        self.steps += 1
        out = [self._complete(rid, req) for rid, req in self._queue]
        self.max_batch = max(self.max_batch, len(out))
        self._queue = []
        return out

    def _complete(self, rid, req) -> GenerationResult:
        tok = self.tokenizer
        text = self.policy(tok.decode(req.prompt_ids))
        stop = req.stop if req.stop is not None else self.cfg.stop
        reason = "eos"
        for s in stop:
            at = text.find(s)
            if at >= 0:
                text, reason = text[: at + len(s)], "stop"
        limit = min(req.max_new_tokens or self.cfg.max_new_tokens,
                    self.cfg.max_seq_len - len(req.prompt_ids))
        ids = tok.encode(text)
        if len(ids) > limit:
            ids, reason = ids[:limit], "length"
        return GenerationResult(rid, list(req.prompt_ids), ids, [-0.5] * len(ids),
                                [self.version] * len(ids), None, reason, tok.decode(ids), req.tag)
