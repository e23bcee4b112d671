"""The simulation's event loop (Simulation, on SimWorld): a heap of events on a simulated clock that
drives the orchestrator's own Scheduler, LeaseTable and staleness_gate as Run._drive does: plan,
dispatch, collect, train and publish; workers join, leave, lose their lease and come back after
a partition."""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np

from tidal.fleet.lease import LeaseError, LeaseTable
from tidal.fleet.sim_model import SimModel
from tidal.fleet.sim_report import SimResult, sim_result
from tidal.fleet.sim_world import Job, SimTask, SimTrajectory, SimWorker, SimWorld, next_change
from tidal.orchestrator.planning import staleness_gate
from tidal.orchestrator.records import RunState
from tidal.orchestrator.scheduler import Scheduler, split_step
from tidal.orchestrator.topology import PoolConfig, capacity_at
from tidal.orchestrator.worker import Assignment, RolloutResult

if TYPE_CHECKING:
    from tidal.orchestrator.config import OrchestratorConfig
    from tidal.orchestrator.topology import FleetConfig


class Simulation(SimWorld):
    """One simulated run under ``model`` (``run()`` once)."""

    def __init__(self, oc: OrchestratorConfig, fleet: FleetConfig, model: SimModel, steps: int, seed: int):
        super().__init__(oc, fleet, model)
        self.seed = seed
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
        return sim_result(self, self.now, stalled)

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
