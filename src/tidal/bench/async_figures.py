"""The async benchmark's figures, computed from what runs recorded (pure functions, no runs).

    curve           held-out pass@1 over RL time: (rl_s, step, pass@1) points, "before" at 0
    rl_time         a wall time minus the held-out evaluations that happened before it
    time_to_target  the RL time at which a curve first reaches a pass@1 target (interpolated)
    default_target  before + fraction x the smaller of the two modes' best gains
    lost / duplicated trajectories of the trained steps (from step records)
    relative_error  |predicted - measured| / measured
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any


def rl_time(wall_s: float, eval_spans: Iterable[tuple[float, float]]) -> float:
    """``wall_s`` (RL wall time) minus the seconds of every held-out evaluation that started
    before it (``eval_spans``: (start_s, duration_s) in RL wall time); an evaluation still
    running at ``wall_s`` counts up to ``wall_s``."""
    spent = sum(min(dur, max(0.0, wall_s - start)) for start, dur in eval_spans if start < wall_s)
    return wall_s - spent


def curve(points: Iterable[tuple[float, int, float]],
          eval_spans: Iterable[tuple[float, float]] = ()) -> list[dict[str, float]]:
    """(wall_s, step, pass@1) measurements -> [{rl_s, step, pass1}] sorted by step, rl_s with
    the in-loop evaluations' time taken out (rl_time)."""
    spans = list(eval_spans)
    return [{"rl_s": rl_time(w, spans), "step": s, "pass1": p}
            for w, s, p in sorted(points, key=lambda x: (x[1], x[0]))]


def time_to_target(points: list[dict[str, float]], target: float) -> float | None:
    """The RL time at which pass@1 first reaches ``target``, linearly interpolated between the
    last point below and the first at or above it (a point of the curve at or above it at rl_s
    0 gives 0); None if the curve never reaches it."""
    prev = None
    for p in points:
        if p["pass1"] >= target:
            if prev is None or p["pass1"] == prev["pass1"]:
                return p["rl_s"]
            frac = (target - prev["pass1"]) / (p["pass1"] - prev["pass1"])
            return prev["rl_s"] + frac * (p["rl_s"] - prev["rl_s"])
        prev = p
    return None


def default_target(before: float, sync_best: float, async_best: float, fraction: float) -> float:
    """before + ``fraction`` x the smaller of the two modes' best gains over ``before`` (so both
    reach it; with no gain on one side it is above ``before`` by nothing and ``before`` counts
    as reached at 0 by both)."""
    gain = max(0.0, min(sync_best, async_best) - before)
    return before + fraction * gain


def trajectory_accounting(steps: list[dict[str, Any]], planned_per_step: int) -> dict[str, int]:
    """Of the trained steps (their StepRecords, in order): ``lost`` = planned trajectories that
    were neither trained nor counted as dropped as stale (dropped_stale is the run's running
    total, so each step's share is its increase); ``duplicated`` = trajectories trained beyond
    the plan (a result that reached training twice)."""
    lost = dup = 0
    dropped_before = 0
    for r in sorted(steps, key=lambda r: r["step"]):
        dropped = r["dropped_stale"] - dropped_before
        dropped_before = r["dropped_stale"]
        accounted = r["trajectories"] + dropped
        lost += max(0, planned_per_step - accounted)
        dup += max(0, accounted - planned_per_step)
    return {"lost": lost, "duplicated": dup}


def staleness_hist(steps: list[dict[str, Any]]) -> dict[str, int]:
    """Trained trajectories by staleness over the run (the step records' histograms summed)."""
    total: Counter = Counter()
    for r in steps:
        total.update({int(k): n for k, n in r["staleness_hist"].items()})
    return {str(k): n for k, n in sorted(total.items())}


def mean_step_time(steps: list[dict[str, Any]]) -> float:
    """RL wall time of the last trained step over the steps trained (what the simulator's
    step_time_s predicts: the mean interval between publications, from the start)."""
    if not steps:
        return 0.0
    last = max(steps, key=lambda r: r["step"])
    return last["wall_s"] / last["step"]


def relative_error(predicted: float, measured: float) -> float:
    """|predicted - measured| / measured (inf when measured is 0 and predicted is not)."""
    if measured == 0:
        return 0.0 if predicted == 0 else float("inf")
    return abs(predicted - measured) / abs(measured)


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are not None (None if there are none)."""
    have = [v for v in values if v is not None]
    return statistics.median(have) if have else None
