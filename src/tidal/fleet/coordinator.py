"""The orchestrator's HTTP endpoint for remote pools: `tidal worker --join URL` talks to it and
to nothing else of the trainer's (weights come through the origin or a region's relay).

Every request carries the run token (``Authorization: Bearer``, tidal.fleet.auth); JSON in and
out; an error is ``{"error": message, "reason": reason}`` and counted by reason.

    POST /v1/join        {"pool", "workers"} (defaults: the run's only remote pool; its
                         ``workers``) -> one lease per worker ({lease_id, worker, secret}),
                         lease_s, heartbeat_s, the run's config (TidalConfig as JSON), the weight
                         URLs (the region's announced relays, then the origin), the tokenizer's
                         file names
    GET  /v1/tokenizer/NAME   one tokenizer file of the init checkpoint (bytes)
    POST /v1/heartbeat   {"lease_id"} -> renewed, with the trainer's epoch; 403 {"reason":
                         unknown|expired|released}
    GET  /v1/work?lease_id=L&wait_s=T   long-poll: {"assignment", "epoch", "weights"} or 204;
                         renews the lease (a new epoch: the trainer restarted, pull weights afresh)
    POST /v1/results     a signed batch (wire.encode_results; headers X-Tidal-Lease and
                         X-Tidal-Signature): 200 {accepted, duplicate, late}; 401 no or wrong
                         token; 403 bad signature, wrong lease, unknown lease; 409 a replayed
                         batch; 400 a body that does not decode; 422 a result for an assignment
                         the lease was never given, one failing verify.check_result, or one
                         whose recomputed logprobs differ (a verify_fraction sample); 410 a
                         batch whose X-Tidal-Epoch names an earlier trainer (it restarted and
                         re-planned that work from its checkpoint): dropped, the lease kept
    POST /v1/leave       {"lease_ids": [...]} -> released
    POST /v1/relays      {"region", "url"} -> the relay is announced to that region's joiners

The live leases are persisted in ``run_dir/fleet_leases.json`` (mode 0600: it holds the lease
secrets); a restarted trainer reloads them with fresh deadlines, so pools keep their leases
across a trainer restart (fleet.listen with a fixed port brings the coordinator back where the
workers look for it).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

from aiohttp import web

from tidal.fleet.auth import (
    REPLAYED_BATCH,
    SIGNATURE_HEADER,
    AuthError,
    ReplayGuard,
    bearer_token,
    check_token,
    new_lease_secret,
    open_batch,
)
from tidal.fleet.lease import LeaseError
from tidal.fleet.remote import RemotePool
from tidal.fleet.verify import check_result, recompute_logprobs_check
from tidal.fleet.wire import WireError, encode_assignment
from tidal.orchestrator.pool import OrchestratorError

LEASE_HEADER = "X-Tidal-Lease"
EPOCH_HEADER = "X-Tidal-Epoch"
"""The epoch the uploaded results' assignments came from (the ``epoch`` of /v1/work)."""
"""The header naming the lease an uploaded batch belongs to."""
LEASES_FILE = "fleet_leases.json"
URL_FILE = "fleet_url"
MAX_WAIT_S = 30.0
"""Longest long-poll for work."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tidal_tokenizer.txt")
"""Files of the init checkpoint a worker needs for its tokenizer (those present are served)."""


class Refused(Exception):
    """A request refused: HTTP ``status``, ``reason`` (counted), ``message`` (sent)."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason = status, reason


class Verifier:
    """The recompute check (verify.recompute_logprobs_check) on the versions the origin serves:
    the model of a version is pulled from the origin on first use and the newest ``keep`` are
    kept; a version no longer there is unchecked, not failed."""

    def __init__(self, cfg, origin: str, keep: int = 2):
        self.cfg, self.origin, self.keep = cfg, origin, keep
        self.rng = random.Random(secrets.randbits(64))
        self._models: dict[int, object] = {}
        self._source = None
        self._lock = threading.Lock()

    def mismatched(self, trajectories: list) -> tuple[int, int, float]:
        """(checked, mismatched, max |diff|) over a verify_fraction sample of ``trajectories``."""
        fc = self.cfg.fleet
        if fc.verify_fraction <= 0 or not trajectories:
            return 0, 0, 0.0
        with self._lock:
            report = recompute_logprobs_check(self._model_for, trajectories, self.cfg.engine.temperature,
                                              self.rng, fc.verify_fraction, fc.verify_atol,
                                              self.cfg.engine.numerics)
        return report.checked, report.mismatched, report.max_abs_diff

    def _model_for(self, version: int):
        import copy

        import torch

        from tidal.sync.transport import HttpWeightSource

        if version not in self._models:
            if self._source is None:
                self._source = HttpWeightSource(self.origin, self.cfg.sync)
            try:
                # the check runs in inference mode, whose tensors the fused forward cannot cache
                with torch.inference_mode(False):
                    model = self._source.load(version, getattr(torch, self.cfg.model.dtype))
                    self._models[version] = copy.deepcopy(model).eval()
            except Exception:  # noqa: BLE001 - gone from the origin (garbage-collected): unchecked
                return None
            for v in sorted(self._models)[:-self.keep]:
                del self._models[v]
        return self._models.get(version)


class Coordinator:
    """Serves the remote pools of one run (see the module docstring)."""

    def __init__(self, cfg, run_dir: Path, token: str, origin: str, tokenizer_dir: str | Path,
                 latest_version):
        """``origin``: the weight origin's URL; ``latest_version()``: the newest published
        version (no honest token is newer)."""
        self.cfg, self.run_dir, self.token, self.origin = cfg, Path(run_dir), token, origin
        self.tokenizer_dir = Path(tokenizer_dir)
        self.latest_version = latest_version
        self.pools: dict[str, RemotePool] = {}
        self.pool_of_lease: dict[str, RemotePool] = {}
        self.relays: dict[str, list[str]] = {}
        self.guard = ReplayGuard()
        self.verifier = Verifier(cfg, origin)
        self.counters: Counter = Counter()
        self.refused: Counter = Counter()
        self.epoch = uuid.uuid4().hex
        """Names this trainer process: a restarted trainer has a new origin (and new versions of
        the same numbers), so a worker that sees the epoch change pulls its weights afresh."""
        self._save_lock = threading.Lock()
        self.server = None

    # ------------------------------------------------------------------ life cycle

    def add_pool(self, pool: RemotePool) -> None:
        self.pools[pool.name] = pool
        pool._on_change = self.save

    def start(self) -> str:
        """Reload persisted leases, listen on fleet.listen, write run_dir/fleet_url; the URL."""
        from tidal.sync.errors import SyncError
        from tidal.sync.origin import ServerThread

        self._reload()
        host, _, port = self.cfg.fleet.listen.rpartition(":")
        try:
            self.server = ServerThread(self.app(), host=host or "127.0.0.1", port=int(port))
        except (SyncError, ValueError) as e:
            raise OrchestratorError(f"fleet.listen = {self.cfg.fleet.listen!r}: the coordinator "
                                    f"cannot listen there ({e}); pick a free host:port") from None
        (self.run_dir / URL_FILE).write_text(self.url + "\n")
        return self.url

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def summary(self) -> dict:
        """summary.json's ``fleet.remote``: what was accepted and what was refused, by reason."""
        return {"remote": {**dict(self.counters), "refused": dict(self.refused),
                           "refused_total": sum(self.refused.values())}}

    def save(self) -> None:
        """The live leases to run_dir/fleet_leases.json (owner-only: it holds their secrets)."""
        leases = [lease for pool in self.pools.values() for lease in pool.snapshot()]
        with self._save_lock:
            path = self.run_dir / LEASES_FILE
            tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"leases": leases}, f)
            os.replace(tmp, path)

    def _reload(self) -> None:
        path = self.run_dir / LEASES_FILE
        if not path.is_file():
            return
        now = time.time()
        for entry in json.loads(path.read_text()).get("leases", []):
            pool = self.pools.get(entry["pool"])
            if pool is not None:
                pool.grant(now, lease_id=entry["lease_id"], secret=entry["secret"])
                self.pool_of_lease[entry["lease_id"]] = pool
                self.counters["leases_reloaded"] += 1

    # ------------------------------------------------------------------ HTTP

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.add_routes([web.post("/v1/join", self._h(self.join)),
                        web.get("/v1/tokenizer/{name}", self._h(self.tokenizer)),
                        web.post("/v1/heartbeat", self._h(self.heartbeat)),
                        web.get("/v1/work", self._h(self.work)),
                        web.post("/v1/results", self._h(self.results)),
                        web.post("/v1/leave", self._h(self.leave)),
                        web.post("/v1/relays", self._h(self.announce_relay))])
        return app

    def _h(self, handler):
        """Token first, then the handler; a Refused becomes its status, counted by reason."""

        async def wrapped(request: web.Request):
            try:
                try:
                    check_token(bearer_token(request.headers.get("Authorization")), self.token)
                except AuthError as e:
                    raise Refused(401, e.reason, str(e)) from None
                return await handler(request)
            except Refused as e:
                self.refused[e.reason] += 1
                return web.json_response({"error": str(e), "reason": e.reason}, status=e.status)

        return wrapped

    async def _json(self, request) -> dict:
        try:
            body = await request.json()
        except ValueError:
            raise Refused(400, "bad request", "the body must be a JSON object") from None
        if not isinstance(body, dict):
            raise Refused(400, "bad request", "the body must be a JSON object")
        return body

    def _member_pool(self, lease_id) -> RemotePool:
        pool = self.pool_of_lease.get(lease_id) if isinstance(lease_id, str) else None
        if pool is None:
            raise Refused(403, "unknown", f"lease {str(lease_id)[:80]!r} is unknown: join again "
                                          "to get a new lease")
        return pool

    async def join(self, request):
        body = await self._json(request)
        name = body.get("pool")
        if name is None and len(self.pools) == 1:
            name = next(iter(self.pools))
        pool = self.pools.get(name)
        if pool is None:
            raise Refused(404, "unknown pool", f"no remote pool named {name!r}; this run's remote "
                                               f"pools: {sorted(self.pools)}")
        n = body.get("workers") or max(1, pool.cfg.workers)
        if not isinstance(n, int) or not 1 <= n <= 1024:
            raise Refused(400, "bad request", f"workers must be an integer in 1..1024, got {n!r}")
        now, leases = time.time(), []
        for _ in range(n):
            m = pool.grant(now, secret=new_lease_secret())
            self.pool_of_lease[m.lease.lease_id] = pool
            leases.append({"lease_id": m.lease.lease_id, "worker": m.worker, "secret": m.lease.secret})
        self.counters["leases_granted"] += n
        fc = self.cfg.fleet
        return web.json_response({
            "pool": name, "epoch": self.epoch, "leases": leases, "lease_s": fc.lease_s, "heartbeat_s": fc.heartbeat_s,
            "config": self.cfg.model_dump(mode="json"),
            "weights": self._weights(pool, request),
            "tokenizer_files": [f for f in TOKENIZER_FILES if (self.tokenizer_dir / f).is_file()]})

    def _weights(self, pool: RemotePool, request=None) -> list[str]:
        """Where the pool's workers pull weights: its region's announced relays, then the origin
        (an origin listening on every interface is named by the host the worker reached us at)."""
        origin = self.origin
        if request is not None and "://0.0.0.0:" in origin:
            origin = origin.replace("0.0.0.0", request.url.host or "127.0.0.1", 1)
        return [*self.relays.get(pool.cfg.region, []), origin]

    async def tokenizer(self, request):
        name = request.match_info["name"]
        if name not in TOKENIZER_FILES or not (self.tokenizer_dir / name).is_file():
            raise Refused(404, "no such file", f"no tokenizer file {name[:80]!r} here")
        return web.FileResponse(self.tokenizer_dir / name)

    async def heartbeat(self, request):
        lease_id = (await self._json(request)).get("lease_id")
        try:
            self._member_pool(lease_id).live(lease_id, time.time(), renew=True)
        except LeaseError as e:
            raise Refused(403, e.reason, str(e)) from None
        return web.json_response({"lease_id": lease_id, "lease_s": self.cfg.fleet.lease_s, "epoch": self.epoch})

    async def work(self, request):
        lease_id = request.query.get("lease_id")
        try:
            wait_s = min(float(request.query.get("wait_s", 10)), MAX_WAIT_S)
        except ValueError:
            raise Refused(400, "bad request", "wait_s must be a number") from None
        pool = self._member_pool(lease_id)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                a = pool.take(lease_id, time.time())
            except LeaseError as e:
                raise Refused(403, e.reason, str(e)) from None
            if a is not None:
                return web.json_response({"assignment": encode_assignment(a), "epoch": self.epoch,
                                          "weights": self._weights(pool, request)})
            if time.monotonic() >= deadline:
                return web.Response(status=204)
            await asyncio.sleep(0.02)

    async def results(self, request):
        body = await request.read()
        return web.json_response(await asyncio.to_thread(
            self._results, request.headers.get(LEASE_HEADER), request.headers.get(SIGNATURE_HEADER), body,
            request.headers.get(EPOCH_HEADER)))

    def _results(self, lease_id: str | None, signature: str | None, body: bytes,
                 epoch: str | None = None) -> dict:
        pool = self._member_pool(lease_id)
        if epoch is not None and epoch != self.epoch:
            # work an earlier trainer assigned: this one re-planned it from its checkpoint, so
            # the batch is not wrong, only late; nothing of it is trained and the lease stays
            raise Refused(410, "earlier epoch", f"batch for assignments of trainer epoch {epoch[:40]!r}; "
                                                "the trainer restarted and re-planned them")
        try:
            secret, _ = pool.secret_of(lease_id, time.time())
        except LeaseError as e:
            raise Refused(403, e.reason, str(e)) from None
        try:
            batch = open_batch(body, signature, lease_id, secret, self.guard)
        except AuthError as e:
            raise Refused(409 if e.reason == REPLAYED_BATCH else 403, e.reason, str(e)) from None
        except WireError as e:
            raise Refused(400, "bad batch", str(e)) from None
        try:
            fresh = self._checked(pool, lease_id, batch.results)
        except Refused as e:
            if e.status == 422:  # a wrong batch: the worker leaves, its work is re-run elsewhere
                pool.revoke(lease_id)
                self.counters["leases_revoked"] += 1
            raise
        except Exception:  # our own failure: let the retry of this batch id be processed
            self.guard.discard(lease_id, batch.batch_id)
            raise
        outcomes = Counter(pool.deliver(lease_id, r) for r in fresh)
        outcomes["duplicate"] += len(batch.results) - len(fresh)
        self.counters["batches"] += 1
        for k, v in outcomes.items():
            self.counters[f"results_{k}"] += v
        return {"accepted": outcomes["accepted"] + outcomes["late"], "late": outcomes["late"] > 0,
                "duplicate": outcomes["duplicate"] > 0}

    def _checked(self, pool: RemotePool, lease_id: str, results: list) -> list:
        """The batch's results not already delivered, each checked against what the lease was
        assigned (422 for the whole batch at the first problem: nothing of it is trained)."""
        fresh, latest = [], self.latest_version() or 0
        for r in results:
            a, done = pool.lookup(lease_id, r.assignment_id)
            if a is None:
                raise Refused(422, "not assigned", f"lease {lease_id[:80]!r} was never given "
                                                   f"assignment {r.assignment_id}")
            if done:
                continue
            problems = check_result(a, r, self.cfg.orchestrator.group_size, latest)
            if problems:
                raise Refused(422, "check failed", f"assignment {r.assignment_id}: " + "; ".join(problems[:5]))
            fresh.append(r)
        checked, bad, diff = self.verifier.mismatched([t for r in fresh for t in r.trajectories])
        self.counters["recomputed"] += checked
        if bad:
            raise Refused(422, "logprobs mismatch", f"{bad} of {checked} recomputed trajectories "
                                                     f"differ from their recorded logprobs (max |diff| {diff:.3g})")
        return fresh

    async def leave(self, request):
        ids = (await self._json(request)).get("lease_ids", [])
        released = []
        for lease_id in ids if isinstance(ids, list) else []:
            try:
                self._member_pool(lease_id).release(lease_id, time.time())
                released.append(lease_id)
            except (Refused, LeaseError):
                continue
        self.counters["leases_released"] += len(released)
        return web.json_response({"released": released})

    async def announce_relay(self, request):
        body = await self._json(request)
        region, url = body.get("region"), body.get("url")
        known = {r.name for r in self.cfg.fleet.regions}
        if region not in known or not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise Refused(400, "bad request", f"announce a relay as {{region: one of {sorted(known)}, "
                                              f"url: http(s)://...}}, got {body!r:.200}")
        urls = self.relays.setdefault(region, [])
        if url not in urls:
            urls.append(url)
        return web.json_response({"region": region, "relays": urls})
