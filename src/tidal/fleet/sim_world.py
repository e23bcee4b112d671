"""The simulated world a Simulation runs in: regions, pools, the links between them and what moving
bytes across them costs (SimWorld: routes, weight delivery, uploads, partitions), the stand-ins
for tasks, trajectories, jobs and workers, and when a pool's capacity next changes. The event loop
(sim_events.Simulation) builds on it."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidal.fleet.sim_model import SimModel, SimulateError
from tidal.orchestrator.topology import LinkConfig, PoolConfig
from tidal.orchestrator.worker import Assignment, RolloutResult
from tidal.sync.pull import predict_delivery_s

if TYPE_CHECKING:
    from tidal.orchestrator.config import OrchestratorConfig
    from tidal.orchestrator.topology import FleetConfig


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


class SimWorld:
    """The fleet of a run (its [orchestrator] and [fleet] sections) under ``model``: its pools,
    regions and the routes between them, the workers it has (filled by the simulation), and the
    seconds a delivery or upload takes."""

    def __init__(self, oc: OrchestratorConfig, fleet: FleetConfig, model: SimModel):
        self.model = model
        self.oc, self.fleet = oc, fleet
        self.pools = self.fleet.pools_or_default(self.oc.num_workers)
        self.regions = {r.name: r for r in self.fleet.regions}
        self.routes = {r: self._route(r) for r in self.regions}
        for i, p in enumerate(model.partitions):
            if p.region not in self.regions:
                raise SimulateError(f"simulate.partitions.{i}.region: {p.region!r} is not one of "
                                    f"fleet.regions ({sorted(self.regions)})")
        self.workers: dict[str, SimWorker] = {}

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


def next_change(pool: PoolConfig, t: float) -> float | None:
    """When capacity_at(pool, .) may next change after ``t`` (None: never)."""
    if not pool.schedule:
        return None
    if not pool.period_s:
        return next((p.at_s for p in pool.schedule if p.at_s > t), None)
    base = math.floor(t / pool.period_s) * pool.period_s
    return min(b + p.at_s for b in (base, base + pool.period_s) for p in pool.schedule if b + p.at_s > t)
