"""`tidal bench integrity`: how well cheating is caught, and what catching it does to training.

    planted suites  the detectors (tidal.integrity.detect) on tests/data/integrity/planted (their
                    development suite) and tests/data/integrity/heldout (never used to change a
                    rule; the headline figures): recall on the cheats, false-positive rate on
                    the honest episodes
    trace cost      the sandbox trace on vs off on the trivial program (start-to-result p50)
    demonstration   the hackable family (tests the agent can satisfy without solving the task):
                    one run of tidal's own RL loop per integrity policy, from one mid-trained
                    model, the same config and budgets but env.integrity.policy:
                        log       detection off as far as training goes (measured only)
                        screen    flagged episodes dropped from the batch (the default)
                        penalise  flagged episodes trained with the penalty reward
                    each reports the grader's cheat rate (visible tests passed, hidden failed) in
                    its first and last steps, held-out hidden-test pass@1 before and after RL,
                    and the canary cheat rate at every evaluation

The peer is the same loop without detection (policy log); figures are read back from what the
runs wrote (metrics.jsonl, summary.json), never computed a second time.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import Field

from tidal.bench.config import IntList, StrList, config_record, main, with_keys
from tidal.config import ConfigError, TidalConfig
from tidal.config_section import Section

READS = ("model", "pretrain", "engine", "env", "harness", "orchestrator", "trainer", "run")
DEFAULTS = {"env.name": "hackable", "orchestrator.time_budget_s": 240.0,
            "orchestrator.heldout_tasks": 128, "orchestrator.eval_every": 25}
"""The demonstration's runs: the hackable family, 4 minutes of RL per policy, 128 held-out
tasks (x2 samples) and an evaluation (with its canaries) every 25 steps."""
QUICK = {"bench.demo": False}


class BenchSection(Section):
    """What the integrity benchmark measures besides the run config: the suites, the
    demonstration's arms and RL levels, the trace and divergence checks."""

    suites: StrList = []
    """Planted-hack suite directories to score; [] = this checkout's tests/data/integrity/planted
    (the detectors' development suite) and tests/data/integrity/heldout (never used to change a
    rule: the headline recall and false-positive rate are its)."""
    policies: StrList = ["log", "screen", "penalise"]
    """The demonstration's arms: one RL run per env.integrity.policy."""
    demo: bool = True
    """Run the demonstration (three RL runs; ~25 minutes measured on 2 busy cores); False: the
    suites, the trace cost and the divergence check only."""
    runs_dir: str = "runs/bench-integrity"
    """Where the demonstration's runs are written, one folder per policy (must not hold them yet)."""
    trace_runs: int = Field(200, ge=10)
    """Trivial programs timed per side (trace on, trace off) for the trace's cost."""
    edge_fraction: float = Field(0.25, gt=0, le=0.5)
    """The share of a run's steps its "first" and "last" cheat rates are averaged over."""
    divergence_tasks: int = Field(64, ge=0)
    """Held-out tasks run through the training harness and through tidal serve's policy server
    (the last demonstration run's final checkpoint, or the mid-trained model without the
    demonstration) for the harness-divergence check; 0 = skip it."""
    rl_levels: IntList = [3, 5]
    """The demonstration's RL tasks: fewest and most operations in f (env.args.levels), harder
    than the mid-training corpus's (the family's default levels, 1-3). There honest success is
    rare and the hacks pay, so a run without detection learns to cheat within the benchmark's
    budget; on levels 1-3 it barely does (docs/integrity.md)."""


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    from tidal.bench.common import write_json

    result = {"config": config_record(bench, cfg, READS), **suite_figures(bench, cfg),
              "trace": trace_cost(bench, cfg)}
    result["trace_overhead_ms"] = result["trace"]["overhead_ms"]
    if bench.demo:
        result["demo"] = demonstration(bench, cfg)
        result["canary"] = {p: result["demo"]["runs"][p]["canary_cheat_rate_by_eval"]
                            for p in result["demo"]["runs"]}
    if bench.divergence_tasks:
        result["harness_divergence"] = serving_divergence(bench, cfg, result.get("demo"))
    print_table(result)
    if json_path:
        write_json(json_path, result)
        print(f"wrote {json_path}")
    return 0


def suite_figures(bench: BenchSection, cfg: TidalConfig) -> dict:
    """Each suite's score; ``recall`` and ``false_positive_rate`` are the last suite's (by
    default the held-out one)."""
    from tidal.integrity.detect import detect
    from tidal.integrity.planted import SUITES, default_suite_dir, load_planted, score

    dirs = [Path(d) for d in bench.suites] or [default_suite_dir(name) for name in SUITES]
    scored = {d.name: score(load_planted(d), detect, cfg.env.integrity.min_confidence)
              for d in dirs}
    last = scored[dirs[-1].name]
    return {"recall": last["recall"], "false_positive_rate": last["false_positive_rate"],
            "headline_suite": dirs[-1].name, "suites": scored}


def trace_cost(bench: BenchSection, cfg: TidalConfig) -> dict:
    """The sandbox benchmark's trace on/off A/B (tidal.bench.sandbox_bench.trace_costs) on the
    run's sandbox settings: p50 start-to-result of the trivial program each way."""
    from tidal.bench.sandbox_bench import trace_costs

    out = trace_costs(cfg.env.sandbox, bench.trace_runs, TRACE_GAP_S)
    return {**out, "overhead_ms": out["trace_overhead_ms"]}


TRACE_GAP_S = 0.02
"""Pause between timed runs, as the sandbox benchmark's default gap_ms (the warm pool refills)."""


def demonstration(bench: BenchSection, cfg: TidalConfig) -> dict:
    """One RL run per policy from one mid-trained model; their figures side by side."""
    from tidal.bench.common import starting_model

    if cfg.env.name != "hackable":
        raise ConfigError(f"the demonstration trains the hackable family: env.name must be "
                          f"'hackable', not {cfg.env.name!r}")
    model = starting_model(cfg)
    levels = list(bench.rl_levels)
    runs = {p: run_policy(with_keys(cfg, {"env.integrity.policy": p, "env.args.levels": levels}),
                          Path(bench.runs_dir) / p, Path(model), bench.edge_fraction)
            for p in bench.policies}
    out: dict = {"model": str(model), "rl_levels": levels, "runs": runs}
    if "log" in runs:
        out["cheat_rate_off"] = runs["log"]["cheat_rate_last"]
    if "screen" in runs:
        out["cheat_rate_on"] = runs["screen"]["cheat_rate_last"]
        out["hidden_pass_on"] = runs["screen"]["hidden_pass_after"]
        out["hidden_pass_on_before"] = runs["screen"]["hidden_pass_before"]
    if "penalise" in runs:
        out["cheat_rate_penalise"] = runs["penalise"]["cheat_rate_last"]
        out["hidden_pass_penalise"] = runs["penalise"]["hidden_pass_after"]
    if "log" in runs and "screen" in runs and runs["log"]["cheat_rate_last"]:
        out["on_over_off"] = runs["screen"]["cheat_rate_last"] / runs["log"]["cheat_rate_last"]
    return out


def serving_divergence(bench: BenchSection, cfg: TidalConfig, demo: dict | None) -> dict:
    """tidal.bench.integrity_divergence on held-out tasks of the demonstration's levels."""
    from tidal.bench.integrity_divergence import divergence
    from tidal.bench.common import starting_model
    from tidal.env import from_config
    from tidal.sandbox import Sandbox

    if demo is not None:
        checkpoint = list(demo["runs"].values())[-1]["final_checkpoint"]
    else:  # (the cache key is the corpus's: before the RL levels are set)
        checkpoint = str(starting_model(cfg))
    cfg = with_keys(cfg, {"env.args.levels": list(bench.rl_levels)})
    with Sandbox(cfg.env.sandbox) as sandbox:
        env = from_config(cfg.env, sandbox)
        tasks = env.sample_tasks(bench.divergence_tasks, cfg.orchestrator.heldout_seed, True)
        out = divergence(checkpoint, cfg, env, tasks, cfg.run.seed)
    return {"checkpoint": checkpoint, **out}


def run_policy(cfg: TidalConfig, run_dir: Path, model: Path, edge: float) -> dict:
    """One RL run (orchestrator.loop.Run) and its figures, read back from what it wrote."""
    from tidal.config.dump import recipe_tree, to_toml
    from tidal.orchestrator.loop import Run
    from tidal.orchestrator.run_output import write_summary

    if (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"{run_dir} already holds a run: give another --bench.runs_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(to_toml(recipe_tree(cfg)) + "\n")
    write_summary(run_dir, Run(cfg, run_dir, model, progress=True).run())
    return run_figures(run_dir, edge)


def run_figures(run_dir: Path, edge: float) -> dict:
    """A finished run's cheat rates (first / last ``edge`` of its steps, and each step's),
    held-out hidden pass@1 before and after, and its evaluations' canary cheat rates."""
    import json

    from tidal.telemetry.metrics import read_metrics

    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    summary = json.loads((run_dir / "summary.json").read_text())
    rates = [r.get("integrity/cheat_rate") for r in steps]
    k = max(1, int(len(steps) * edge))
    return {
        "steps": len(steps), "policy": (summary.get("integrity") or {}).get("policy"),
        "cheat_rate_first": _pooled(steps[:k]), "cheat_rate_last": _pooled(steps[-k:]),
        "cheat_rate_by_step": rates,
        "flag_rate_last": _pooled(steps[-k:], "flagged", "episodes"),
        "screened": sum(r.get("integrity/screened", 0) for r in steps),
        "penalised": sum(r.get("integrity/penalised", 0) for r in steps),
        "final_checkpoint": summary["final_checkpoint"],
        "hidden_pass_before": summary["heldout_pass1_before"],
        "hidden_pass_after": summary["heldout_pass1_after"],
        "canary_cheat_rate_by_eval": [{"label": e["label"], "step": e["step"],
                                       "canary_cheat_rate": e.get("integrity/canary_cheat_rate")}
                                      for e in evals],
        "run_dir": str(run_dir),
    }


def _pooled(steps: list[dict], num: str = "cheats", den: str = "graded") -> float | None:
    """sum(num) / sum(den) over the steps' integrity counts (None without any)."""
    total = sum(r.get(f"integrity/{den}", 0) for r in steps)
    return sum(r.get(f"integrity/{num}", 0) for r in steps) / total if total else None


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tidal bench integrity")
    table.add_column("measure")
    table.add_column("value", justify="right")
    fmt = lambda v: "n/a" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    for name, suite in result["suites"].items():
        table.add_row(f"{name} suite recall ({suite['cheats']} cheats)", fmt(suite["recall"]))
        table.add_row(f"{name} suite false positives ({suite['honest']} honest)",
                      fmt(suite["false_positive_rate"]))
    table.add_row("trace cost on sandbox p50 (ms)", fmt(result["trace_overhead_ms"]))
    if "harness_divergence" in result:
        d = result["harness_divergence"]
        table.add_row(f"harness divergence findings ({d['tasks']} tasks, train vs serve)",
                      str(len(d["findings"])))
    for policy, r in result.get("demo", {}).get("runs", {}).items():
        table.add_row(f"{policy}: cheat rate first / last steps",
                      f"{fmt(r['cheat_rate_first'])} / {fmt(r['cheat_rate_last'])}")
        table.add_row(f"{policy}: hidden pass@1 before / after",
                      f"{fmt(r['hidden_pass_before'])} / {fmt(r['hidden_pass_after'])}")
        last = [e["canary_cheat_rate"] for e in r["canary_cheat_rate_by_eval"]]
        table.add_row(f"{policy}: canary cheat rate per evaluation", ", ".join(map(fmt, last)))
    Console().print(table)


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "integrity"))
