"""RUN_DIR/report.html: one self-contained page that tells how a run went.

The page opens from disk with no server and no network: plots are PNGs embedded as base64 data
URIs, styles are inline, there is no JavaScript, and a Content-Security-Policy forbids every
other source, so a report copied off a cluster looks the same anywhere. Sections: a header with
summary.json's figures (if the run finished: the best checkpoint's held-out pass@1 first, with
its step), the guard's events (``<table id="guard">``, where the run has any), then four plots, each in a ``<figure>`` with a fixed
id: reward and held-out pass@1, staleness histogram, worker timeline, throughput. A plot without
data becomes a short "no data" note in its figure rather than an empty or broken image.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from tidal.fsutil import write_text_atomic
from tidal.telemetry import plots
from tidal.telemetry.metrics import read_metrics

# summary.json key, label, format. Keys missing from the summary are left out of the header.
SUMMARY_FIELDS = (
    ("heldout_pass1_before", "held-out pass@1 before RL", "{:.3f}"),
    ("heldout_pass1_after", "held-out pass@1, final checkpoint", "{:.3f}"),
    ("steps", "RL steps", "{}"),
    ("trajectories", "trajectories trained", "{}"),
    ("max_staleness", "max staleness allowed", "{}"),
    ("max_staleness_seen", "max staleness seen", "{}"),
    ("dropped_stale", "dropped as too stale", "{}"),
    ("worker_busy_fraction", "worker busy fraction", "{:.1%}"),
    ("wall_s", "total wall time (s)", "{:.1f}"),
    ("best_checkpoint", "best checkpoint", "{}"),
    ("final_checkpoint", "final checkpoint", "{}"),
)

INTEGRITY_FIELDS = (
    ("cheat_rate", "cheat rate in training (visible pass, hidden fail)", "{:.1%}"),
    ("flag_rate", "flagged by the detectors in training", "{:.1%}"),
    ("canary_cheat_rate", "canary cheat rate in training", "{:.1%}"),
    ("screened", "trajectories screened out", "{}"),
    ("penalised", "trajectories penalised", "{}"),
)
"""summary.json's integrity.train keys shown in the header, where the run has them."""

GUARD_COLUMNS = (("step", "step"), ("detector", "detector"), ("action", "action"),
                 ("lr_scale", "lr scale after"), ("message", "what it saw and did"))
"""The guard events table: metrics.jsonl ``kind = "guard"`` keys and their headings."""

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
table.summary { border-collapse: collapse; }
table.summary th, table.summary td { padding: 0.2em 1em; border-bottom: 1px solid #ddd; text-align: left; }
table.summary td { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 2em 0; }
figure img { max-width: 100%; height: auto; }
p.no-data { color: #777; font-style: italic; border: 1px dashed #bbb; padding: 1em; }
"""


@dataclass
class Plot:
    """One figure of the report: ``fig`` is None when the run has no data for it."""

    id: str
    caption: str
    fig: Figure | None
    alt: str
    no_data: str


def write_report(run_dir: str | Path) -> Path:
    """Write RUN_DIR/report.html (atomically) from metrics.jsonl and summary.json; return its path."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    page = render_page(run_dir.name, summary, build_plots(records, summary or {}),
                       plots.records_of(records, "guard"))
    return write_text_atomic(run_dir / "report.html", page)


def build_plots(records: list[dict], summary: dict) -> list[Plot]:
    steps = plots.records_of(records, "step")
    evals = plots.records_of(records, "eval")
    spans = plots.records_of(records, "worker")
    guards = plots.records_of(records, "guard")
    counts = plots.staleness_counts(steps)
    seconds = plots.worker_state_seconds(spans)
    return [
        Plot("plot-reward", "Training reward per step (faint), its running mean, and held-out pass@1 "
             "(the best checkpoint's evaluation starred; guard events dashed).",
             plots.reward_figure(steps, evals, guards=guards),
             f"Line chart of training reward over {len(steps)} steps and held-out pass@1 at "
             f"{len(evals)} evaluations, against wall time{marks_alt(evals, guards)}.",
             "No data: metrics.jsonl has no step or eval records yet."),
        Plot("plot-staleness", "How many policy versions behind the trainer each trained trajectory was.",
             plots.staleness_figure(steps, summary.get("max_staleness")),
             f"Bar chart of {sum(counts.values())} trained trajectories by staleness: "
             + ", ".join(f"{n} at staleness {s}" for s, n in counts.items()) + ".",
             "No data: the step records have no staleness_hist (an older or synchronous run)."),
        Plot("plot-workers", "What each rollout worker was doing: generating (busy), waiting for "
             "weights, held back by back-pressure, or idle.",
             plots.worker_timeline_figure(spans),
             f"Timeline of {len(seconds)} rollout workers; "
             + "; ".join(f"worker {w}: " + ", ".join(f"{st} {sec:.1f} s" for st, sec in per.items())
                         for w, per in seconds.items()) + ".",
             "No data: metrics.jsonl has no worker records (an older or synchronous run)."),
        Plot("plot-throughput", "Generation and training throughput per step.",
             plots.throughput_figure(steps),
             f"Line chart of generation and training tokens per second over {len(steps)} steps, "
             "against wall time.",
             "No data: the step records have no gen_tokens_per_s or train_tokens_per_s."),
    ] + integrity_plots(steps, evals)


def marks_alt(evals: list[dict], guards: list[dict]) -> str:
    """What the reward plot marks, for its alt text: the best evaluation, the guard's events."""
    best = plots.best_eval(evals)
    out = f"; the best checkpoint's evaluation (step {best['step']}) starred" if best else ""
    if guards:
        events = ", ".join(f"{g['detector']} at step {g['step']}" for g in guards)
        out += f"; {len(guards)} guard event{'s' if len(guards) > 1 else ''} ({events}) dashed"
    return out


def integrity_plots(steps: list[dict], evals: list[dict]) -> list[Plot]:
    """The integrity figure, only for a run whose environment keeps evidence (tidal.integrity)."""
    fig = plots.integrity_figure(steps, evals)
    if fig is None:
        return []
    return [Plot("plot-integrity", "Cheating: episodes that passed the visible tests but failed "
                 "the hidden ones (the grader's view), episodes the detectors flagged, and each "
                 "evaluation's canary cheat rate (impossible tasks: any pass is cheating).", fig,
                 f"Line chart of the cheat and flag rates over {len(steps)} steps and the canary "
                 f"cheat rate at {len(evals)} evaluations, against wall time.", "")]


def render_page(run_name: str, summary: dict | None, figures: list[Plot], guards: list[dict] = ()) -> str:
    name = html.escape(run_name)
    body = [f"<h1>tidal run: {name}</h1>", render_summary(summary), render_guard(guards)]
    body += [render_plot(p) for p in figures]
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>tidal report: {name}</title>",
        f"<style>{STYLE}</style>",
        "</head><body>", *body, "</body></html>", "",
    ])


def render_summary(summary: dict | None) -> str:
    if summary is None:
        return '<p class="no-data" id="summary">No summary.json: the run has not finished (or was killed).</p>'
    rows = []
    if summary.get("best_step") is not None:  # the headline: the best checkpoint's figure
        label = f"held-out pass@1, best checkpoint (step {summary['best_step']})"
        rows.append(f'<tr><th>{html.escape(label)}</th><td data-key="heldout_pass1_best">'
                    f'{summary["heldout_pass1_best"]:.3f}</td></tr>')
    for key, label, fmt in SUMMARY_FIELDS:
        if key in summary:
            value = "n/a" if summary[key] is None else fmt.format(summary[key])
            rows.append(f'<tr><th>{html.escape(label)}</th><td data-key="{key}">{html.escape(value)}</td></tr>')
    train = (summary.get("integrity") or {}).get("train", {})
    for key, label, fmt in INTEGRITY_FIELDS:
        if train.get(key) is not None:
            rows.append(f'<tr><th>{html.escape(label)}</th><td data-key="integrity.{key}">'
                        f'{html.escape(fmt.format(train[key]))}</td></tr>')
    return '<table class="summary" id="summary">' + "".join(rows) + "</table>"


def render_guard(guards: list[dict]) -> str:
    """The guard's events, one row each (nothing for a run without any)."""
    if not guards:
        return ""
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in GUARD_COLUMNS)
    rows = "".join("<tr>" + "".join(f'<td data-key="{key}">{html.escape(str(g.get(key, "")))}</td>'
                                    for key, _ in GUARD_COLUMNS) + "</tr>" for g in guards)
    return (f'<table class="summary" id="guard"><caption>guard events</caption><tr>{head}</tr>'
            f"{rows}</table>")


def render_plot(p: Plot) -> str:
    if p.fig is None:
        inner = f'<p class="no-data">{html.escape(p.no_data)}</p>'
    else:
        data = base64.b64encode(plots.figure_png(p.fig)).decode("ascii")
        inner = f'<img src="data:image/png;base64,{data}" alt="{html.escape(p.alt)}">'
    return f'<figure id="{p.id}">{inner}<figcaption>{html.escape(p.caption)}</figcaption></figure>'
