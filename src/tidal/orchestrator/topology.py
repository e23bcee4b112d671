"""The fleet's topology (``[fleet]``): regions, the pools of rollout workers in them, the links
between regions, where the trainer lives, and the lease rules every worker joins under.

The default is what `tidal train` always ran: one region ("local") holding the trainer and one
pool ("local") of ``orchestrator.num_workers`` workers placed by ``orchestrator.backend``
(``FleetConfig.pools_or_default``). A recipe that names pools replaces that pool.

A pool's capacity can follow a schedule (borrowed production capacity that grows and shrinks
over the day): piecewise-constant ``(at_s, workers)`` points, repeating every ``period_s`` when
that is set. ``capacity_at`` is the one function that reads a schedule, for the orchestrator and
the simulator alike.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tidal.config_section import Section


class CapacityPoint(Section):
    at_s: float = Field(ge=0)
    """From this many seconds after the run starts (modulo the pool's period_s, if set)."""
    workers: int = Field(ge=0)
    """The pool has this many workers (until the next point)."""


class PoolConfig(Section):
    name: str = Field(min_length=1)
    """The pool's name (unique in the fleet); its workers are named "<pool>/<i>"."""
    region: str = "local"
    """The region the pool is in (one of fleet.regions' names)."""
    workers: int = Field(2, ge=0)
    """Workers the pool has when it has no schedule (for a remote pool: how many one
    `tidal worker --join` starts by default)."""
    device: str = "cpu"
    """Device kind of the pool's workers; with Ray placement each worker actor asks for one unit
    of the custom resource "device:<kind>" (a mixed fleet: "h100", "a10g", "cpu")."""
    gpus_per_worker: float = Field(1.0, ge=0)
    """With Ray placement and a device other than "cpu": GPUs each worker actor asks Ray for
    (``num_gpus``, so Ray sets the actor's CUDA_VISIBLE_DEVICES); 0 = a device kind that is not
    a GPU. A node declaring the device but no GPUs then hosts no worker (one clear error)."""
    placement: Literal["backend", "local", "ray", "remote"] = "backend"
    """Who starts the workers: "backend" = as orchestrator.backend says; "local" = threads in the
    trainer's process; "ray" = Ray actors (local Ray or RAY_ADDRESS); "remote" = nobody here:
    they join over HTTP with `tidal worker --join URL`."""
    schedule: list[CapacityPoint] = Field(default_factory=list)
    """Capacity over time, points sorted by at_s; empty = always ``workers``."""
    period_s: float = Field(0.0, ge=0)
    """The schedule repeats with this period (86400 = daily); 0 = the last point holds forever."""
    speed: float = Field(1.0, gt=0)
    """Relative generation speed of this pool's devices (the simulator's model; 1 = the
    calibrated speed)."""

    @model_validator(mode="after")
    def _sorted_schedule(self) -> PoolConfig:
        times = [p.at_s for p in self.schedule]
        if times != sorted(times):
            raise ValueError(f"fleet pool {self.name!r}: schedule points must be sorted by at_s, got {times}")
        if self.period_s and self.schedule and self.schedule[-1].at_s >= self.period_s:
            raise ValueError(f"fleet pool {self.name!r}: schedule point at_s={self.schedule[-1].at_s} "
                             f"is not inside period_s={self.period_s}")
        return self


class RegionConfig(Section):
    name: str = Field(min_length=1)
    """The region's name (unique)."""
    relay: bool = True
    """A weight relay (tidal.sync) serves this region's pools, so each update crosses the
    region's link once; the trainer's region is served by the origin itself."""


class LinkConfig(Section):
    a: str
    """One end: a region name."""
    b: str
    """The other end: a region name."""
    bandwidth_mbps: float = Field(gt=0)
    """Usable bandwidth of the link, megabits per second."""
    latency_ms: float = Field(ge=0)
    """One-way latency, milliseconds."""


class FleetConfig(Section):
    regions: list[RegionConfig] = Field(default_factory=lambda: [RegionConfig(name="local")])
    """The regions; the default is one, "local"."""
    pools: list[PoolConfig] = Field(default_factory=list)
    """The pools of rollout workers; empty = one pool "local" of orchestrator.num_workers
    workers placed by orchestrator.backend (the default recipe)."""
    links: list[LinkConfig] = Field(default_factory=list)
    """Links between regions (weights go down and trajectories up over HTTP on them)."""
    trainer_region: str = "local"
    """The region the trainer (and the weight origin) is in."""
    start_wait_s: float = Field(120.0, ge=0)
    """Before planning the first step, wait up to this long (seconds) for every pool tidal starts
    itself (placement local or ray) to have a started worker, so the first steps are split over
    all of them instead of over whichever pool started first; remote pools are not waited for
    (their workers join when someone starts them). 0 = start with whoever is there."""
    lease_s: float = Field(20.0, gt=0)
    """A worker's lease lasts this long after each heartbeat; one that lets it lapse has left, and
    the assignment it held is queued again."""
    heartbeat_s: float = Field(2.0, gt=0)
    """How often a remote worker renews its lease (must be well under lease_s)."""
    listen: str = "127.0.0.1:0"
    """host:port the coordinator listens on for remote pools (port 0: any free port; its URL is
    written to the run dir as fleet_url). The weight origin listens on the same host (another
    free port), so a pool that reaches the coordinator reaches the weights; 0.0.0.0 = every
    interface."""
    verify_fraction: float = Field(0.05, ge=0, le=1)
    """Fraction of remote workers' trajectories whose logprobs the trainer recomputes to catch
    fabricated or corrupted rollouts (0 = never)."""
    verify_atol: float = Field(1e-3, ge=0)
    """Largest |recorded - recomputed| logprob of a trajectory that passes the recompute check."""

    @model_validator(mode="after")
    def _consistent(self) -> FleetConfig:
        names = [r.name for r in self.regions]
        if not names:
            raise ValueError("fleet.regions is empty: name at least the trainer's region")
        if len(set(names)) != len(names):
            raise ValueError(f"fleet.regions: region names must be unique, got {names}")
        known = set(names)
        if self.trainer_region not in known:
            raise ValueError(f"fleet.trainer_region {self.trainer_region!r} is not one of "
                             f"fleet.regions ({sorted(known)})")
        pools = [p.name for p in self.pools]
        if len(set(pools)) != len(pools):
            raise ValueError(f"fleet.pools: pool names must be unique, got {pools}")
        for i, p in enumerate(self.pools):
            if p.region not in known:
                raise ValueError(f"fleet.pools.{i}.region: pool {p.name!r} is in region {p.region!r}, "
                                 f"which is not one of fleet.regions ({sorted(known)})")
        for i, link in enumerate(self.links):
            for end in ("a", "b"):
                if getattr(link, end) not in known:
                    raise ValueError(f"fleet.links.{i}.{end}: link to {getattr(link, end)!r}, which is "
                                     f"not one of fleet.regions ({sorted(known)})")
            if link.a == link.b:
                raise ValueError(f"fleet.links.{i}: a link joins two different regions, not "
                                 f"{link.a!r} to itself")
        if self.heartbeat_s * 2 > self.lease_s:
            raise ValueError(f"fleet.heartbeat_s ({self.heartbeat_s}) must be at most half of "
                             f"fleet.lease_s ({self.lease_s}), so one lost heartbeat does not end a lease")
        return self

    def pools_or_default(self, num_workers: int) -> list[PoolConfig]:
        """The configured pools, or the default recipe's one local pool."""
        return list(self.pools) or [PoolConfig(name="local", region=self.trainer_region, workers=num_workers)]

    def link(self, a: str, b: str) -> LinkConfig | None:
        """The link between regions a and b (either direction), None if none is configured."""
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        return None


def capacity_at(pool: PoolConfig, t: float) -> int:
    """How many workers ``pool`` has ``t`` seconds after the run started."""
    if not pool.schedule:
        return pool.workers
    if pool.period_s:
        t = t % pool.period_s
    workers = pool.schedule[-1].workers if pool.period_s else pool.workers
    for point in pool.schedule:
        if point.at_s <= t:
            workers = point.workers
        else:
            break
    return workers


def placement_of(pool: PoolConfig, backend: str) -> str:
    """Where ``pool``'s workers run: "local", "ray" or "remote"."""
    return backend if pool.placement == "backend" else pool.placement
