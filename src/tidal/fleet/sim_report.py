"""What a simulated run predicts (SimResult, what ``tidal simulate --json`` writes) and how it is
read off a finished Simulation (sim_result): utilisation per pool, step times, staleness, sync
latency, and the work re-queued, duplicated or lost."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tidal.fleet.sim_events import Simulation


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


def sim_result(sim: Simulation, end: float, stalled: bool) -> SimResult:
    """The prediction of ``sim`` stopped at ``end`` (``stalled``: it ran out of events before its
    steps were trained); workers still members or busy are counted up to ``end``."""
    for w in sim.workers.values():
        if w.member:
            w.member_s += end - w.member_since
            w.member = False
        job = w.job
        if w.alive and job is not None and job.start is not None and job.start < end:
            w.busy_s += min(end, job.busy_end) - job.start
    by_pool: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for w in sim.workers.values():
        by_pool[w.pool.name][0] += w.busy_s
        by_pool[w.pool.name][1] += w.member_s
    busy = sum(b for b, _ in by_pool.values())
    member = sum(s for _, s in by_pool.values())
    times = np.diff([0.0] + sim.publish_times).tolist()
    wall = end if stalled or sim.state.step < sim.steps else (sim.publish_times or [end])[-1]
    wall = max(wall, 1e-9)
    trained = sum(sim.trained_ids.values())
    lost = sum(1 for s in range(sim.state.step) for i in sim.planned[s] if i not in sim.trained_ids)
    return SimResult(
        steps=sim.state.step, wall_s=wall,
        step_time_s=float(np.mean(times)) if times else 0.0,
        step_time_median_s=float(statistics.median(times)) if times else 0.0,
        steps_per_hour=sim.state.step / wall * 3600,
        trajectories_per_s=sim.state.trajectories / wall,
        tokens_per_s=sim.gen_tokens / wall,
        worker_utilisation=busy / member if member else 0.0,
        utilisation_by_pool={p: (b / s if s else 0.0) for p, (b, s) in sorted(by_pool.items())},
        staleness_hist=dict(sim.hist), dropped_stale=sim.gate_state.dropped_stale * sim.oc.group_size,
        sync_latency_s={r: float(statistics.median(v)) for r, v in sorted(sim.latency.items())},
        sync_latency_model_s={r: sim.delivery_s(r) for r in sorted(sim.regions)},
        wait_weights_s=sum(w.wait_weights_s for w in sim.workers.values()),
        requeued=sim.sched.requeued, requeued_by_pool=dict(sim.requeued_by_pool),
        duplicates=sim.sched.duplicates, lost=lost,
        trained_twice=trained - len(sim.trained_ids), planned_assignments=sim.sched.next_id,
        stalled=stalled, step_times=times)
