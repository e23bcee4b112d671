"""The end-of-run summary table printed by `tidal train`."""

from __future__ import annotations

from pathlib import Path

from tidal.orchestrator.records import RunSummary


def print_summary(summary: RunSummary, path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tidal train: summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    s = summary
    rows = headline_rows(s) + [
        ("held-out tasks", str(s.heldout_tasks)),
        ("RL steps", str(s.steps)),
        ("trajectories", str(s.trajectories)),
        ("max staleness seen / allowed", f"{s.max_staleness_seen} / {s.max_staleness}"),
        ("worker busy fraction", f"{s.worker_busy_fraction:.2f}"),
        ("dropped stale trajectories", str(s.dropped_stale)),
        ("pretrain wall (s)", f"{s.pretrain_s or 0:.0f}"),
        ("RL wall (s)", f"{s.rl_wall_s:.0f}"),
        ("total wall (s)", "n/a (resumed)" if s.wall_s is None else f"{s.wall_s:.0f}"),
    ]
    if s.pretrain_budget_bound:
        rows.append(("mid-training", "cut by its time budget: not reproducible"))
    rows += guard_rows(s)
    for k, v in rows:
        table.add_row(k, v)
    Console().print(table)
    if s.best_step is not None:
        print("best checkpoint: the highest of the run's held-out evaluations, so biased upward "
              f"(a maximum over noisy measurements): {s.best_checkpoint}")
    print(f"final checkpoint: {s.final_checkpoint}")
    for event in (s.guard or {}).get("events", []):
        print(event["message"])
    if s.guard and s.guard.get("stopped"):
        print(f"stopped by the guard: {s.guard['stopped']}")
    print(f"summary: {path}")
    if s.plot:
        print(f"plot: {s.plot}")
    if s.report:
        print(f"report: {s.report}")


def headline_rows(s: RunSummary) -> list[tuple[str, str]]:
    """The best checkpoint's held-out pass@1 first (the run's result, stated as such), then
    the final checkpoint's beside it, then before RL and the gains."""
    final = [(f"held-out pass@1, final checkpoint (step {s.steps})", f"{s.heldout_pass1_after:.3f}")]
    before = [("held-out pass@1 before RL", f"{s.heldout_pass1_before:.3f}")]
    gain = [("gain, final (points)", f"{100 * s.heldout_gain:+.1f}")]
    if s.best_step is None:  # a summary from before the guard
        return final + before + gain
    best = [(f"held-out pass@1, best checkpoint (step {s.best_step})", f"{s.heldout_pass1_best:.3f}")]
    best_gain = [("gain, best (points)", f"{100 * (s.heldout_pass1_best - s.heldout_pass1_before):+.1f}")]
    return best + final + before + best_gain + gain


def guard_rows(s: RunSummary) -> list[tuple[str, str]]:
    """The guard's policy and how often it acted ("off": no row); the events are printed below."""
    if not s.guard:
        return []
    events = s.guard.get("events", [])
    return [(f"guard ({s.guard['policy']})", f"{len(events)} events, {s.guard.get('restores', 0)} restores")]
