"""`tidal bench harness`: the same agent trained natively and through the rollout gateway, side by
side in one run.

    tidal bench harness --json harness.json                    # the harness recipe (byte model)
    tidal bench harness --bench.budget_s 300 --quick           # a shorter look

Both arms start from one model (``model.init_from``, else the recipe's mid-training, run once and
cached) with the same tasks, group size, sampling, learning rate, turn and token budgets and RL
wall budget (``bench.budget_s``; start-up and evaluations are outside it):

    gateway  `tidal train RECIPE` as given (env.name = "harness"): examples/harness_agent.py, an
             openai-client process per episode, served over HTTP by the rollout engine
    native   the same with env.name = "agent": that agent's prompt and tools run by tidal's own
             tool-calling loop in process (tidal/families/agent), so the tokens are the same and the
             difference is what the gateway costs (processes, HTTP, history matching)

One evaluator judges the starting model and each arm's final checkpoint: held-out pass@1 through
the gateway (the harness is the product), greedy, on ``bench.heldout_tasks`` tasks. Beside it:
RL steps per minute, the share of later turns whose history matched (no re-tokenisation), the
gateway's time per turn beyond the engine, and the fraction of trained tokens whose engine logprob
equals the trainer's bit for bit. JSON keys ``harness.*`` are the headline figures.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from pydantic import Field

from tidal.bench.common import (bitwise_equal_fraction, greedy_heldout, starting_model,
                                train_in_child, write_json)
from tidal.bench.config import StrList, config_record, main, with_keys
from tidal.config import ConfigError, TidalConfig
from tidal.config_section import Section

READS = ("model", "engine", "trainer", "orchestrator", "env", "harness", "pretrain", "run")
"""What of the run config this benchmark uses (recorded in its JSON under "config")."""
QUICK = {"bench.budget_s": 180.0, "bench.heldout_tasks": 32}


class BenchSection(Section):
    """The budget and the evaluator's task count; everything else is the recipe's."""

    budget_s: float = Field(1200.0, gt=0)
    """RL wall-clock seconds of each arm (orchestrator.time_budget_s)."""
    heldout_tasks: int = Field(128, ge=1)
    """Held-out tasks of the evaluator (greedy pass@1 through the gateway)."""
    arms: StrList = Field(default_factory=lambda: ["native", "gateway"])
    """Which arms run, in this order."""
    runs_dir: str = ""
    """Where the arms' run folders go; "" = runs/bench-harness-<time>."""


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    if cfg.env.name != "harness":
        raise ConfigError("tidal bench harness compares an outside harness with its native twin: "
                          f"give a recipe with env.name = 'harness' (e.g. `tidal bench harness "
                          f"harness`); env.name is {cfg.env.name!r}")
    unknown = set(bench.arms) - {"native", "gateway"}
    if unknown:
        raise ConfigError(f"bench.arms: {sorted(unknown)} are not arms (native, gateway)")
    root = Path(bench.runs_dir or f"runs/bench-harness-{time.strftime('%Y%m%d-%H%M%S')}").absolute()
    root.mkdir(parents=True, exist_ok=True)
    init, pretrain_s = timed_starting_model(cfg)
    cfg = with_keys(cfg, {"model.init_from": str(init)})
    result = {"init_checkpoint": str(init), "pretrain_s": pretrain_s,
              "before": evaluate(bench, cfg, init)}
    print(f"before RL: {result['before']}", flush=True)
    for arm in bench.arms:
        result[arm] = train_arm(bench, arm_config(cfg, arm), root / arm)
        result[arm]["after"] = evaluate(bench, cfg, result[arm]["checkpoint"])
        print(f"{arm}: {json.dumps({k: v for k, v in result[arm].items() if 'by_step' not in k})}",
              flush=True)
    result["harness"] = headline(result)
    result["config"] = config_record(bench, cfg, READS)
    print_table(result)
    write_json(json_path or root / "harness.json", result)
    return 0


def timed_starting_model(cfg: TidalConfig) -> tuple[Path, float]:
    """(the model both arms start from: common.starting_model, seconds it took)."""
    start = time.perf_counter()
    return starting_model(cfg), time.perf_counter() - start


def arm_config(cfg: TidalConfig, arm: str) -> TidalConfig:
    """The run config of an arm: the recipe (gateway), or its native twin: env.name "agent" on the
    same tasks, with the gateway's turn and token budgets as the harness's."""
    if arm == "gateway":
        return cfg
    ext = cfg.env.args
    return with_keys(cfg, {"env.name": "agent",
                           "env.args": {"tasks": ext.get("tasks", "funcs"),
                                        "task_args": ext.get("task_args", {})},
                           "harness.max_turns": ext.get("max_turns", 8),
                           "harness.max_tokens": ext.get("max_tokens", 2048)})


def train_arm(bench: BenchSection, cfg: TidalConfig, run_dir: Path) -> dict:
    """`tidal train` on the arm's config with the budget, in a child process."""
    summary, steps = train_in_child(cfg, bench.budget_s, run_dir,
                                    run_dir.parent / f"{run_dir.name}-recipe.toml")

    def mean(key: str) -> float | None:
        values = [s[key] for s in steps if key in s]
        return statistics.fmean(values) if values else None

    return {"steps": summary["steps"], "rl_wall_s": summary["rl_wall_s"],
            "steps_per_min": 60 * summary["steps"] / summary["rl_wall_s"],
            "trajectories": summary["trajectories"], "checkpoint": summary["final_checkpoint"],
            "bitwise_equal_fraction": bitwise_equal_fraction(steps),
            "history_match_fraction": mean("gateway/history_match_fraction"),
            "turn_overhead_ms": mean("gateway/overhead_ms"), "turns": mean("gateway/turns"),
            "malformed_calls": mean("gateway/malformed_calls"),
            "reward_mean_by_step": [s["reward_mean"] for s in steps]}


def evaluate(bench: BenchSection, cfg: TidalConfig, checkpoint) -> dict:
    """Greedy held-out pass@1 of a checkpoint through the gateway (the recipe's harness)."""
    r = greedy_heldout(cfg, checkpoint, bench.heldout_tasks, **{"env.integrity.eval_canaries": 0})
    return {"pass1": r["pass1"], "pass1_by_level": r["pass1_by_level"]}


def headline(r: dict) -> dict:
    out = {}
    gateway, native = r.get("gateway"), r.get("native")
    if gateway and native:
        out["steps_per_min_ratio"] = gateway["steps_per_min"] / native["steps_per_min"]
        out["native_gain"] = native["after"]["pass1"] - r["before"]["pass1"]
    if gateway:
        out.update(gain=gateway["after"]["pass1"] - r["before"]["pass1"],
                   history_match_fraction=gateway["history_match_fraction"],
                   bitwise_equal_fraction=gateway["bitwise_equal_fraction"],
                   turn_overhead_ms=gateway["turn_overhead_ms"])
    return out


def print_table(r: dict) -> None:
    arms = [a for a in ("native", "gateway") if a in r]
    print(f"{'':<28}" + "".join(f"{a:>12}" for a in arms))
    rows = [("RL steps", "steps", "{:.0f}"), ("RL steps / min", "steps_per_min", "{:.2f}"),
            ("RL wall s", "rl_wall_s", "{:.0f}"), ("bitwise-equal fraction", "bitwise_equal_fraction", "{}")]
    for label, key, fmt in rows:
        print(f"{label:<28}" + "".join(f"{fmt.format(r[a][key]):>12}" for a in arms))
    print(f"{'pass@1 before':<28}" + "".join(f"{r['before']['pass1']:>12.3f}" for _ in arms))
    print(f"{'pass@1 after':<28}" + "".join(f"{r[a]['after']['pass1']:>12.3f}" for a in arms))
    h = r["harness"]
    if "steps_per_min_ratio" in h:
        print(f"gateway / native steps per minute {h['steps_per_min_ratio']:.2f}", flush=True)
    if "gain" in h:
        print(f"gateway: gain {100 * h['gain']:+.1f} points; history matched "
              f"{h['history_match_fraction']}; {h['turn_overhead_ms']} ms a turn beyond the engine",
              flush=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "harness"))
