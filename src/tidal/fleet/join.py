"""The worker side of a remote pool (`tidal worker --join URL`): N rollout workers in one process
that share nothing with the trainer but HTTP.

    join (run token) ──> a lease per worker, the run's config, weight URLs, tokenizer files
    per worker (a thread): long-poll /v1/work ──> rollout ──> upload the result as a signed batch
        (retried with backoff under the same batch id: idempotent; 409 "replayed" means an
        earlier try got through) ──> next
    a heartbeat thread renews every lease each heartbeat_s; a lease refused as unknown or expired
    makes its worker join again (with a fresh lease; what it was running still uploads, as a
    late result of the ended lease)
    stop (SIGTERM): every lease is released, so the orchestrator re-queues at once

A worker's model comes from the first weight version it pulls (``MultiSource``; the worker itself
is built by the entry point, tidal.cli.worker.remote_worker) (a late joiner catches up through
anchor + deltas, tidal.sync.pull) and its tokenizer from the files the coordinator served,
written to a temp dir; the weight URLs are tried in order (the region's relay, then the origin),
so a relay that goes away is stepped over.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from tidal.errors import UserError
from tidal.fleet.auth import SIGNATURE_HEADER, bearer, redact, sign
from tidal.fleet.coordinator import EPOCH_HEADER, LEASE_HEADER
from tidal.fleet.wire import StepTasks, decode_assignment, encode_results
from tidal.sync.errors import SyncError
from tidal.sync.pull import NO_PROXY, Puller
from tidal.sync.transport import HttpWeightSource

NETWORK = (OSError, urllib.error.URLError)
MAX_BACKOFF_S = 5.0


class JoinError(UserError):
    """The coordinator refused to let this process join (a wrong token, an unknown pool)."""


class FleetClient:
    """JSON over HTTP to the coordinator, with the run token; ``request`` returns (status, body)
    for every HTTP answer and raises OSError when none came."""

    def __init__(self, url: str, token: str, timeout_s: float = 60.0):
        self.url, self.token, self.timeout_s = url.rstrip("/"), token, timeout_s

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(f"{self.url}{path}", data=body, method=method,
                                     headers={"Authorization": bearer(self.token), **(headers or {})})
        try:
            with NO_PROXY.open(req, timeout=self.timeout_s) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def json(self, method: str, path: str, obj: dict | None = None) -> tuple[int, dict]:
        body = None if obj is None else json.dumps(obj).encode()
        status, data = self.request(method, path, body, {"Content-Type": "application/json"})
        try:
            return status, (json.loads(data) if data else {})
        except ValueError:
            return status, {"error": data[:200].decode("utf-8", "replace")}


class MultiSource(HttpWeightSource):
    """HttpWeightSource over several upstreams in order (relay, then origin); while none answers
    it keeps reporting the last version it saw, so a rollout goes on with the weights it holds."""

    def __init__(self, upstreams: list[str], cfg):
        self.cfg = cfg
        self.puller = Puller(upstreams, cfg)
        self._asked_at, self._latest = float("-inf"), None

    def latest_version(self) -> int | None:
        try:
            return super().latest_version()
        except SyncError:
            return self._latest

    def reset(self, upstreams: list[str]) -> None:
        """Forget what is held and pull from ``upstreams`` from now on (a restarted trainer)."""
        self.puller.close()
        self.puller = Puller(upstreams, self.cfg)
        self._asked_at, self._latest = float("-inf"), None


class Joined:
    """One process's workers of one remote pool (see the module docstring)."""

    def __init__(self, url: str, token: str, make_worker, pool: str | None = None,
                 workers: int | None = None, relay: str | None = None, log=None):
        """``make_worker(config_json, weight_urls, tokenizer_dir, worker_id)``: a RolloutWorker
        built from what the coordinator sent (tidal.cli.worker.remote_worker: the entry point
        assembles engine, environment and config, which the fleet layer does not import)."""
        self.client = FleetClient(url, token)
        self.make_worker = make_worker
        self.pool, self.relay = pool, relay
        self.stop_event = threading.Event()
        self.log = log or (lambda msg: print(redact(msg, token), file=sys.stderr, flush=True))
        first = self._join(workers)
        self.pool = first["pool"]
        self.heartbeat_s = first["heartbeat_s"]
        self.config_json = first["config"]
        self.epoch = first["epoch"]
        self.weights = ([relay] if relay else []) + first["weights"]
        self.tokenizer_dir = self._tokenizer(first["tokenizer_files"])
        self.workers = [Slot(self, lease) for lease in first["leases"]]
        self.uploaded = 0
        self._lock = threading.Lock()

    def _join(self, workers: int | None) -> dict:
        """POST /v1/join (retried while the coordinator is unreachable); JoinError if refused."""
        body = {"pool": self.pool, **({"workers": workers} if workers else {})}
        for attempt in range(1_000_000):
            try:
                status, answer = self.client.json("POST", "/v1/join", body)
            except NETWORK as e:
                if self.stop_event.is_set():
                    raise JoinError("stopped before joining") from None
                self.log(f"join: coordinator {self.client.url} unreachable ({e}); retrying")
                time.sleep(backoff(attempt))
                continue
            if status != 200:
                raise JoinError(f"{self.client.url} refused to let this pool join ({status}): "
                                f"{answer.get('error', answer)}")
            return answer
        raise AssertionError("unreachable")

    def rejoin(self) -> dict:
        """A fresh lease for one worker."""
        return self._join(1)["leases"][0]

    def _tokenizer(self, names: list[str]) -> str:
        folder = Path(tempfile.mkdtemp(prefix="tidal-worker-tokenizer-"))
        for name in names:
            status, data = self.client.request("GET", f"/v1/tokenizer/{name}")
            if status != 200:
                raise JoinError(f"tokenizer file {name}: the coordinator answered {status}")
            (folder / name).write_bytes(data)
        return str(folder)

    def start(self) -> None:
        for slot in self.workers:
            slot.thread.start()
        threading.Thread(target=self._heartbeats, daemon=True, name="tidal-heartbeat").start()

    def _heartbeats(self) -> None:
        while not self.stop_event.wait(self.heartbeat_s):
            for slot in self.workers:
                lease = slot.lease
                if slot.stopped:
                    continue
                try:
                    status, answer = self.client.json("POST", "/v1/heartbeat", {"lease_id": lease["lease_id"]})
                except NETWORK:
                    continue  # cut off for now: try again next beat
                if status == 403 and slot.lease is lease:
                    self.log(f"worker {lease['worker']}: lease refused ({answer.get('reason')}); joining again")
                    slot.lost = True
                elif status == 200 and answer.get("epoch") not in (None, slot.epoch):
                    slot.restarted.set()  # what it runs belongs to the trainer before

    def release(self, lease: dict) -> None:
        """Give one lease back (the orchestrator re-queues what it held at once)."""
        try:
            self.client.json("POST", "/v1/leave", {"lease_ids": [lease["lease_id"]]})
        except NETWORK as e:
            self.log(f"leave: coordinator unreachable ({e}); the lease will expire")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Release every lease (the orchestrator re-queues what they held at once)."""
        self.stop_event.set()
        ids = [slot.lease["lease_id"] for slot in self.workers]
        try:
            self.client.json("POST", "/v1/leave", {"lease_ids": ids})
        except NETWORK as e:
            self.log(f"leave: coordinator unreachable ({e}); the leases will expire")
        for slot in self.workers:
            slot.thread.join(timeout=timeout_s / max(1, len(self.workers)))
            if slot.worker is not None:
                slot.worker.store.puller.close()

    def count_upload(self) -> None:
        with self._lock:
            self.uploaded += 1


class Slot:
    """One worker: its lease (replaced when it is lost), its engine, its thread."""

    def __init__(self, joined: Joined, lease: dict):
        self.joined, self.lease, self.lost = joined, lease, False
        self.epoch = joined.epoch
        self.restarted = threading.Event()
        """Set by a heartbeat naming another epoch than this worker's assignment: the trainer
        restarted and re-planned that work, so its rollout is dropped, not retried."""
        self.stopped = False
        """True once the worker thread ended on an error (its lease released, no heartbeats)."""
        self.worker = None
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"tidal-worker-{lease['worker']}")

    def _run(self) -> None:
        j = self.joined
        try:
            self.worker = j.make_worker(j.config_json, j.weights, j.tokenizer_dir, self.lease["worker"])
            tasks = StepTasks(self.worker.cfg, self.worker.env)
            attempt = 0
            while not j.stop_event.is_set():
                if self.lost:
                    self.lease, self.lost = j.rejoin(), False
                    self.worker.worker_id = self.lease["worker"]
                try:
                    a = self._next(tasks)
                    attempt = 0
                except NETWORK as e:
                    j.log(f"worker {self.lease['worker']}: coordinator unreachable ({e})")
                    time.sleep(backoff(attempt))
                    attempt += 1
                    continue
                if a is not None:
                    self._run_one(a)
        except Exception as e:  # noqa: BLE001 - a worker thread reports and ends
            if not j.stop_event.is_set():
                j.log(f"worker {self.lease['worker']} stopped: {type(e).__name__}: {e}")
                # the heartbeat thread would keep its lease alive with nobody working under it:
                # give it back, so what it held is re-queued now
                self.stopped = True
                j.release(self.lease)

    def _next(self, tasks):
        lease_id = self.lease["lease_id"]
        status, data = self.joined.client.request("GET", f"/v1/work?lease_id={lease_id}&wait_s=5")
        if status == 204:
            return None
        if status == 403:
            self.lost = True
            return None
        if status != 200:
            raise OSError(f"/v1/work answered {status}: {data[:200]!r}")
        answer = json.loads(data)
        if answer["epoch"] != self.epoch:
            self._new_epoch(answer)
        self.restarted.clear()  # after the epoch is this trainer's: its work is not dropped
        return decode_assignment(answer["assignment"], tasks)

    def _new_epoch(self, answer: dict) -> None:
        """The trainer restarted: its versions are new ones (same numbers, other weights), from a
        new origin. Pull the newest afresh before generating again."""
        urls = ([self.joined.relay] if self.joined.relay else []) + answer["weights"]
        self.worker.store.reset(urls)
        self.worker._first_version()
        self.worker._load(self.worker.store.latest_version())
        self.epoch = answer["epoch"]

    def _run_one(self, a) -> None:
        """Roll the assignment out (again after a backoff if its weights could not be had)."""
        j = self.joined
        lease = self.lease
        for attempt in range(1_000_000):
            if j.stop_event.is_set():
                return
            if self.restarted.is_set():  # its weights' origin is gone with the trainer before
                j.log(f"worker {lease['worker']}: the trainer restarted; assignment {a.assignment_id} dropped")
                return
            try:
                result = self.worker.rollout(a)
                break
            except SyncError as e:
                j.log(f"worker {lease['worker']}: weights unavailable ({e}); retrying")
                time.sleep(backoff(attempt))
        self.upload([result], lease)

    def upload(self, results: list, lease: dict) -> str:
        """POST the batch until an answer settles it: "accepted", "delivered-before" (409: an
        earlier try got through), or "refused" (dropped, the reason logged)."""
        j = self.joined
        batch_id = uuid.uuid4().hex
        body = encode_results(results, lease_id=lease["lease_id"], batch_id=batch_id)
        headers = {LEASE_HEADER: lease["lease_id"], SIGNATURE_HEADER: sign(lease["secret"], body),
                   EPOCH_HEADER: self.epoch, "Content-Type": "application/json"}
        for attempt in range(1_000_000):
            if j.stop_event.is_set():
                return "stopped"
            try:
                status, data = j.client.request("POST", "/v1/results", body, headers)
            except NETWORK:
                status, data = None, b""
            if status == 200:
                j.count_upload()
                return "accepted"
            if status == 409:
                return "delivered-before"
            if status in (400, 401, 403, 404, 410, 422):
                j.log(f"worker {lease['worker']}: batch refused ({status}): {data[:300]!r}")
                if status == 403 and lease is self.lease:
                    self.lost = True
                return "refused"
            time.sleep(backoff(attempt))
        return "gave up"


def backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (0, 1, ...): 0.1 s doubling up to MAX_BACKOFF_S."""
    return min(MAX_BACKOFF_S, 0.1 * 2 ** min(attempt, 10))


def run_workers(url: str, token: str, make_worker, pool: str | None = None, workers: int | None = None,
                relay: str | None = None, stop: threading.Event | None = None) -> Joined:
    """Join and run until ``stop`` is set (then leave). Returns the Joined, stopped."""
    joined = Joined(url, token, make_worker, pool, workers, relay)
    joined.start()
    joined.log(f"joined pool {joined.pool!r} with {len(joined.workers)} workers")
    (stop or threading.Event()).wait()
    joined.stop()
    return joined
