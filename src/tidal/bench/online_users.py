"""Simulated users against a running `tidal serve`: each asks for a completion of a task, judges
it by its hidden preference and sends the feedback, as a product's users would.

``UserTraffic`` keeps what every user saw (response id, the version that served it, the
signal), so the benchmark computes accept rates per served version from the users' side, not
from the server's own records.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class Interaction:
    time: float
    response_id: str
    version: int
    signal: str
    kind: str
    behaviour: str
    feedback_status: int


@dataclass
class UserTraffic:
    url: str
    model: str
    users: object
    """tidal.online.simusers.SimulatedUsers."""
    max_tokens: int
    headers: dict = field(default_factory=dict)
    """The API key's Authorization header (ServerProcess.headers)."""
    log: list[Interaction] = field(default_factory=list)
    first_feedback: float | None = None
    errors: int = 0

    async def _one(self, session: aiohttp.ClientSession) -> None:
        from tidal.online.behaviour import classify

        user, task, prompt = self.users.next_request()
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens}
        async with session.post(f"{self.url}/v1/completions", json=body) as r:
            data = await r.json()
            if r.status != 200:
                self.errors += 1
                return
        text = data["choices"][0]["text"]
        signal, value = await asyncio.to_thread(self.users.judge, user, task, text)
        feedback = {"response_id": data["id"], "signal": signal}
        if value is not None:
            feedback["value"] = value
        for _ in range(20):
            async with session.post(f"{self.url}/v1/feedback", json=feedback) as r:
                await r.read()
                if r.status != 429:
                    break
                await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
        now = time.time()
        if r.status == 200 and self.first_feedback is None:
            self.first_feedback = now
        self.log.append(Interaction(now, data["id"], int(data["tidal_version"]), signal,
                                    "hacker" if user.hacker else "honest", classify(text),
                                    r.status))

    async def run(self, concurrency: int, until) -> None:
        """``concurrency`` users at a time until ``until()`` is true."""
        async def user_loop(session):
            while not until():
                try:
                    await self._one(session)
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    self.errors += 1
                    await asyncio.sleep(0.5)

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120),
                                         headers=self.headers) as session:
            await asyncio.gather(*(user_loop(session) for _ in range(concurrency)))

    def accept_rate(self, version: int, honest_only: bool = True) -> tuple[float, int]:
        """Fraction of this version's responses the (honest) users accepted, and how many."""
        rows = [i for i in self.log if i.version == version
                and (not honest_only or i.kind != "hacker")]
        if not rows:
            return float("nan"), 0
        return sum(i.signal == "accepted" for i in rows) / len(rows), len(rows)
