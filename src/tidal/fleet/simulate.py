"""A discrete-event simulator of a fleet (``tidal simulate``): the orchestrator's own scheduling,
lease and staleness code on a simulated clock, with models of everything that takes time.

What runs here is tidal's code, not a re-implementation of it:

    Scheduler (plan, dispatch, complete, add_worker, remove_worker, ready, take)
    split_step (how a step is split into assignments)       orchestrator/scheduler.py
    staleness_gate (what is trained, what dropped)          orchestrator/loop.py
    LeaseTable (grant, renew, release, expire)              fleet/lease.py
    capacity_at (pool schedules)                            fleet/config.py

and the driver loop mirrors ``Run._drive``: plan within the staleness bound, dispatch to idle
workers, collect results, and, when the oldest step is complete, gate, train and publish on the
trainer's thread while the driver keeps dispatching (``SimModel.dispatch_during_train = False``
models the older loop that trained in the driver's thread); held-out evaluations block both. What takes
time is modelled (``SimModel``): generation (tokens/s per worker times ``pool.speed``), rollout
lengths (lognormal, drawn per step so a re-run assignment regenerates the same tokens, as the
real seeds do), grading, the trainer's step (fixed + per token), publishing, held-out
evaluations, the upload of trajectories, and each region's weight delivery from first principles
(``tidal.sync.delivery.predict_delivery_s``: latency, bytes over bandwidth, the receiving CPU's decode). A worker in
region R starts an assignment needing ``min_version`` only once that version has reached R.

Workers of a pool follow ``capacity_at``: joiners get a lease and catch up (start-up, then the
full weights from their region's relay); leavers are killed and let their lease expire (or
release it, ``SimModel.leave``), and the scheduler re-queues what they held. A cut-off region
(``SimModel.partitions``) renews no lease and receives no weights; its results arrive when it is
back (a duplicate of work re-run elsewhere is dropped by the scheduler and counted).

Deterministic given the config, the model and the seed. Its limits are in docs/fleet.md.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import statistics
import tomllib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, ValidationError, model_validator

from tidal.errors import UserError
from tidal.fleet.config import LinkConfig, PoolConfig, capacity_at
from tidal.fleet.lease import LeaseError, LeaseTable
from tidal.orchestrator.loop import staleness_gate
from tidal.orchestrator.records import RunState
from tidal.orchestrator.scheduler import Scheduler, split_step
from tidal.orchestrator.worker import Assignment, RolloutResult
from tidal.section import Section
from tidal.sync.delivery import predict_delivery_s

if TYPE_CHECKING:
    from tidal.config import TidalConfig


class SimulateError(UserError):
    """A simulate recipe or model the user can fix (the message names the field)."""


EXAMPLES = ("local", "global")
"""Example recipes shipped in tidal/fleet/examples/, found by name."""


# ---------------------------------------------------------------------------- models

class Partition(Section):
    region: str
    """The region cut off (its uploads, lease renewals and weight downloads fail)."""
    start_s: float = Field(ge=0)
    """Simulated seconds after the start at which the region is cut off."""
    end_s: float = Field(gt=0)
    """When it is back."""

    @model_validator(mode="after")
    def _ordered(self) -> Partition:
        if self.end_s <= self.start_s:
            raise ValueError(f"simulate.partitions: end_s ({self.end_s}) must be after start_s ({self.start_s})")
        return self


class SimModel(Section):
    tokens_per_s: float = Field(2000.0, gt=0)
    """Generated tokens per second of one worker at pool.speed 1 (its engine's throughput with its
    batch of G episodes: calibrated as generated tokens over engine seconds)."""
    rollout_tokens_mean: float = Field(48.0, gt=0)
    """Mean generated tokens per trajectory (all its turns)."""
    rollout_tokens_sigma: float = Field(0.5, ge=0)
    """Sigma of the lognormal of generated tokens per trajectory (0 = every rollout the mean)."""
    rollout_tokens_max: int = Field(0, ge=0)
    """Longest rollout in tokens (the engine's budget); 0 = no cap."""
    prompt_tokens: float = Field(0.0, ge=0)
    """Tokens per trajectory the trainer processes besides the generated ones (prompt and
    environment turns)."""
    grade_s: float = Field(0.01, ge=0)
    """Worker seconds per trajectory outside the engine (environment, tools, grading)."""
    worker_start_s: float = Field(0.0, ge=0)
    """Seconds a new worker takes before its first assignment (process, model load, warm-up)."""
    train_fixed_s: float = Field(0.5, ge=0)
    """Seconds of one trainer step besides its tokens (optimizer, gate)."""
    train_per_token_s: float = Field(5e-4, ge=0)
    """Trainer seconds per trained token (forward + backward)."""
    publish_s: float = Field(0.1, ge=0)
    """Seconds the driver spends publishing a version (encoding the delta)."""
    eval_s: float = Field(0.0, ge=0)
    """Seconds the driver spends on each held-out evaluation (every orchestrator.eval_every steps;
    the workers get no new work meanwhile)."""
    full_bytes: float = Field(6.5e6, gt=0)
    """Bytes of the full serving weights (what a late joiner's anchor carries, and what the
    receiving CPU decodes and verifies per update)."""
    delta_bytes: float = Field(4.5e6, gt=0)
    """Bytes of one update on the wire (the encoded delta)."""
    decode_bytes_per_s: float = Field(2.0e9, gt=0)
    """Receiving CPU's rate of decode + apply + verify, in model bytes per second."""
    lan_bandwidth_mbps: float = Field(10_000.0, gt=0)
    """Bandwidth inside a region (origin or relay to a worker), megabits per second."""
    lan_latency_ms: float = Field(0.5, ge=0)
    """One-way latency inside a region, milliseconds."""
    trajectory_bytes_per_token: float = Field(16.0, ge=0)
    """Upload bytes per generated token (token id, logprob, version, mask)."""
    dispatch_during_train: bool = True
    """True: as orchestrator/loop.py does, a step trains and publishes on a trainer thread and the
    driver keeps dispatching. False: the older loop, which trained in the driver's thread, so a
    worker finishing meanwhile waited for the next dispatch."""
    leave: Literal["expire", "release"] = "expire"
    """How a worker of a pool whose capacity drops leaves: "expire" = it is killed and its lease
    runs out (its work is queued again lease_s after its last heartbeat); "release" = it says so
    and its work is queued again at once."""
    partitions: list[Partition] = Field(default_factory=list)
    """Regions cut off for a while (their leases expire; their results arrive when back)."""

    def rollout_mu(self) -> float:
        """The lognormal's mu for rollout_tokens_mean and rollout_tokens_sigma."""
        return math.log(self.rollout_tokens_mean) - self.rollout_tokens_sigma ** 2 / 2


# ---------------------------------------------------------------------------- the simulation


@dataclass
class SimTask:
    """A stand-in task: split_step only deals tasks out."""

    task_id: str


@dataclass(slots=True)
class SimTrajectory:
    """A stand-in Trajectory with what staleness_gate reads, for one whole GRPO group: its G
    samples run on one worker from one version, so they share their staleness (and the gate's
    verdict; complete_groups would keep or drop them together)."""

    group_id: int
    versions: list[int]
    """The policy version the group was generated with (the version at the assignment's start)."""
    tokens: int
    """Generated tokens of the whole group."""
    samples: int
    """Trajectories it stands for (orchestrator.group_size)."""

    @property
    def min_version(self) -> int:
        return self.versions[0]


@dataclass
class Job:
    """An assignment on a worker: started (start set) or waiting for the worker to be reachable."""

    assignment: Assignment
    token: int
    start: float | None = None
    busy_end: float = 0.0
    result: RolloutResult | None = None


@dataclass
class SimWorker:
    name: str
    pool: PoolConfig
    lease_id: str
    joined_at: float
    ready_at: float
    """It can generate from then (started, weights caught up)."""
    hb_origin: float
    """Its heartbeats tick at hb_origin + k * heartbeat_s."""
    version: int = 0
    """The policy version it holds."""
    alive: bool = True
    heartbeating: bool = True
    member: bool = True
    member_since: float = 0.0
    member_s: float = 0.0
    busy_s: float = 0.0
    wait_weights_s: float = 0.0
    job: Job | None = None
    undelivered: list[RolloutResult] = field(default_factory=list)
    rejoin: bool = False
    """Back from a partition with its lease gone: it joins again once its job is delivered."""


@dataclass
class SimResult:
    """What a simulated run predicts (``to_json`` is what ``--json`` writes)."""

    steps: int
    wall_s: float
    step_time_s: float
    step_time_median_s: float
    steps_per_hour: float
    trajectories_per_s: float
    tokens_per_s: float
    worker_utilisation: float
    utilisation_by_pool: dict[str, float]
    staleness_hist: dict[int, int]
    dropped_stale: int
    sync_latency_s: dict[str, float]
    sync_latency_model_s: dict[str, float]
    wait_weights_s: float
    requeued: int
    requeued_by_pool: dict[str, int]
    duplicates: int
    lost: int
    trained_twice: int
    planned_assignments: int
    stalled: bool
    step_times: list[float]

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["staleness_hist"] = {str(k): n for k, n in sorted(self.staleness_hist.items())}
        return out


class Simulation:
    """One simulated run of ``cfg`` under ``model`` (``run()`` once)."""

    def __init__(self, cfg: TidalConfig, model: SimModel, steps: int, seed: int):
        self.cfg, self.model, self.seed = cfg, model, seed
        self.oc, self.fleet = cfg.orchestrator, cfg.fleet
        self.pools = self.fleet.pools_or_default(self.oc.num_workers)
        self.regions = {r.name: r for r in self.fleet.regions}
        self.routes = {r: self._route(r) for r in self.regions}
        for i, p in enumerate(model.partitions):
            if p.region not in self.regions:
                raise SimulateError(f"simulate.partitions.{i}.region: {p.region!r} is not one of "
                                    f"fleet.regions ({sorted(self.regions)})")
        self.table = LeaseTable(self.fleet.lease_s)
        self.sched = Scheduler(self._plan, [], steps, self.oc.max_staleness, 0, 0.0)
        self.steps = steps
        self.heap: list = []
        self._seq = itertools.count()
        self.version = 0
        self.arrive: dict[str, list[float]] = {r: [0.0] for r in self.regions}
        """region -> version -> when a worker there has it applied."""
        self.notice: dict[str, list[float]] = {r: [0.0] for r in self.regions}
        """region -> version -> when workers there see it as the latest (its relay has it)."""
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.workers: dict[str, SimWorker] = {}
        self.by_lease: dict[str, SimWorker] = {}
        self.wanted: dict[str, list[SimWorker]] = {p.name: [] for p in self.pools}
        self.pending: list[tuple[str, RolloutResult]] = []
        self.state = RunState()
        self.gate_state = RunState()
        """What staleness_gate counts, per group."""
        self.hist: Counter = Counter()
        self.driver_free_at = 0.0
        self.trainer_free_at = 0.0
        self.training = False
        self.publish_times: list[float] = []
        self.trained_ids: Counter = Counter()
        self.planned: dict[int, list[int]] = {}
        """step -> the ids of its assignments."""
        self.requeued_by_pool: Counter = Counter()
        self.gen_tokens = 0
        self._lengths_cache: dict[int, np.ndarray] = {}
        self._lease_event_at: float | None = None
        self.now = 0.0

    # ------------------------------------------------------------------ topology

    def _route(self, region: str) -> list[LinkConfig]:
        """The links from the trainer's region to ``region``, lowest total latency first."""
        start = self.fleet.trainer_region
        best: dict[str, tuple[float, list[LinkConfig]]] = {start: (0.0, [])}
        frontier = [(0.0, start)]
        while frontier:
            d, r = heapq.heappop(frontier)
            if d > best[r][0]:
                continue
            for link in self.fleet.links:
                if r not in (link.a, link.b):
                    continue
                other = link.b if link.a == r else link.a
                nd = d + link.latency_ms
                if other not in best or nd < best[other][0]:
                    best[other] = (nd, best[r][1] + [link])
                    heapq.heappush(frontier, (nd, other))
        if region not in best:
            used = [p.name for p in self.pools if p.region == region]
            if used:
                raise SimulateError(f"fleet.links: no link (or chain of links) joins the trainer's region "
                                    f"{start!r} to region {region!r} (pool {used[0]!r}): add one for simulate")
            return []
        return best[region][1]

    def _lan_s(self, delta: float, full: float, decode: float) -> float:
        m = self.model
        return predict_delivery_s(delta, full, m.lan_bandwidth_mbps * 1e6, m.lan_latency_ms / 1e3, decode)

    def _wan_s(self, region: str, delta: float, full: float, share: int) -> float:
        return sum(predict_delivery_s(delta, full, link.bandwidth_mbps * 1e6 / share, link.latency_ms / 1e3,
                                      math.inf) for link in self.routes[region])

    def delivery_s(self, region: str, nbytes: float | None = None) -> float:
        """Publish -> applied and verified on a worker of ``region`` for an update of ``nbytes``
        (default: one delta): over the links to the region's relay once, then the LAN; without a
        relay every worker of the region pulls across the links, sharing their bandwidth."""
        m = self.model
        delta = m.delta_bytes if nbytes is None else nbytes
        if region == self.fleet.trainer_region:
            return self._lan_s(delta, m.full_bytes, m.decode_bytes_per_s)
        if self.regions[region].relay:
            return self._wan_s(region, delta, 0.0, 1) + self._lan_s(delta, m.full_bytes, m.decode_bytes_per_s)
        share = max(1, sum(1 for w in self.workers.values() if w.member and w.pool.region == region))
        return self._wan_s(region, delta, 0.0, share) + m.full_bytes / m.decode_bytes_per_s

    def upload_s(self, region: str, tokens: int) -> float:
        """Seconds for an assignment's trajectories to reach the orchestrator."""
        nbytes = tokens * self.model.trajectory_bytes_per_token
        lan = self.model.lan_latency_ms / 1e3 + nbytes * 8 / (self.model.lan_bandwidth_mbps * 1e6)
        return lan + self._wan_s(region, nbytes, 0.0, 1)

    def is_cut(self, region: str, t: float) -> bool:
        return any(p.region == region and p.start_s <= t < p.end_s for p in self.model.partitions)

    # ------------------------------------------------------------------ events

    def push(self, t: float, kind: str, data: Any = None) -> None:
        heapq.heappush(self.heap, (t, next(self._seq), kind, data))

    def run(self) -> SimResult:
        for pool in self.pools:
            self._set_capacity(pool, 0.0)
        for p in self.model.partitions:
            self.push(p.start_s, "cut", p.region)
            self.push(p.end_s, "heal", p.region)
        self.push(0.0, "driver")
        budget = self.oc.time_budget_s
        stalled = True
        while self.heap:
            t, _, kind, data = heapq.heappop(self.heap)
            if self.state.step >= self.steps or (t > budget and not self.training):
                stalled = False
                break
            self.now = t
            getattr(self, f"_on_{kind}")(t, data)
        else:
            stalled = self.state.step < self.steps
        return self._result(self.now, stalled)

    def _on_driver(self, t: float, _data) -> None:
        """A loop iteration of Run._drive: plan, dispatch, collect; train the oldest complete step."""
        if t < self.driver_free_at:
            return
        while True:
            self.sched.plan(self.version)
            for d in self.sched.dispatch(t):
                self._start(self.workers[d.worker], d.assignment, t)
            got = self._collect(t)
            if not self.training and t >= self.trainer_free_at and self.sched.ready(self.state.step):
                self._train(t)
                if not self.model.dispatch_during_train:
                    return
                continue
            if not got:
                return

    def _collect(self, t: float) -> bool:
        got, self.pending = self.pending, []
        for name, result in got:
            self.sched.complete(name, result, t)
        return bool(got)

    def _train(self, t: float) -> None:
        oc, m = self.oc, self.model
        step = self.state.step
        results = self.sched.take(step)
        self.trained_ids.update(r.assignment_id for r in results)
        groups = sorted((x for r in results for x in r.trajectories), key=lambda x: x.group_id)
        kept, hist = staleness_gate(groups, self.version, oc.max_staleness, self.gate_state, oc.keep_stale)
        self.hist.update({k: n * oc.group_size for k, n in hist.items()})
        tokens = sum(x.tokens + m.prompt_tokens * x.samples for x in kept)
        self.state.trajectories += sum(x.samples for x in kept)
        self.training = True
        done = t + m.train_fixed_s + m.train_per_token_s * tokens + m.publish_s
        if not m.dispatch_during_train:
            self.driver_free_at = done
        self.trainer_free_at = done
        self.push(done, "trained", step)

    def _on_trained(self, t: float, step: int) -> None:
        """Version step + 1 is published: it travels to every region; the driver goes on (after a
        held-out evaluation, when one is due)."""
        self.training = False
        self.version += 1
        self.state.step += 1
        self.publish_times.append(t)
        for region in self.regions:
            self._deliver(region, t)
        oc = self.oc
        if oc.eval_every and self.state.step % oc.eval_every == 0 and self.state.step < self.steps:
            self.trainer_free_at = t + self.model.eval_s
            self.driver_free_at = t + self.model.eval_s  # the loop evaluates on the driver's thread
        self.push(t, "driver")
        if self.trainer_free_at > t:
            self.push(self.trainer_free_at, "driver")

    def _deliver(self, region: str, t: float) -> None:
        """Version ``self.version``, published at ``t``, reaches ``region``: its relay (or the
        origin) has it at ``notice`` (workers starting from then load it), each worker has it
        applied at ``arrive``; a cut-off region gets it once back."""
        d = self.delivery_s(region)
        last = self.model.full_bytes / self.model.decode_bytes_per_s
        if region == self.fleet.trainer_region or self.regions[region].relay:
            last = self._lan_s(self.model.delta_bytes, self.model.full_bytes, self.model.decode_bytes_per_s)
        at = t + d
        for p in self.model.partitions:
            if p.region == region and at >= p.start_s and t < p.end_s:
                at = max(at, p.end_s + d)
        at = max(at, self.arrive[region][-1])
        self.arrive[region].append(at)
        self.notice[region].append(max(t, at - last, self.notice[region][-1]))
        self.latency[region].append(at - t)
        if any(w.pool.region == region and w.job is not None and w.job.start is None for w in self.workers.values()):
            self.push(at, "driver")

    def _on_finish(self, t: float, data) -> None:
        name, token = data
        w = self.workers[name]
        job = w.job
        if job is None or job.token != token or not w.alive:
            return
        w.busy_s += job.busy_end - job.start
        w.job = None
        self.gen_tokens += job.result.generated_tokens
        if self.is_cut(w.pool.region, t):
            w.undelivered.append(job.result)
            return
        self.pending.append((name, job.result))
        if w.rejoin:
            self._retire_and_rejoin(w, t)
        self.push(t, "driver")

    # ------------------------------------------------------------------ workers

    def _plan(self, step: int, first_id: int) -> list[Assignment]:
        """The loop's plan_step on stand-in tasks, split among the workers that are members now."""
        tasks = [SimTask(f"s{step}t{i}") for i in range(self.oc.tasks_per_step)]
        out = split_step(tasks, step, first_id, max(1, self.sched.num_workers), self.oc.max_staleness)
        self.planned[step] = [a.assignment_id for a in out]
        return out

    def lengths(self, step: int) -> np.ndarray:
        """Generated tokens of step ``step``'s trajectories, [task, sample]: drawn from (seed, step)
        only, so however a step is split or re-run its rollouts are the same."""
        if step not in self._lengths_cache:
            m = self.model
            rng = np.random.default_rng([self.seed, step])
            shape = (self.oc.tasks_per_step, self.oc.group_size)
            x = rng.lognormal(m.rollout_mu(), m.rollout_tokens_sigma, shape) if m.rollout_tokens_sigma \
                else np.full(shape, m.rollout_tokens_mean)
            x = np.maximum(1, np.rint(x)).astype(np.int64)
            if m.rollout_tokens_max:
                x = np.minimum(x, m.rollout_tokens_max)
            self._lengths_cache = {k: v for k, v in self._lengths_cache.items() if k >= step - 64}
            self._lengths_cache[step] = x
        return self._lengths_cache[step]

    def _start(self, w: SimWorker, a: Assignment, t: float) -> None:
        """``a`` was dispatched to ``w``: it waits for its weights, generates, grades, uploads. A
        dead or cut-off worker never gets it (its lease will run out and give it back)."""
        w.job = Job(a, next(self._seq))
        if w.alive and not self.is_cut(w.pool.region, t):
            self._begin(w, t)

    def _begin(self, w: SimWorker, t: float) -> None:
        job, m, region = w.job, self.model, w.pool.region
        a = job.assignment
        ready = max(t, w.ready_at)
        version = w.version
        if self.oc.in_flight_updates or version < a.min_version:  # the worker loads the latest
            seen = bisect.bisect_right(self.notice[region], ready) - 1
            version = max(version, a.min_version, seen)
        start = max(ready, self.arrive[region][version])
        w.wait_weights_s += start - ready
        w.version = held = version
        lens = self.lengths(a.step)[a.group_ids]
        tokens = int(lens.sum())
        gen = tokens / (m.tokens_per_s * w.pool.speed)
        grade = lens.size * m.grade_s
        held_list = [held]
        trajs = [SimTrajectory(g, held_list, n, len(row)) for g, row, n in
                 zip(a.group_ids, lens, lens.sum(axis=1).tolist())]
        job.start, job.busy_end = start, start + gen + grade
        job.result = RolloutResult(a.assignment_id, a.step, w.name, trajs, tokens, gen, grade)
        self.push(job.busy_end + self.upload_s(region, tokens), "finish", (w.name, job.token))

    def _set_capacity(self, pool: PoolConfig, t: float) -> None:
        """Join or let go of workers so ``pool`` has capacity_at(pool, t); the next change is an event."""
        target, live = capacity_at(pool, t), self.wanted[pool.name]
        while len(live) > target:
            self._leave(live.pop(), t)
        while len(live) < target:
            live.append(self._join(pool, t))
        nxt = next_change(pool, t)
        if nxt is not None:
            self.push(nxt, "capacity", pool)
        self.push(t, "driver")

    def _on_capacity(self, t: float, pool: PoolConfig) -> None:
        self._set_capacity(pool, t)

    def _join(self, pool: PoolConfig, t: float) -> SimWorker:
        """A worker registers (a lease), starts, and (after the start) catches up: the full
        weights from its region's relay, or across the links without one."""
        lease = self.table.grant(pool.name, t, secret="sim")
        m = self.model
        catch_up = self.delivery_s(pool.region, m.full_bytes) if t > 0 else 0.0
        w = SimWorker(lease.worker, pool, lease.lease_id, t, t + m.worker_start_s + catch_up, t, member_since=t)
        self.workers[w.name] = w
        self.by_lease[lease.lease_id] = w
        self.sched.add_worker(w.name, t)
        self._schedule_lease_check()
        return w

    def _leave(self, w: SimWorker, t: float) -> None:
        """The pool takes the worker back: it dies; its lease is released or runs out."""
        self._kill(w, t)
        if self.model.leave == "release" and w.lease_id in self.table.live:
            self.table.release(w.lease_id, t)
            self._remove(w, t)
        else:
            self._stop_heartbeats(w, t)

    def _kill(self, w: SimWorker, t: float) -> None:
        job = w.job
        if job is not None and job.start is not None and job.start < t:
            w.busy_s += min(t, job.busy_end) - job.start
        if job is not None:
            w.job = Job(job.assignment, next(self._seq))  # held by a dead worker: never done
        w.alive = False

    def _last_tick(self, w: SimWorker, t: float) -> float:
        hb = self.fleet.heartbeat_s
        return w.hb_origin + math.floor((t - w.hb_origin) / hb) * hb

    def _stop_heartbeats(self, w: SimWorker, t: float) -> None:
        if w.heartbeating and w.lease_id in self.table.live:
            self.table.renew(w.lease_id, self._last_tick(w, t))
        w.heartbeating = False
        self._schedule_lease_check()

    def _schedule_lease_check(self) -> None:
        at = self.table.next_deadline()
        if at is not None and (self._lease_event_at is None or at < self._lease_event_at):
            self._lease_event_at = at
            self.push(at + 1e-9, "lease")

    def _on_lease(self, t: float, _data) -> None:
        """Heartbeats up to now (renewed lazily, at each worker's last tick), then every lease past
        its deadline ends and the scheduler re-queues what its worker held."""
        self._lease_event_at = None
        for lease_id in list(self.table.live):
            w = self.by_lease[lease_id]
            if w.heartbeating:
                self.table.renew(lease_id, self._last_tick(w, t))
        for lease in self.table.expire(t):
            self._remove(self.by_lease[lease.lease_id], t)
        self._schedule_lease_check()

    def _remove(self, w: SimWorker, t: float) -> None:
        if not w.member:
            return
        a = self.sched.remove_worker(w.name, t)
        w.member = False
        w.member_s += t - w.member_since
        if a is not None:
            self.requeued_by_pool[w.pool.name] += 1
        if w.job is not None and w.job.start is None:
            w.job = None
        self.push(t, "driver")

    def _on_cut(self, t: float, region: str) -> None:
        for w in self.workers.values():
            if w.pool.region == region and w.alive:
                self._stop_heartbeats(w, t)

    def _on_heal(self, t: float, region: str) -> None:
        """Back: held results are uploaded; a worker whose lease survived heartbeats again (and
        gets the work dispatched to it meanwhile), one whose lease ran out joins again."""
        for w in list(self.workers.values()):
            if w.pool.region != region or not w.alive:
                continue
            self.pending.extend((w.name, r) for r in w.undelivered)
            w.undelivered = []
            try:
                self.table.renew(w.lease_id, t)
                w.heartbeating, w.hb_origin = True, t
                if w.job is not None and w.job.start is None:
                    self._begin(w, t)
            except LeaseError:
                self._remove(w, t)
                if w.job is not None and w.job.start is not None:
                    w.rejoin = True
                else:
                    self._retire_and_rejoin(w, t)
        self._schedule_lease_check()
        self.push(t, "driver")

    def _retire_and_rejoin(self, w: SimWorker, t: float) -> None:
        w.alive, w.rejoin = False, False
        live = self.wanted[w.pool.name]
        if w in live:
            live[live.index(w)] = self._join(w.pool, t)

    # ------------------------------------------------------------------ the result

    def _result(self, end: float, stalled: bool) -> SimResult:
        for w in self.workers.values():
            if w.member:
                w.member_s += end - w.member_since
                w.member = False
            job = w.job
            if w.alive and job is not None and job.start is not None and job.start < end:
                w.busy_s += min(end, job.busy_end) - job.start
        by_pool: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for w in self.workers.values():
            by_pool[w.pool.name][0] += w.busy_s
            by_pool[w.pool.name][1] += w.member_s
        busy = sum(b for b, _ in by_pool.values())
        member = sum(s for _, s in by_pool.values())
        times = np.diff([0.0] + self.publish_times).tolist()
        wall = end if stalled or self.state.step < self.steps else (self.publish_times or [end])[-1]
        wall = max(wall, 1e-9)
        trained = sum(self.trained_ids.values())
        lost = sum(1 for s in range(self.state.step) for i in self.planned[s] if i not in self.trained_ids)
        return SimResult(
            steps=self.state.step, wall_s=wall,
            step_time_s=float(np.mean(times)) if times else 0.0,
            step_time_median_s=float(statistics.median(times)) if times else 0.0,
            steps_per_hour=self.state.step / wall * 3600,
            trajectories_per_s=self.state.trajectories / wall,
            tokens_per_s=self.gen_tokens / wall,
            worker_utilisation=busy / member if member else 0.0,
            utilisation_by_pool={p: (b / s if s else 0.0) for p, (b, s) in sorted(by_pool.items())},
            staleness_hist=dict(self.hist), dropped_stale=self.gate_state.dropped_stale * self.oc.group_size,
            sync_latency_s={r: float(statistics.median(v)) for r, v in sorted(self.latency.items())},
            sync_latency_model_s={r: self.delivery_s(r) for r in sorted(self.regions)},
            wait_weights_s=sum(w.wait_weights_s for w in self.workers.values()),
            requeued=self.sched.requeued, requeued_by_pool=dict(self.requeued_by_pool),
            duplicates=self.sched.duplicates, lost=lost,
            trained_twice=trained - len(self.trained_ids), planned_assignments=self.sched.next_id,
            stalled=stalled, step_times=times)


def next_change(pool: PoolConfig, t: float) -> float | None:
    """When capacity_at(pool, .) may next change after ``t`` (None: never)."""
    if not pool.schedule:
        return None
    if not pool.period_s:
        return next((p.at_s for p in pool.schedule if p.at_s > t), None)
    base = math.floor(t / pool.period_s) * pool.period_s
    return min(b + p.at_s for b in (base, base + pool.period_s) for p in pool.schedule if b + p.at_s > t)


# ---------------------------------------------------------------------------- entry points


def simulate_config(cfg: TidalConfig, model: SimModel, steps: int, seed: int) -> SimResult:
    """Simulate ``steps`` trainer steps of ``cfg``'s run (its [orchestrator] and [fleet]) under
    ``model``; deterministic given the arguments."""
    return Simulation(cfg, model, steps, seed).run()


def example_path(name: str) -> Path:
    """A shipped example recipe by name ("local", "global"), or ``name`` as a path."""
    if name in EXAMPLES:
        return Path(str(resources.files("tidal.fleet") / "examples" / f"{name}.toml"))
    return Path(name)


def load_simulate_recipe(path: str | Path, overrides: list[str] | None = None) -> tuple[TidalConfig, SimModel]:
    """A simulate recipe: a tidal recipe plus a ``[simulate]`` table (the SimModel), split off
    before tidal's own config (which forbids unknown sections) is validated. Dotted overrides
    apply to either (``--orchestrator.max_staleness 0``, ``--simulate.tokens_per_s 900``)."""
    from tidal.config.loader import config_from_tree, parse_overrides

    p = example_path(str(path))
    if not p.is_file():
        raise SimulateError(f"simulate recipe not found: {p} (or name one of the examples: {', '.join(EXAMPLES)})")
    try:
        tree = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SimulateError(f"simulate recipe {p} is not valid TOML: {e}") from None
    sim = tree.pop("simulate", None)
    if not isinstance(sim, dict):
        raise SimulateError(f"simulate recipe {p} has no [simulate] table: add the model's constants "
                            f"(`tidal simulate calibrate RUN_DIR` writes them)")
    rest = parse_overrides(overrides or [])
    for key in [k for k in rest if k.startswith("simulate.")]:
        sim[key.removeprefix("simulate.")] = rest.pop(key)
    return config_from_tree(tree, rest), sim_model_from(sim)


def sim_model_from(table: dict[str, Any]) -> SimModel:
    """A SimModel from a [simulate] table; one SimulateError naming each bad field."""
    try:
        return SimModel.model_validate(table)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = "simulate." + ".".join(str(x) for x in err["loc"])
            what = ("unknown key: remove it or check its spelling" if err["type"] == "extra_forbidden"
                    else err["msg"].removeprefix("Value error, "))
            lines.append(f"{where}: {what}")
        raise SimulateError("invalid [simulate] table:\n  " + "\n  ".join(lines)) from None
