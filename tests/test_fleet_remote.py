"""Remote pools over HTTP (tidal.fleet.coordinator, remote, join): refusals at the HTTP level, and
runs that survive faults with every step trained once and no trajectory lost or trained twice."""

import copy
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_orchestrator import TINY, ckpt, records  # noqa: F401  (the module-scoped checkpoint fixture)

from tidal.cli.worker import remote_worker
from tidal.config import load_config
from tidal.env import from_config
from tidal.fleet.auth import SIGNATURE_HEADER, sign
from tidal.fleet.coordinator import EPOCH_HEADER, LEASE_HEADER, Coordinator
from tidal.fleet.join import FleetClient, Joined
from tidal.fleet.pools import RemoteFleet
from tidal.fleet.remote import RemotePool
from tidal.fleet.wire import StepTasks, decode_assignment, encode_results
from tidal.orchestrator.loop import run_rl
from tidal.orchestrator.planning import plan_step
from tidal.sync.transport import HttpWeightPublisher

TOKEN = "test-fleet-token-" + "x" * 16
SRC = str(Path(__file__).resolve().parents[1] / "src")
PER_STEP = 4 * 2  # TINY: tasks_per_step * group_size


def fleet_toml(path: Path, pools: list[str], lease_s=3.0, heartbeat_s=0.5, listen="127.0.0.1:0",
               verify_fraction=0.0) -> Path:
    text = (f"[fleet]\nlease_s = {lease_s}\nheartbeat_s = {heartbeat_s}\nlisten = {listen!r}\n"
            f"verify_fraction = {verify_fraction}\n")
    for name in pools:
        text += f'[[fleet.pools]]\nname = "{name}"\nplacement = "remote"\nworkers = 1\n'
    path.write_text(text.replace("'", '"'))
    return path


def fleet_cfg(tmp_path, pools=("far",), *extra, **fleet):
    return load_config(fleet_toml(tmp_path / "fleet.toml", list(pools), **fleet), [*TINY, *extra])


HANG_S = 600.0
"""How long the waits below give a run before calling it hung: they catch a hang, not slowness
(with other work on this 2-core machine a child `tidal train` took over 60 s to start)."""


@pytest.fixture(autouse=True)
def _token(monkeypatch):
    monkeypatch.setenv("TIDAL_FLEET_TOKEN", TOKEN)


class Trainer:
    """run_rl in a thread; ``url()`` waits for the coordinator."""

    def __init__(self, cfg, run_dir: Path, init):
        self.run_dir, self.summary, self.error = run_dir, None, None
        self.thread = threading.Thread(target=self._run, args=(cfg, init), daemon=True)
        self.thread.start()

    def _run(self, cfg, init):
        try:
            self.summary = run_rl(cfg, self.run_dir, init, progress=False, remote_pools=RemoteFleet)
        except BaseException as e:  # noqa: BLE001 - re-raised by finish()
            self.error = e

    def url(self, timeout_s=HANG_S) -> str:
        return wait_url(self.run_dir, timeout_s)

    def finish(self, timeout_s=HANG_S):
        self.thread.join(timeout_s)
        if self.error is not None:
            raise self.error
        assert self.summary is not None, "the run did not finish in time"
        return self.summary


def wait_url(run_dir: Path, timeout_s=HANG_S) -> str:
    deadline = time.time() + timeout_s
    while not (run_dir / "fleet_url").is_file():
        assert time.time() < deadline, "the coordinator never wrote fleet_url"
        time.sleep(0.05)
    return (run_dir / "fleet_url").read_text().strip()


def wait_step(run_dir: Path, step: int, trainer=None, timeout_s=HANG_S) -> None:
    deadline = time.time() + timeout_s
    while not any(r["step"] >= step for r in records_if_any(run_dir, "step")):
        assert time.time() < deadline, f"step {step} never trained"
        assert trainer is None or trainer.thread.is_alive(), f"the run ended before step {step}: {trainer.error}"
        time.sleep(0.05)


def joined(url, pool=None, workers=1, **kw) -> Joined:
    j = Joined(url, TOKEN, remote_worker, pool, workers, log=lambda msg: None, **kw)
    j.start()
    return j


def worker_process(url, pool, workers=1) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "TIDAL_AUTO_DTYPE": "float32"}
    return subprocess.Popen([sys.executable, "-m", "tidal", "worker", "--join", url, "--pool", pool,
                             "--workers", str(workers)], env=env, stdout=subprocess.DEVNULL,
                            stderr=open(os.environ.get("TIDAL_TEST_WORKER_LOG", os.devnull), "a"))


def records_if_any(run_dir: Path, kind: str) -> list:
    return records(run_dir, kind) if (run_dir / "metrics.jsonl").is_file() else []


def assert_exactly_once(run_dir: Path, summary, steps: int) -> None:
    """Every step trained once, each on exactly tasks_per_step * group_size trajectories."""
    rec = records(run_dir, "step")
    assert [r["step"] for r in rec] == list(range(1, steps + 1))
    assert [r["trajectories"] for r in rec] == [PER_STEP] * steps
    assert summary.steps == steps and summary.trajectories == steps * PER_STEP


# ------------------------------------------------------------------ refusals at the HTTP level


@pytest.fixture
def coordinator(tmp_path, ckpt):  # noqa: F811
    """A coordinator with one remote pool, version 0 published, verify_fraction = 1."""
    from tidal.model import from_pretrained

    cfg = fleet_cfg(tmp_path, verify_fraction=1.0)
    store = HttpWeightPublisher(tmp_path / "weights", cfg.sync, cfg.model.dtype)
    store.publish(from_pretrained(ckpt), 0)
    pool = RemotePool(cfg.fleet.pools[0], itertools.count(), cfg.fleet.lease_s)
    coord = Coordinator(cfg, tmp_path, TOKEN, store.address, ckpt, store.latest_version)
    coord.add_pool(pool)
    coord.start()
    yield cfg, coord, pool
    coord.stop()
    store.close()


def upload(url, lease, body, token=TOKEN, secret=None, epoch=None):
    client = FleetClient(url, token)
    headers = {LEASE_HEADER: lease["lease_id"], SIGNATURE_HEADER: sign(secret or lease["secret"], body)}
    if epoch is not None:
        headers[EPOCH_HEADER] = epoch
    status, data = client.request("POST", "/v1/results", body, headers)
    return status, json.loads(data)


def test_uploads_are_refused_counted_and_never_trained_unless_signed_assigned_and_true(coordinator):
    cfg, coord, pool = coordinator
    j = Joined(coord.url, TOKEN, remote_worker, log=lambda m: None)  # joined, its threads not started
    lease = j.workers[0].lease
    (w,), _ = pool.members(time.time())
    assignment = plan_step(cfg, from_config(cfg.env, sandbox=None), 0, 0, workers=1)[0]
    future = pool.submit(w, assignment)
    worker = remote_worker(j.config_json, j.weights, j.tokenizer_dir, w)
    status, data = j.client.request("GET", f"/v1/work?lease_id={lease['lease_id']}&wait_s=1")
    assert status == 200
    result = worker.rollout(decode_assignment(json.loads(data)["assignment"], StepTasks(worker.cfg, worker.env)))

    def batch(r, batch_id):
        return encode_results([r], lease_id=lease["lease_id"], batch_id=batch_id)

    honest = batch(result, "b1")
    assert upload(coord.url, lease, honest, token="")[0] == 401
    assert upload(coord.url, lease, honest, token="not-the-token-" + "y" * 16)[0] == 401
    assert upload(coord.url, lease, honest, secret="0" * 64)[0] == 403
    assert not future.done()  # nothing refused reached the trainer

    assert upload(coord.url, lease, honest) == (200, {"accepted": 1, "late": False, "duplicate": False})
    assert future.result(timeout=1).trajectories == result.trajectories
    assert upload(coord.url, lease, honest)[0] == 409  # the same batch again: replayed
    assert upload(coord.url, lease, batch(result, "b5"))[1]["duplicate"] is True
    assert pool.late_results() == []

    unknown = {"lease_id": "L999-nope", "secret": lease["secret"]}
    assert upload(coord.url, unknown, honest)[1]["reason"] == "unknown"
    assert j.client.json("POST", "/v1/heartbeat", {"lease_id": "L999-nope"})[1]["reason"] == "unknown"
    _, left = pool.members(time.time() + cfg.fleet.lease_s + 1)
    assert left == [w]
    status, answer = j.client.json("POST", "/v1/heartbeat", {"lease_id": lease["lease_id"]})
    assert (status, answer["reason"]) == (403, "expired") and "join again" in answer["error"]
    assert j.client.request("GET", f"/v1/work?lease_id={lease['lease_id']}")[0] == 403
    refused = coord.summary()["remote"]["refused"]
    assert refused == {"missing token": 1, "wrong token": 1, "bad signature": 1, "replayed batch": 1,
                       "unknown": 2, "expired": 2}
    assert coord.summary()["remote"]["recomputed"] >= len(result.trajectories)
    j.stop_event.set()


def _never_assigned(r):
    r.assignment_id = 999
    return "not assigned"


def _impossible_logprob(r):
    next(s for t in r.trajectories for s in t.segments if s.completion_ids).logprobs[0] = 0.5
    return "check failed"


def _shifted_logprob(r):  # still a plausible logprob: only recomputing it catches this
    next(s for t in r.trajectories for s in t.segments if s.completion_ids).logprobs[0] -= 0.25
    return "logprobs mismatch"


@pytest.mark.parametrize("tamper", [_never_assigned, _impossible_logprob, _shifted_logprob])
def test_a_wrong_batch_is_refused_and_its_worker_loses_the_lease(coordinator, tamper):
    """A batch for a task never assigned, or with tampered logprobs (caught by the checks or by
    the recompute): 422, counted, nothing trained; the lease is revoked, so the worker leaves
    and what it held is queued again for another; its honest upload afterwards is refused."""
    cfg, coord, pool = coordinator
    j = Joined(coord.url, TOKEN, remote_worker, log=lambda m: None)
    lease = j.workers[0].lease
    (w,), _ = pool.members(time.time())
    assignment = plan_step(cfg, from_config(cfg.env, sandbox=None), 0, 0, workers=1)[0]
    future = pool.submit(w, assignment)
    worker = remote_worker(j.config_json, j.weights, j.tokenizer_dir, w)
    status, data = j.client.request("GET", f"/v1/work?lease_id={lease['lease_id']}&wait_s=1")
    result = worker.rollout(decode_assignment(json.loads(data)["assignment"], StepTasks(worker.cfg, worker.env)))
    bad = copy.deepcopy(result)
    reason = tamper(bad)
    status, body = upload(coord.url, lease, encode_results([bad], lease_id=lease["lease_id"], batch_id="x1"))
    assert (status, body["reason"]) == (422, reason)
    assert not future.done() or future.exception() is not None
    _, left = pool.members(time.time())
    assert left == [w] and isinstance(future.exception(timeout=1), Exception)
    status, answer = j.client.json("POST", "/v1/heartbeat", {"lease_id": lease["lease_id"]})
    assert (status, answer["reason"]) == (403, "revoked")
    honest = encode_results([result], lease_id=lease["lease_id"], batch_id="x2")
    assert upload(coord.url, lease, honest)[0] == 403 and pool.late_results() == []
    summary = coord.summary()["remote"]
    assert summary["refused"][reason] == 1 and summary["leases_revoked"] == 1
    j.stop_event.set()


def test_a_batch_of_an_earlier_trainer_is_dropped_and_the_lease_kept(coordinator):
    """A worker finishing what the trainer assigned before it restarted uploads to the restarted
    one, which re-planned that work from its checkpoint: 410, nothing trained, and unlike a
    wrong batch (422) the lease stays, so the pool keeps working for the new trainer."""
    cfg, coord, pool = coordinator
    j = Joined(coord.url, TOKEN, remote_worker, log=lambda m: None)
    lease = j.workers[0].lease
    (w,), _ = pool.members(time.time())
    future = pool.submit(w, plan_step(cfg, from_config(cfg.env, sandbox=None), 0, 0, workers=1)[0])
    worker = remote_worker(j.config_json, j.weights, j.tokenizer_dir, w)
    status, data = j.client.request("GET", f"/v1/work?lease_id={lease['lease_id']}&wait_s=1")
    answer = json.loads(data)
    result = worker.rollout(decode_assignment(answer["assignment"], StepTasks(worker.cfg, worker.env)))
    body = encode_results([result], lease_id=lease["lease_id"], batch_id="e1")
    status, refused = upload(coord.url, lease, body, epoch="an-earlier-trainer")
    assert (status, refused["reason"]) == (410, "earlier epoch") and not future.done()
    assert j.client.json("POST", "/v1/heartbeat", {"lease_id": lease["lease_id"]})[0] == 200
    body = encode_results([result], lease_id=lease["lease_id"], batch_id="e2")
    assert upload(coord.url, lease, body, epoch=answer["epoch"])[0] == 200  # this trainer's own
    assert future.result(timeout=1).trajectories == result.trajectories
    assert coord.summary()["remote"].get("leases_revoked", 0) == 0
    j.stop_event.set()


# ------------------------------------------------------------------ runs


def test_remote_pools_train_every_step_once_and_a_late_pool_joins(tmp_path, ckpt):  # noqa: F811
    cfg = fleet_cfg(tmp_path, ("a", "b"), "--orchestrator.steps", "4")
    trainer = Trainer(cfg, tmp_path / "run", ckpt)
    a = joined(trainer.url(), "a")
    wait_step(trainer.run_dir, 1)
    b = joined(trainer.url(), "b", workers=2)  # joins late: catches up from the origin
    summary = trainer.finish()
    a.stop(), b.stop()
    assert_exactly_once(trainer.run_dir, summary, 4)
    busy = {r["worker"] for r in records(trainer.run_dir, "worker") if r["state"] == "busy"}
    assert len(busy) >= 2  # the late pool got work too
    remote = summary.fleet["remote"]
    assert remote["leases_granted"] == 3 and remote["refused_total"] == 0
    assert (trainer.run_dir / "fleet_leases.json").stat().st_mode & 0o077 == 0


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["worker", "pool"])
def test_a_killed_worker_or_pool_loses_nothing(tmp_path, ckpt, kill):  # noqa: F811
    """kill -9 mid-episode: the lease expires, what it held is re-queued and done elsewhere."""
    cfg = fleet_cfg(tmp_path, ("a", "b"), "--orchestrator.steps", "5", "--engine.max_new_tokens", "32")
    trainer = Trainer(cfg, tmp_path / "run", ckpt)
    victim = worker_process(trainer.url(), "b", workers=1 if kill == "worker" else 2)
    wait_step(trainer.run_dir, 1, trainer)  # the victim alone trained step 1
    a = joined(trainer.url(), "a")
    wait_step(trainer.run_dir, 2, trainer)  # planned with the victim a member: it holds work
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    summary = trainer.finish()
    a.stop()
    assert_exactly_once(trainer.run_dir, summary, 5)
    assert summary.fleet["left"] == (1 if kill == "worker" else 2)
    assert summary.fleet["requeued"] >= 1


@pytest.mark.slow
def test_a_relay_gone_the_puller_falls_back_to_the_origin(tmp_path, ckpt):  # noqa: F811
    from tidal.sync.origin import STATS, ServerThread, make_app
    from tidal.sync.relay import Relay

    cfg = fleet_cfg(tmp_path, ("far",), "--orchestrator.steps", "4")
    trainer = Trainer(cfg, tmp_path / "run", ckpt)
    url = trainer.url()
    client = FleetClient(url, TOKEN)
    probe = client.json("POST", "/v1/join", {"workers": 1})[1]  # learn the origin, then leave
    client.json("POST", "/v1/leave", {"lease_ids": [probe["leases"][0]["lease_id"]]})
    origin = probe["weights"][-1]
    relay_state = Relay([origin], tmp_path / "relay", cfg.sync)
    app = make_app(relay_state.store, relay_state)
    relay = ServerThread(app)
    status, answer = FleetClient(url, TOKEN).json("POST", "/v1/relays", {"region": "local", "url": relay.url})
    assert status == 200 and answer["relays"] == [relay.url]
    w = joined(url)
    assert w.weights == [relay.url, origin]
    wait_step(trainer.run_dir, 1)
    assert app[STATS]["requests"] > 0  # it was serving the pool
    relay.stop()
    summary = trainer.finish()
    w.stop()
    assert_exactly_once(trainer.run_dir, summary, 4)


class CutProxy:
    """An HTTP proxy to the coordinator that fails uploads and lease renewals while ``cut``."""

    def __init__(self, target: str):
        from aiohttp import ClientSession, web

        from tidal.sync.origin import ServerThread

        self.target, self.cut, self.failed = target, False, 0

        async def forward(request):
            if self.cut and request.path in ("/v1/results", "/v1/heartbeat", "/v1/work"):
                self.failed += 1
                return web.Response(status=503, text="region cut off")
            async with ClientSession() as s, s.request(
                    request.method, f"{self.target}{request.path_qs}", data=await request.read(),
                    headers={k: v for k, v in request.headers.items() if k.lower() != "host"}) as r:
                return web.Response(status=r.status, body=await r.read(),
                                    headers={"Content-Type": r.headers.get("Content-Type", "application/json")})

        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", forward)
        self.server = ServerThread(app)


@pytest.mark.slow
def test_a_region_cut_off_then_back_loses_nothing_and_trains_nothing_twice(tmp_path, ckpt):  # noqa: F811
    cfg = fleet_cfg(tmp_path, ("far",), "--orchestrator.steps", "4", "--engine.max_new_tokens", "32",
                    lease_s=2.0, heartbeat_s=0.4)
    trainer = Trainer(cfg, tmp_path / "run", ckpt)
    proxy = CutProxy(trainer.url())
    w = joined(proxy.server.url, workers=2)
    wait_step(trainer.run_dir, 1)
    proxy.cut = True
    time.sleep(2 * cfg.fleet.lease_s)  # the leases expire meanwhile; their work is re-queued
    proxy.cut = False
    summary = trainer.finish()
    w.stop()
    proxy.server.stop()
    assert proxy.failed > 0
    assert_exactly_once(trainer.run_dir, summary, 4)
    remote = summary.fleet["remote"]
    assert summary.fleet["left"] >= 2 and remote["leases_granted"] >= 3  # expired, joined again
    assert remote["refused"].get("expired", 0) >= 1  # the worker was told why


@pytest.mark.slow
def test_the_trainer_restarted_from_its_checkpoint_keeps_the_pools_leases(tmp_path, ckpt):  # noqa: F811
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    recipe = fleet_toml(tmp_path / "fleet.toml", ["far"], lease_s=120.0, heartbeat_s=0.5,
                        listen=f"127.0.0.1:{port}")
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "tidal", "train", str(recipe), "--run-dir", str(run), "--model.init_from",
           str(ckpt), *TINY, "--orchestrator.steps", "5", "--orchestrator.checkpoint_every", "1"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = worker_process(wait_url(run), "far", workers=2)
    try:
        wait_step(run, 2)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        leases = json.loads((run / "fleet_leases.json").read_text())["leases"]
        assert len(leases) == 2
        resumed = subprocess.run([sys.executable, "-m", "tidal", "train", "--resume", str(run)], env=env,
                                 capture_output=True, text=True, timeout=HANG_S, check=False)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert worker.poll() is None  # the pool carried on
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    summary = json.loads((run / "summary.json").read_text())
    rec = records(run, "step")
    assert [r["step"] for r in rec] == [1, 2, 3, 4, 5] and [r["trajectories"] for r in rec] == [PER_STEP] * 5
    assert summary["steps"] == 5 and summary["trajectories"] == 5 * PER_STEP
    remote = summary["fleet"]["remote"]
    assert remote["leases_reloaded"] == 2 and remote.get("leases_granted", 0) == 0
    assert worker.returncode == 0


def test_tidal_worker_without_a_token_says_how_to_give_one(monkeypatch):
    monkeypatch.delenv("TIDAL_FLEET_TOKEN")
    from tidal.cli import main

    assert main(["worker", "--join", "http://127.0.0.1:9"]) == 2


def test_unknown_pool_is_refused_naming_the_pools(coordinator):
    _, coord, _ = coordinator
    status, answer = FleetClient(coord.url, TOKEN).json("POST", "/v1/join", {"pool": "nope"})
    assert status == 404 and "far" in answer["error"]
