"""Feedback ingest under load, a ``kill -9`` in the middle of it, and back-pressure.

    ingest:  `concurrency` clients POST /v1/feedback for distinct stored responses as fast as
             they are answered (closed loop: the most events/s), while the learner trains on
             what arrives; events/s and latency percentiles of the acknowledged ones
    paced:   the same at a fixed offered rate (open loop, latency from each event's due time):
             the p99 a server sustaining that rate gives
    kill:    the same load; after ``kill_after_s`` the server (and its learner) gets SIGKILL; the
             ids it acknowledged are compared with what the restarted server's store holds
    429:     a server whose learner may fall at most ``backlog`` events behind answers 429 with
             Retry-After beyond that, instead of queueing without bound

The responses the feedback refers to are written straight into the run's store first
(synthetic ones, named with the live version): this measures ingest, not generation.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from tidal.bench.online_serving import percentile
from tidal.online.records import ServedResponse


def seed_responses(store, version: int, digest: str, n: int, prefix: str) -> list[str]:
    """``n`` stored responses (ids ``prefix-i``) for feedback to refer to."""
    ids = [f"{prefix}-{i}" for i in range(n)]
    now = time.time()
    for start in range(0, n, 500):
        store.write_responses([
            ServedResponse(id=rid, index=0, created=now, version=version, manifest_sha256=digest,
                           endpoint="completions", prompt_ids=[35, 32, 84, 97, 115, 107],
                           token_ids=[32, 32, 114, 101, 116, 10], logprobs=[-1.0] * 6,
                           text="  ret\n", finish_reason="stop", temperature=1.0,
                           latency_ms=1.0, behaviour="other")
            for rid in ids[start:start + 500]])
    return ids


async def post_feedback(url: str, ids: list[str], concurrency: int, signal: str = "accepted",
                        stop_after_s: float | None = None, headers: dict | None = None) -> dict:
    """POST one event per id (``headers``: the API key's); returns the acknowledged ids,
    statuses and latencies."""
    queue = list(ids)
    acked: list[str] = []
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    retry_after: list[str] = []
    errors = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while queue:
            rid = queue.pop()
            t = time.perf_counter()
            try:
                async with session.post(f"{url}/v1/feedback",
                                        json={"response_id": rid, "signal": signal}) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                    if r.status == 200:
                        acked.append(rid)
                        latencies.append(time.perf_counter() - t)
                    elif r.status == 429:
                        retry_after.append(r.headers.get("Retry-After", ""))
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
                errors += 1
                if stop_after_s is not None:
                    return  # the server is gone

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers,
                                     timeout=aiohttp.ClientTimeout(total=30)) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return {"acked": acked, "latencies": latencies, "statuses": statuses, "wall_s": wall,
            "errors": errors, "retry_after": retry_after}


async def paced_feedback(url: str, ids: list[str], rate: float, connections: int,
                         headers: dict | None = None) -> dict:
    """Open-loop load: event i is sent at start + i / rate whatever the answers before it (a
    dispatcher fires each one on time), and its latency counts from when it was due (so a slow
    answer that holds up later sends is charged, not hidden: no coordinated omission)."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector, headers=headers,
                                     timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def one(due: float, rid: str) -> None:
            nonlocal errors
            try:
                async with session.post(f"{url}/v1/feedback",
                                        json={"response_id": rid, "signal": "accepted"}) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                    if r.status == 200:
                        latencies.append(time.perf_counter() - due)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                errors += 1

        tasks = []
        start = time.perf_counter()
        for i, rid in enumerate(ids):
            due = start + i / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.create_task(one(due, rid)))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
    return {"latencies": latencies, "statuses": statuses, "wall_s": wall, "errors": errors,
            "offered_per_s": rate}


def ingest_row(result: dict) -> dict:
    """Events acknowledged (one latency each), events/s and latency percentiles of a load."""
    lat = result["latencies"]
    return {"events": len(lat), "wall_s": result["wall_s"],
            "events_per_s": len(lat) / max(result["wall_s"], 1e-9),
            "p50_ms": 1000 * percentile(lat, 50), "p99_ms": 1000 * percentile(lat, 99),
            "statuses": {str(k): v for k, v in result["statuses"].items()},
            "errors": result["errors"], "offered_per_s": result.get("offered_per_s")}


def stored_feedback_ids(store) -> set[str]:
    """Response ids that have a stored feedback event."""
    out, seq = set(), 0
    while True:
        batch = store.learn_events_after(seq, 5000)
        if not batch:
            return out
        out.update(e.response.id for e in batch)
        seq = batch[-1].seq


def kill_during_load(server, url: str, ids: list[str], concurrency: int, kill_after_s: float) -> dict:
    """Load the server, SIGKILL it mid-stream, return what it had acknowledged."""

    async def load_and_kill() -> dict:
        task = asyncio.create_task(post_feedback(url, ids, concurrency, stop_after_s=kill_after_s,
                                                 headers=server.headers()))
        await asyncio.sleep(kill_after_s)
        server.kill9()
        return await task

    return asyncio.run(load_and_kill())
