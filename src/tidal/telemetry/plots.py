"""Figures of a run drawn from its metrics.jsonl records: reward, staleness, worker timeline, throughput.

Each ``*_figure`` builder takes parsed records and returns a matplotlib ``Figure``, or ``None`` when
the run has no data for it (an older run, or one killed early), so the caller decides how to say
"no data" (the HTML report prints a note; ``plot_run`` draws an empty frame). Figures are built with
``matplotlib.figure.Figure`` rather than pyplot: no global backend or figure registry, so drawing
works headless and needs no ``close()``.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from tidal.telemetry.metrics import read_metrics

WALL_LABEL = "wall time of the RL phase (s)"
# The states a rollout worker reports in `kind: "worker"` spans, in legend order.
WORKER_STATE_COLORS = {
    "busy": "tab:green",
    "wait_weights": "tab:orange",
    "wait_backpressure": "tab:red",
    "idle": "lightgrey",
}
FIGSIZE = (8, 4)
DPI = 100


def records_of(records: list[dict], kind: str) -> list[dict]:
    return [r for r in records if r.get("kind") == kind]


def _values(records: list[dict], key: str) -> list[float]:
    """``key`` of each record as a float; NaN where missing or null (metrics.jsonl writes NaN as null)."""
    return [float(r[key]) if r.get(key) is not None else math.nan for r in records]


def trailing_mean(values: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` finite values up to each point (NaN where there are none)."""
    out = []
    for i in range(len(values)):
        finite = [v for v in values[max(0, i - window + 1):i + 1] if math.isfinite(v)]
        out.append(sum(finite) / len(finite) if finite else math.nan)
    return out


def staleness_counts(steps: list[dict]) -> dict[int, int]:
    """Trained trajectories by staleness, summed over the per-step ``staleness_hist`` dicts."""
    total: dict[int, int] = {}
    for r in steps:
        for staleness, n in (r.get("staleness_hist") or {}).items():
            total[int(staleness)] = total.get(int(staleness), 0) + int(n)
    return dict(sorted(total.items()))


def worker_state_seconds(spans: list[dict]) -> dict[int, dict[str, float]]:
    """Seconds each worker spent in each state; raises on a state the timeline does not know."""
    out: dict[int, dict[str, float]] = {}
    for s in spans:
        if s["state"] not in WORKER_STATE_COLORS:
            raise ValueError(f"worker span has unknown state {s['state']!r}; "
                             f"expected one of {list(WORKER_STATE_COLORS)}")
        per = out.setdefault(int(s["worker"]), dict.fromkeys(WORKER_STATE_COLORS, 0.0))
        per[s["state"]] += s["end_s"] - s["start_s"]
    return dict(sorted(out.items()))


def best_eval(evals: list[dict]) -> dict | None:
    """The evaluation with the highest held-out pass@1, the first of equals (the run's best
    checkpoint: a later evaluation replaces it only by scoring higher)."""
    scored = [e for e in evals if e.get("heldout_pass1") is not None]
    return max(scored, key=lambda e: e["heldout_pass1"]) if scored else None


def reward_figure(steps: list[dict], evals: list[dict], title: str = "",
                  guards: list[dict] = ()) -> Figure | None:
    """Training reward per step and smoothed, with held-out pass@1 (the best checkpoint's
    evaluation starred), over wall time; each guard event a dashed line with its detector."""
    if not steps and not evals:
        return None
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_subplot()
    values = _values(evals, "heldout_pass1")
    if steps:
        wall, reward = _values(steps, "wall_s"), _values(steps, "reward_mean")
        window = max(1, len(steps) // 15) + 1
        ax.plot(wall, reward, color="tab:blue", alpha=0.35, label="train reward (per step)")
        ax.plot(wall, trailing_mean(reward, window), color="tab:blue",
                label=f"train reward ({window}-step mean)")
        values += reward
    if evals:
        ax.plot(_values(evals, "wall_s"), _values(evals, "heldout_pass1"), "o-", color="tab:red",
                label="held-out pass@1")
        best = best_eval(evals)
        if best is not None:
            ax.plot([best["wall_s"]], [best["heldout_pass1"]], "*", color="gold", markersize=16,
                    markeredgecolor="black", label=f"best checkpoint (step {best['step']})", zorder=5)
    for i, g in enumerate(guards):
        ax.axvline(g.get("wall_s", math.nan), color="black", linestyle="--", alpha=0.6,
                   label="guard event" if i == 0 else None)
        ax.annotate(f"{g['detector']}: {g['action']}", (g.get("wall_s", math.nan), 0.98),
                    xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right", fontsize=7)
    finite = [v for v in values if math.isfinite(v)]
    ax.set_ylim(min([0.0, *finite]), max([1.0, *finite]))
    ax.set_xlabel(WALL_LABEL)
    ax.set_ylabel("reward / pass@1")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title or "reward and held-out pass@1")
    fig.tight_layout()
    return fig


def staleness_figure(steps: list[dict], max_staleness: int | None = None) -> Figure | None:
    """Bar chart of trained trajectories by staleness, with the allowed maximum as a dashed line."""
    counts = staleness_counts(steps)
    if not counts:
        return None
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_subplot()
    bars = ax.bar(list(counts), list(counts.values()), color="tab:purple", width=0.8)
    ax.bar_label(bars)
    ax.margins(y=0.12)
    ax.set_xlim(-0.6, max(*counts, max_staleness if max_staleness is not None else 0) + 1)
    if max_staleness is not None:
        ax.axvline(max_staleness + 0.5, color="black", linestyle="--", label=f"max_staleness = {max_staleness}")
        ax.legend(loc="upper right")
    dropped = steps[-1].get("dropped_stale")
    suffix = f"; {dropped} dropped as too stale" if dropped is not None else ""
    ax.set_title(f"trained trajectories by staleness{suffix}")
    ax.set_xlabel("staleness (trainer version − oldest policy version in the trajectory)")
    ax.set_ylabel("trajectories")
    ax.set_xticks(list(counts))
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def worker_timeline_figure(spans: list[dict]) -> Figure | None:
    """Gantt chart: one row per worker, a coloured span per state (busy, waiting, idle)."""
    if not spans:
        return None
    seconds = worker_state_seconds(spans)
    workers = list(seconds)
    fig = Figure(figsize=(FIGSIZE[0], 1.6 + 0.5 * len(workers)), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    for row, worker in enumerate(workers):
        mine = [s for s in spans if int(s["worker"]) == worker]
        for state, color in WORKER_STATE_COLORS.items():
            bars = [(s["start_s"], s["end_s"] - s["start_s"]) for s in mine if s["state"] == state]
            if bars:
                ax.broken_barh(bars, (row - 0.4, 0.8), color=color)
    labels = []
    for worker in workers:
        total = sum(seconds[worker].values())
        busy = seconds[worker]["busy"] / total if total > 0 else 0.0
        labels.append(f"worker {worker} ({busy:.0%} busy)")
    ax.set_yticks(range(len(workers)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(WALL_LABEL)
    ax.set_title("rollout workers over time")
    fig.legend(handles=[Patch(color=c, label=s) for s, c in WORKER_STATE_COLORS.items()],
               loc="outside lower center", ncol=len(WORKER_STATE_COLORS), frameon=False)
    return fig


def throughput_figure(steps: list[dict]) -> Figure | None:
    """Generation and training tokens/s per step over wall time (series absent from the log are left out)."""
    series = {"generation tokens/s": ("gen_tokens_per_s", "tab:green"),
              "training tokens/s": ("train_tokens_per_s", "tab:blue")}
    present = {label: (key, color) for label, (key, color) in series.items()
               if any(math.isfinite(v) for v in _values(steps, key))}
    if not present:
        return None
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_subplot()
    wall = _values(steps, "wall_s")
    for label, (key, color) in present.items():
        ax.plot(wall, _values(steps, key), ".-", color=color, label=label)
    ax.set_xlabel(WALL_LABEL)
    ax.set_ylabel("tokens / s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("throughput")
    fig.tight_layout()
    return fig


def integrity_figure(steps: list[dict], evals: list[dict]) -> Figure | None:
    """Cheating over wall time: the grader's cheat rate (visible tests passed, hidden failed)
    and the detectors' flag rate per step (running means), with each evaluation's canary cheat
    rate; None when no record has integrity keys (the environment keeps no evidence)."""
    steps = [r for r in steps if "integrity/episodes" in r]
    evals = [r for r in evals if "integrity/episodes" in r]
    if not steps and not evals:
        return None
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_subplot()
    window = max(1, len(steps) // 15) + 1
    wall = _values(steps, "wall_s")
    for key, label, color in (("integrity/cheat_rate", "cheat rate (grader)", "tab:red"),
                              ("integrity/flag_rate", "flag rate (detectors)", "tab:orange")):
        values = _values(steps, key)
        if any(math.isfinite(v) for v in values):
            ax.plot(wall, values, color=color, alpha=0.3)
            ax.plot(wall, trailing_mean(values, window), color=color,
                    label=f"{label}, {window}-step mean")
    canary = _values(evals, "integrity/canary_cheat_rate")
    if any(math.isfinite(v) for v in canary):
        ax.plot(_values(evals, "wall_s"), canary, "s-", color="tab:purple",
                label="canary cheat rate (evaluations)")
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel(WALL_LABEL)
    ax.set_ylabel("fraction of episodes")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_title("integrity")
    fig.tight_layout()
    return fig


def figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def plot_run(run_dir: str | Path) -> Path:
    """Write RUN_DIR/reward.png (an empty, titled frame if the run has no steps or evals yet)."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    title = f"tidal run: {run_dir.name}"
    fig = reward_figure(records_of(records, "step"), records_of(records, "eval"), title,
                        records_of(records, "guard"))
    if fig is None:
        fig = Figure(figsize=FIGSIZE, dpi=DPI)
        fig.add_subplot().set_title(f"{title} (no steps or evals yet)")
    out = run_dir / "reward.png"
    out.write_bytes(figure_png(fig))
    return out
