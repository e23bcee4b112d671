"""Fit the simulator's models (``SimModel``) from a measured run: its metrics.jsonl, the
config.toml `tidal train` wrote beside it, and, where the run published through tidal.sync, the
sizes of its anchors and deltas.

    tokens_per_s          generated tokens over engine seconds, per worker (ratio of sums)
    rollout_tokens_mean   generated tokens per trajectory
    rollout_tokens_sigma  the lognormal sigma whose trajectory variance explains the variance of
                          the per-step means (n · var(step mean) = var(trajectory))
    prompt_tokens         trained tokens per trajectory minus generated ones (median over steps)
    grade_s               grade seconds per trajectory
    train_*               train_s = fixed + per_token · train/tokens, least squares over steps
                          (the first step, which warms up, left out when there are others)
    publish_s             median publish_s
    eval_s                median step time right after an evaluation, minus the median of the rest
    worker_start_s        the earliest "busy" span's start (workers loading and warming up)
    full/delta_bytes      the largest anchor and the median delta in the run's weights/ store

The constants not seen in a run (decode rate, LAN, upload size) keep SimModel's defaults.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from tidal.fleet.sim_model import SimModel, SimulateError


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SimulateError(f"{run_dir} has no metrics.jsonl: name the folder of a `tidal train` run")
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                raise SimulateError(f"{path}:{n} is not JSON (a truncated run? remove the line)") from None
    return out


def calibrate(run_dir: str | Path, base: SimModel | None = None) -> SimModel:
    """The SimModel fitted to the run in ``run_dir`` (constants it cannot see come from ``base``)."""
    from tidal.config import load_config

    run_dir = Path(run_dir)
    records = read_records(run_dir)
    if not (run_dir / "config.toml").is_file():
        raise SimulateError(f"{run_dir} has no config.toml: calibration needs the run's recipe")
    oc = load_config(run_dir / "config.toml").orchestrator
    steps = [r for r in records if r.get("kind") == "step"]
    if len(steps) < 2:
        raise SimulateError(f"{run_dir}/metrics.jsonl has {len(steps)} step records: calibration needs "
                            f"at least 2 (run more steps)")
    fit = fit_steps(steps, min(oc.num_workers, oc.tasks_per_step), oc.tasks_per_step * oc.group_size)
    fit["eval_s"] = eval_cost(steps, [r for r in records if r.get("kind") == "eval"])
    busy = [r["start_s"] for r in records if r.get("kind") == "worker" and r["state"] == "busy"]
    fit["worker_start_s"] = min(busy) if busy else 0.0
    fit |= weight_sizes(run_dir / "weights")
    return (base or SimModel()).model_copy(update=fit)


def fit_steps(steps: list[dict[str, Any]], assignments: int, trajectories: int) -> dict[str, float]:
    """The rollout, grading, training and publishing constants from step records of a run whose
    steps each had ``assignments`` assignments and ``trajectories`` generated trajectories."""
    gen_s = np.array([r["generate_s"] for r in steps])
    tokens = np.array([r["gen_tokens_per_s"] * r["generate_s"] / assignments for r in steps])
    means = tokens / trajectories
    mean = float(means.mean())
    var_traj = float(means.var(ddof=1)) * trajectories if len(means) > 1 else 0.0
    prompt = [r["train/tokens"] / r["trajectories"] - t / trajectories
              for r, t in zip(steps, tokens) if r.get("train/tokens") and r["trajectories"]]
    fixed, per_token = train_fit(steps[1:] if len(steps) > 2 else steps)
    return {
        "tokens_per_s": float(tokens.sum() / max(gen_s.sum(), 1e-9)),
        "rollout_tokens_mean": max(mean, 1.0),
        "rollout_tokens_sigma": math.sqrt(math.log1p(var_traj / mean ** 2)) if mean > 0 else 0.0,
        "prompt_tokens": max(0.0, statistics.median(prompt)) if prompt else 0.0,
        "grade_s": sum(r["grade_s"] for r in steps) / (len(steps) * trajectories),
        "train_fixed_s": fixed, "train_per_token_s": per_token,
        "publish_s": statistics.median(r["publish_s"] for r in steps),
    }


def train_fit(steps: list[dict[str, Any]]) -> tuple[float, float]:
    """Least squares train_s = fixed + per_token · tokens, both kept >= 0."""
    x = np.array([float(r.get("train/tokens") or 0.0) for r in steps])
    y = np.array([r["train_s"] for r in steps])
    if len(steps) < 2 or np.ptp(x) == 0:
        return float(y.mean()), 0.0
    per_token, fixed = np.polyfit(x, y, 1)
    if per_token < 0:
        return float(y.mean()), 0.0
    if fixed < 0:
        return 0.0, float((x * y).sum() / (x * x).sum())
    return float(fixed), float(per_token)


def eval_cost(steps: list[dict[str, Any]], evals: list[dict[str, Any]]) -> float:
    """Seconds one held-out evaluation added to the step after it (0 when the run had none
    between steps)."""
    after = {e["step"] + 1 for e in evals if e.get("label", "").startswith("step ")}
    hit = [r["step_time_s"] for r in steps if r["step"] in after]
    rest = [r["step_time_s"] for r in steps[1:] if r["step"] not in after]
    if not hit or not rest:
        return 0.0
    return max(0.0, statistics.median(hit) - statistics.median(rest))


def weight_sizes(store: Path) -> dict[str, float]:
    """full_bytes (largest anchor) and delta_bytes (median delta) of a tidal.sync store."""
    sizes: dict[str, list[int]] = {"anchor": [], "delta": []}
    for manifest in sorted(store.glob("v*/*/manifest.json")) if store.is_dir() else []:
        try:
            m = json.loads(manifest.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if m.get("kind") in sizes and isinstance(m.get("data_bytes"), int):
            sizes[m["kind"]].append(m["data_bytes"])
    out: dict[str, float] = {}
    if sizes["anchor"]:
        out["full_bytes"] = float(max(sizes["anchor"]))
    if sizes["delta"]:
        out["delta_bytes"] = float(statistics.median(sizes["delta"]))
    return out


def model_toml(model: SimModel, source: str = "") -> str:
    """``[simulate]`` with every constant, each line commented with its docstring's first line."""
    lines = [f"# fitted by `tidal simulate calibrate {source}`" if source else "", "[simulate]"]
    for name, info in SimModel.model_fields.items():
        value = getattr(model, name)
        if name == "partitions":
            continue
        doc = " ".join((info.description or "").split())
        lines.append(f"{name} = {_toml_value(value)}  # {doc}")
    return "\n".join(x for x in lines if x) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)  # round-trips exactly; TOML reads Python's float forms
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)
