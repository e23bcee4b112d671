"""The end-of-run summary table printed by `tidal train`."""

from __future__ import annotations

from pathlib import Path


def print_summary(summary: dict, path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tidal train: summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("held-out pass@1 before RL", f"{summary['heldout_pass1_before']:.3f}"),
        ("held-out pass@1 after RL", f"{summary['heldout_pass1_after']:.3f}"),
        ("gain (points)", f"{100 * summary['heldout_gain']:+.1f}"),
        ("held-out tasks", str(summary["heldout_tasks"])),
        ("RL steps", str(summary["steps"])),
        ("trajectories", str(summary["trajectories"])),
        ("max staleness seen / allowed", f"{summary['max_staleness_seen']} / {summary['max_staleness']}"),
        ("worker busy fraction", f"{summary.get('worker_busy_fraction', 0):.2f}"),
        ("dropped stale trajectories", str(summary.get("dropped_stale", 0))),
        ("pretrain wall (s)", f"{summary.get('pretrain_s') or 0:.0f}"),
        ("RL wall (s)", f"{summary['rl_wall_s']:.0f}"),
        ("total wall (s)", "n/a (resumed)" if summary.get("wall_s") is None else f"{summary['wall_s']:.0f}"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    Console().print(table)
    print(f"summary: {path}")
    if summary.get("plot"):
        print(f"plot: {summary['plot']}")
    if summary.get("report"):
        print(f"report: {summary['report']}")
