"""An in-process recorder and feedback sink with the durable store's interface (for tests and
for ``tidal serve`` until the SQL store, tidal.online.store, plugs in). Nothing survives a
restart.

    await record(responses: list[ServedResponse]) -> None
    await submit(event: FeedbackEvent) -> "stored" | "unknown_response" | "not_owner" | "duplicate"
    retry_after() -> float | None     (seconds to wait when the learner is too far behind)
"""

from __future__ import annotations

import asyncio

from tidal.online.records import FeedbackEvent, ServedResponse


class MemoryStore:
    """Responses by (id, index); one feedback event per response choice (a second is a
    duplicate). ``max_backlog``: feedback events not yet ``take``-n beyond which
    ``retry_after`` answers ``retry_s`` (None = never)."""

    def __init__(self, max_backlog: int | None = None, retry_s: float = 1.0):
        self.responses: dict[tuple[str, int], ServedResponse] = {}
        self.feedback: list[FeedbackEvent] = []
        self._keys: set[tuple[str, int]] = set()
        self.max_backlog, self.retry_s = max_backlog, retry_s
        self.taken = 0
        self._lock = asyncio.Lock()

    async def record(self, responses: list[ServedResponse]) -> None:
        for r in responses:
            self.responses[(r.id, r.index)] = r

    async def submit(self, event: FeedbackEvent) -> str:
        key = (event.response_id, event.index)
        async with self._lock:
            if key not in self.responses:
                return "unknown_response"
            owner = self.responses[key].key_id
            if owner is not None and owner != event.key_id:
                return "not_owner"
            if key in self._keys:
                return "duplicate"
            self._keys.add(key)
            self.feedback.append(event)
            return "stored"

    def retry_after(self) -> float | None:
        backlog = len(self.feedback) - self.taken
        if self.max_backlog is not None and backlog >= self.max_backlog:
            return self.retry_s
        return None

    def take(self, n: int) -> list[tuple[FeedbackEvent, ServedResponse]]:
        """The next ``n`` feedback events with their responses (a learner's cursor)."""
        out = self.feedback[self.taken:self.taken + n]
        self.taken += len(out)
        return [(e, self.responses[(e.response_id, e.index)]) for e in out]
