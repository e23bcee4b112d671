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
    rows = [
        ("held-out pass@1 before RL", f"{s.heldout_pass1_before:.3f}"),
        ("held-out pass@1 after RL", f"{s.heldout_pass1_after:.3f}"),
        ("gain (points)", f"{100 * s.heldout_gain:+.1f}"),
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
    for k, v in rows:
        table.add_row(k, v)
    Console().print(table)
    print(f"summary: {path}")
    if s.plot:
        print(f"plot: {s.plot}")
    if s.report:
        print(f"report: {s.report}")
