"""A PNG of training reward and held-out pass@1 over wall time."""

from __future__ import annotations

from pathlib import Path

from tidal.telemetry.metrics import read_metrics


def plot_run(run_dir: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    if steps:
        ax.plot([r["wall_s"] for r in steps], [r["reward_mean"] for r in steps],
                color="tab:blue", alpha=0.35, label="train reward (per step)")
        k = max(1, len(steps) // 15)
        smooth = [sum(r["reward_mean"] for r in steps[max(0, i - k):i + 1]) / len(steps[max(0, i - k):i + 1])
                  for i in range(len(steps))]
        ax.plot([r["wall_s"] for r in steps], smooth, color="tab:blue", label=f"train reward ({k + 1}-step mean)")
    if evals:
        ax.plot([r["wall_s"] for r in evals], [r["heldout_pass1"] for r in evals], "o-",
                color="tab:red", label="held-out pass@1")
    ax.set_xlabel("wall time of the RL phase (s)")
    ax.set_ylabel("reward / pass@1")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"tidal run: {run_dir.name}")
    out = run_dir / "reward.png"
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
