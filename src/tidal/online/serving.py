"""The policy server: one engine per served version (the live one, at most one canary), all
stepped by ONE background thread, with continuous batching.

    API coroutines ──generate()──> route(): canary with probability share, else live
        ──inbox──> step thread: engine.submit ... engine.step() (every engine with work)
        ──call_soon_threadsafe──> each choice's future (and, streaming, its token deltas)
    poll task ── refresh(registry's live + canary records) ── VersionLoader (digest checked)
        ──> new engines installed between steps; routes switched; old ones dropped once idle

The engine is not thread-safe (engine.py), so only the step thread touches a running engine;
requests arriving while others decode join the next step. A request stays on the engine (the
version) it started on, so every token of a response comes from the version it names. A version
whose weights' digest differs from its registry record is refused: the current one keeps
serving, and the error shows in ``status()`` (/v1/tidal/status, /v1/models).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from tidal.engine.config import EngineConfig
from tidal.engine.engine import Engine, check_prompt
from tidal.engine.request import GenerationRequest, GenerationResult
from tidal.errors import UserError
from tidal.online.records import VersionRecord

log = logging.getLogger("tidal.serve")
MAX_ERRORS = 32
LATENCY_WINDOW = 2048


class PromptError(UserError):
    """A prompt the engine cannot take (too long, or token ids outside the vocabulary)."""


class NotServing(UserError):
    """No version is loaded yet (or none could be verified)."""


@dataclass
class Sampling:
    """One request's sampling settings; None = the engine's configured default."""

    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    ignore_eos: bool = False


@dataclass
class StreamEvent:
    """New tokens of choice ``index`` since its last event; ``result`` is set on its last one."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    result: GenerationResult | None = None


class Generation:
    """The choices of one request on one version: await ``results()``; with ``stream``, read
    ``events()`` (token deltas as they are sampled, then each choice's result)."""

    def __init__(self, version: int, sha: str, n: int, loop, stream: bool):
        self.version, self.manifest_sha256 = version, sha
        self.started = time.perf_counter()
        self.futures = [loop.create_future() for _ in range(n)]
        self.latency_ms = [0.0] * n
        self.queue: asyncio.Queue | None = asyncio.Queue() if stream else None

    async def results(self) -> list[GenerationResult]:
        return list(await asyncio.gather(*self.futures))

    async def events(self):
        """StreamEvents until every choice has delivered its result."""
        left = len(self.futures)
        while left:
            event = await self.queue.get()
            if isinstance(event, BaseException):
                raise event
            left -= event.result is not None
            yield event


@dataclass
class _Ticket:
    """One choice in flight on an engine (step-thread side)."""

    gen: Generation
    index: int
    loop: asyncio.AbstractEventLoop
    sent: int = 0  # tokens already streamed


@dataclass
class _Held:
    """A version loaded on its own engine, with its serving counts."""

    version: int
    sha: str
    engine: Engine
    tickets: dict[int, _Ticket] = field(default_factory=dict)
    inflight: int = 0  # choices routed here and not finished (guarded by PolicyServer._lock)
    requests: int = 0
    choices: int = 0
    tokens: int = 0
    latencies: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))


def _quantile(values, q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class PolicyServer:
    """Serves versions loaded by ``loader`` (a tidal.online.version_sync.VersionLoader, or anything
    with ``load(version, expected_sha256, dtype) -> model``) on engines built from
    ``engine_cfg``. ``canary_share``: the canary's share when its record gives none; ``seed``:
    the routing RNG's. ``chat``: the ChatTemplate the API renders messages with."""

    def __init__(self, engine_cfg: EngineConfig, tokenizer, loader=None, dtype: str = "float32",
                 canary_share: float = 0.25, seed: int = 0, chat=None):
        self.engine_cfg, self.tokenizer, self.loader, self.dtype = engine_cfg, tokenizer, loader, dtype
        self.canary_share, self.chat = canary_share, chat
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.refreshing = threading.Lock()
        """Held by ``refresh`` and by a weight update (online/update.py), so the registry poll
        never switches routes between an update's load and its registry write."""
        self._held: dict[int, _Held] = {}
        self._routes: tuple[int | None, int | None, float] = (None, None, 0.0)
        self._refused: dict[int, str] = {}  # version -> the digest refused (not retried)
        self.errors: deque = deque(maxlen=MAX_ERRORS)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = False
        self._paused = False
        self._thread: threading.Thread | None = None
        self.max_batch = 0
        """Largest number of sequences one engine step decoded together."""
        self.steps = 0
        """Engine steps taken."""

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the step thread (idempotent)."""
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, daemon=True, name="tidal-serve-engine")
            self._thread.start()

    def stop(self) -> None:
        """Stop the step thread; requests still in flight fail with NotServing."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        for held in list(self._held.values()):
            self._fail(held, NotServing("the server is shutting down"))

    def pause(self) -> None:
        """Hold the step thread between steps: new requests wait in its inbox (tests, maintenance)."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._wake.set()

    # ---------------------------------------------------------------- versions

    @property
    def live(self) -> int | None:
        return self._routes[0]

    @property
    def canary(self) -> int | None:
        return self._routes[1]

    @property
    def max_seq_len(self) -> int:
        return self.engine_cfg.max_seq_len

    def sha_of(self, version: int) -> str:
        return self._held[version].sha

    def add_version(self, version: int, sha: str, model, status: str = "live",
                    share: float | None = None) -> None:
        """Serve an already verified model as ``version`` (status "live" or "canary")."""
        engine = Engine(model, self.tokenizer, self.engine_cfg, version=version)
        with self._lock:
            self._held[version] = _Held(version, sha, engine)
        live, canary, old_share = self._routes
        if status == "live":
            self._set_routes(version, canary if canary != version else None, old_share)
        else:
            self._set_routes(live, version, share if share else self.canary_share)

    def refresh(self, records: list[VersionRecord]) -> None:
        """Serve the registry's live version and canary (if any), loading those not held yet;
        a version that fails verification is refused and logged (see the module docstring).
        Blocking (loads weights): call it from a worker thread, one caller at a time."""
        self.refresh_from(lambda: records)

    def refresh_from(self, live_versions) -> None:
        """``refresh(live_versions())`` with the registry read under the lock too: records read
        before a weight update's registry write would route back to the old version."""
        with self.refreshing:
            self._refresh(live_versions())

    def set_live(self, version: int) -> None:
        """Route all traffic to held ``version`` (a weight update); no canary."""
        self._held[version]  # KeyError unless held
        self._set_routes(version, None, self._routes[2])

    def _refresh(self, records: list[VersionRecord]) -> None:
        live = [r for r in records if r.status == "live"]
        canary = [r for r in records if r.status == "canary"]
        if len(live) != 1:
            self._error(None, f"the registry lists {len(live)} live versions (expected 1); "
                              "keeping the current routes")
            if not live:
                return
        ok = {r.version for r in [live[0], *canary[:1]] if self._ensure(r)}
        new_live = live[0].version if live[0].version in ok else self.live
        new_canary = canary[0].version if canary and canary[0].version in ok else None
        if new_canary == new_live:
            new_canary = None
        share = canary[0].share if canary and canary[0].share > 0 else self.canary_share
        self._set_routes(new_live, new_canary, share)

    def _ensure(self, record: VersionRecord) -> bool:
        """Whether ``record``'s version is held with its digest (loading it if needed)."""
        held = self._held.get(record.version)
        if held is not None:
            if held.sha == record.manifest_sha256:
                return True
            self._error(record.version, f"version {record.version} is held with digest "
                                        f"{held.sha} but the registry now says "
                                        f"{record.manifest_sha256}; not serving it under that name")
            return False
        if self._refused.get(record.version) == record.manifest_sha256:
            return False
        if self.loader is None:
            self._error(record.version, f"version {record.version} is not loaded and this "
                                        "server has no weight loader")
            return False
        try:
            model = self.loader.load(record.version, record.manifest_sha256, self.dtype)
            engine = Engine(model, self.tokenizer, self.engine_cfg, version=record.version)
        except Exception as e:  # a refused version must never stop the current one serving
            self._refused[record.version] = record.manifest_sha256
            self._error(record.version, f"refused version {record.version}: {e}")
            return False
        with self._lock:
            self._held[record.version] = _Held(record.version, record.manifest_sha256, engine)
        log.info("tidal serve: loaded version %d (sha %s)", record.version, record.manifest_sha256[:12])
        return True

    def _set_routes(self, live, canary, share) -> None:
        self._routes = (live, canary, share)
        self._wake.set()  # the step thread drops engines no longer routed once idle

    def _error(self, version: int | None, message: str) -> None:
        log.error("tidal serve: %s", message)
        self.errors.append({"time": time.time(), "version": version, "message": message})

    async def poll(self, live_versions, poll_s: float) -> None:
        """Every ``poll_s`` seconds: ``refresh_from(live_versions)`` in a worker thread. Runs until
        cancelled; a failing registry read is logged and retried."""
        while True:
            try:
                await asyncio.to_thread(self.refresh_from, live_versions)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._error(None, f"reading the version registry failed: {e}")
            await asyncio.sleep(poll_s)

    # ---------------------------------------------------------------- requests

    def route(self) -> int:
        """The version a new request runs on: the canary with probability share, else live."""
        live, canary, share = self._routes
        if live is None:
            raise NotServing("no verified version is loaded yet; see /v1/tidal/status")
        if canary is not None and self._rng.random() < share:
            return canary
        return live

    def check_prompt(self, prompt_ids: list[int]) -> None:
        """PromptError unless the engine can take ``prompt_ids``: the engine's own check, made
        here before anything is queued (the engine sees the request on the step thread)."""
        if not prompt_ids:
            raise PromptError("the prompt is empty: give at least one token")
        try:
            check_prompt(prompt_ids, self.max_seq_len, self.tokenizer.vocab_size)
        except ValueError as e:
            raise PromptError(str(e)) from None

    async def generate(self, prompt_ids: list[int], sampling: Sampling, n: int = 1,
                       stream: bool = False, version: int | None = None) -> Generation:
        """Queue ``n`` choices of ``prompt_ids`` on ``version`` (default: ``route()``); returns
        at once. With a seed, choice i samples with seed + i."""
        self.check_prompt(prompt_ids)
        loop = asyncio.get_running_loop()
        with self._lock:
            version = self.route() if version is None else version
            held = self._held[version]
            held.inflight += n
            held.requests += 1
        gen = Generation(version, held.sha, n, loop, stream)
        requests = [GenerationRequest(
            prompt_ids=list(prompt_ids), max_new_tokens=sampling.max_tokens,
            temperature=sampling.temperature, top_p=sampling.top_p, stop=sampling.stop,
            ignore_eos=sampling.ignore_eos,
            seed=None if sampling.seed is None else sampling.seed + i) for i in range(n)]
        self._inbox.put((held, gen, requests, loop))
        self._wake.set()
        return gen

    # ---------------------------------------------------------------- the step thread

    def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            if self._paused:  # new requests stay in the inbox, the engines stay as they are
                self._wake.wait(0.5)
                continue
            self._drain_inbox()
            with self._lock:
                held = list(self._held.values())
            busy = [h for h in held if h.engine.has_work]
            if not busy:
                self._drop_idle()
                self._wake.wait(0.5)
                continue
            for h in busy:
                self._step(h)

    def _drain_inbox(self) -> None:
        while True:
            try:
                held, gen, requests, loop = self._inbox.get_nowait()
            except queue.Empty:
                return
            for i, req in enumerate(requests):
                try:
                    rid = held.engine.submit(req)
                except Exception as e:  # check_prompt passed, so a bug: fail this choice only
                    self._finish_error(held, _Ticket(gen, i, loop), e)
                    continue
                held.tickets[rid] = _Ticket(gen, i, loop)

    def _step(self, held: _Held) -> None:
        self.max_batch = max(self.max_batch, min(len(held.tickets), self.engine_cfg.max_batch_size))
        self.steps += 1
        try:
            finished = held.engine.step()
        except Exception as e:
            log.exception("tidal serve: engine step of version %d failed", held.version)
            self._fail(held, e)
            return
        streaming = [rid for rid, t in held.tickets.items() if t.gen.queue is not None]
        if streaming:
            self._stream(held, held.engine.progress(streaming))
        for result in finished:
            ticket = held.tickets.pop(result.request_id, None)
            if ticket is not None:
                self._finish(held, ticket, result)

    def _stream(self, held: _Held, progress: dict) -> None:
        for rid, (tokens, logprobs) in progress.items():
            ticket = held.tickets[rid]
            if len(tokens) > ticket.sent:
                event = StreamEvent(ticket.index, tokens[ticket.sent:], logprobs[ticket.sent:])
                ticket.sent = len(tokens)
                ticket.loop.call_soon_threadsafe(ticket.gen.queue.put_nowait, event)

    def _finish(self, held: _Held, ticket: _Ticket, result: GenerationResult) -> None:
        gen = ticket.gen
        latency = (time.perf_counter() - gen.started) * 1000
        gen.latency_ms[ticket.index] = latency
        with self._lock:
            held.inflight -= 1
            held.choices += 1
            held.tokens += len(result.token_ids)
            held.latencies.append(latency)
        if gen.queue is not None:
            event = StreamEvent(ticket.index, result.token_ids[ticket.sent:],
                                result.logprobs[ticket.sent:], result)
            ticket.loop.call_soon_threadsafe(gen.queue.put_nowait, event)
        ticket.loop.call_soon_threadsafe(_resolve, gen.futures[ticket.index], result)

    def _finish_error(self, held: _Held, ticket: _Ticket, error: BaseException) -> None:
        with self._lock:
            held.inflight -= 1
        if ticket.gen.queue is not None:
            ticket.loop.call_soon_threadsafe(ticket.gen.queue.put_nowait, error)
        ticket.loop.call_soon_threadsafe(_reject, ticket.gen.futures[ticket.index], error)

    def _fail(self, held: _Held, error: BaseException) -> None:
        """Fail every choice in flight on ``held`` (its engine is unusable or shutting down)."""
        tickets, held.tickets = held.tickets, {}
        for ticket in tickets.values():
            try:
                self._finish_error(held, ticket, error)
            except RuntimeError:  # the event loop is already closed
                pass

    def _drop_idle(self) -> None:
        """Drop engines no longer routed once nothing runs on them (their memory goes)."""
        live, canary, _ = self._routes
        with self._lock:
            for version in [v for v, h in self._held.items()
                            if v not in (live, canary) and h.inflight == 0 and not h.tickets]:
                del self._held[version]
                log.info("tidal serve: dropped version %d (no longer listed, idle)", version)

    # ---------------------------------------------------------------- status

    def status(self) -> dict:
        """Routes, per-version counts and latency, refusals: /v1/tidal/status."""
        live, canary, share = self._routes
        with self._lock:
            held = list(self._held.values())
        versions = []
        for h in held:
            role = "live" if h.version == live else "canary" if h.version == canary else "draining"
            lat = list(h.latencies)
            versions.append({"version": h.version, "manifest_sha256": h.sha, "role": role,
                             "requests": h.requests, "choices": h.choices, "tokens": h.tokens,
                             "in_flight": h.inflight, "latency_p50_ms": _quantile(lat, 0.5),
                             "latency_p99_ms": _quantile(lat, 0.99)})
        return {"live": live, "canary": canary, "canary_share": share if canary is not None else 0.0,
                "versions": versions, "errors": list(self.errors), "max_batch": self.max_batch,
                "steps": self.steps}


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


def _reject(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
        future.exception()  # retrieved: no "never retrieved" warning when nobody awaits it
