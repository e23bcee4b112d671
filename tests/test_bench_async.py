"""`tidal bench async`: its figures from synthetic run records (time to target, evaluation time
taken out, trajectory accounting, simulator error), its bad settings, and one tiny end-to-end run."""

import json
from pathlib import Path

import pytest

from tidal.bench import async_bench
from tidal.bench.async_bench import elastic_config, mode_config, run_async_bench
from tidal.bench.async_figures import (
    curve,
    default_target,
    mean_step_time,
    median,
    relative_error,
    rl_time,
    staleness_hist,
    time_to_target,
    trajectory_accounting,
)
from tidal.bench.async_runs import EVAL_SPANS, run_figures
from tidal.bench.config import parse
from tidal.config import ConfigError
from tidal.orchestrator.topology import capacity_at


def step(n, wall, trajs=4, dropped=0, hist=None):
    return {"kind": "step", "step": n, "wall_s": wall, "trajectories": trajs, "dropped_stale": dropped,
            "staleness_hist": hist or {"0": trajs}, "generate_s": 1.0, "grade_s": 0.1, "train_s": 0.5}


def evaluation(label, n, wall, p):
    return {"kind": "eval", "label": label, "step": n, "wall_s": wall, "heldout_pass1": p}


def synthetic_run(tmp: Path, records: list[dict], spans=(), steps=4) -> Path:
    """A run folder as run_one leaves it: metrics.jsonl, summary.json, config.toml, eval_spans."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp / "summary.json").write_text(json.dumps({
        "steps": steps, "rl_wall_s": 100.0, "worker_busy_fraction": 0.93, "trajectories": 16,
        "dropped_stale": 0, "fleet": {"duplicates": 0, "requeued": 1, "joined": 2, "left": 1}}))
    (tmp / "config.toml").write_text("[orchestrator]\ntasks_per_step = 2\ngroup_size = 2\n")
    (tmp / EVAL_SPANS).write_text(json.dumps([list(s) for s in spans]))
    return tmp


def test_time_to_target_interpolates_between_the_bracketing_points():
    pts = curve([(0, 0, 0.30), (20, 2, 0.34), (40, 4, 0.42), (60, 6, 0.40)])
    assert time_to_target(pts, 0.38) == pytest.approx(30.0)  # halfway from 0.34 to 0.42
    assert time_to_target(pts, 0.42) == 40.0
    assert time_to_target(pts, 0.30) == 0.0
    assert time_to_target(pts, 0.50) is None


def test_in_loop_evaluation_time_is_taken_out_of_rl_time():
    spans = [(10.0, 5.0), (30.0, 5.0)]
    assert rl_time(9.0, spans) == 9.0
    assert rl_time(12.0, spans) == 10.0  # an evaluation still running counts up to now
    assert rl_time(20.0, spans) == 15.0
    assert rl_time(40.0, spans) == 30.0
    pts = curve([(0, 0, 0.2), (20, 2, 0.3), (40, 4, 0.4)], spans)
    assert [p["rl_s"] for p in pts] == [0, 15.0, 30.0]


def test_the_curve_of_a_recorded_run_ends_at_its_before_and_after_evaluations(tmp_path):
    """From a synthetic metrics.jsonl: checkpoint points, an in-loop evaluation whose 10 s are
    taken out of every later point, and the run's own before/after evaluations as the ends."""
    records = [evaluation("before", 0, 0.0, 0.25), step(1, 10.0), step(2, 20.0),
               evaluation("step 2", 2, 20.0, 0.30), step(3, 40.0), step(4, 50.0),
               evaluation("after", 4, 50.0, 0.45)]
    run = synthetic_run(tmp_path / "r", records, spans=[(20.0, 10.0)])
    f = run_figures(run, [(40.0, 3, 0.40)])
    assert [(p["rl_s"], p["step"], p["pass1"]) for p in f["curve"]] == [
        (0.0, 0, 0.25), (20.0, 2, 0.30), (30.0, 3, 0.40), (40.0, 4, 0.45)]
    assert f["eval_s_in_loop"] == 10.0
    assert time_to_target(f["curve"], 0.35) == pytest.approx(25.0)
    assert f["before_pass1"] == 0.25 and f["final_pass1"] == 0.45
    assert f["step_time_s"] == 12.5 and f["worker_utilisation"] == 0.93
    assert f["accounting"] == {"lost": 0, "duplicated": 0}


def test_default_target_is_reached_by_both_modes():
    assert default_target(0.30, sync_best=0.40, async_best=0.50, fraction=0.5) == pytest.approx(0.35)
    assert default_target(0.30, sync_best=0.25, async_best=0.50, fraction=0.5) == 0.30


def test_lost_and_duplicated_trajectories_are_counted_from_step_records():
    planned = 4
    steps = [step(1, 1.0, trajs=4), step(2, 2.0, trajs=2, dropped=2),  # 2 dropped as stale: accounted
             step(3, 3.0, trajs=2, dropped=2),                            # 2 gone with no count: lost
             step(4, 4.0, trajs=6, dropped=2)]                            # 2 beyond the plan: duplicated
    assert trajectory_accounting(steps, planned) == {"lost": 2, "duplicated": 2}
    assert trajectory_accounting(steps[:2], planned) == {"lost": 0, "duplicated": 0}


def test_staleness_step_time_and_errors():
    steps = [step(1, 10.0, hist={"0": 3, "1": 1}), step(2, 30.0, hist={"1": 4})]
    assert staleness_hist(steps) == {"0": 3, "1": 5}
    assert mean_step_time(steps) == 15.0
    assert relative_error(11.0, 10.0) == pytest.approx(0.1)
    assert relative_error(9.0, 10.0) == pytest.approx(0.1)
    assert median([0.1, None, 0.3, 0.2]) == 0.2 and median([None]) is None


def test_modes_differ_only_in_staleness_and_the_elastic_pools_come_and_go():
    bench, cfg, _ = parse(async_bench, "async", [])
    s, a = mode_config(bench, cfg, "sync", 3), mode_config(bench, cfg, "async", 3)
    assert (s.orchestrator.max_staleness, a.orchestrator.max_staleness) == (0, 1)
    assert s.run.trainer_cpus == a.run.trainer_cpus == [0] and s.run.worker_cpus == [1]
    assert s.run.seed == 3 and s.orchestrator.checkpoint_every == bench.eval_every
    assert s.model_dump(exclude={"orchestrator"}) == a.model_dump(exclude={"orchestrator"})
    e = elastic_config(bench, cfg, 3)
    budget = cfg.orchestrator.time_budget_s
    a_pool, b_pool = e.fleet.pools
    assert [capacity_at(a_pool, t) for t in (0, budget / 2, budget * 0.9)] == [1, 1, 0]
    assert [capacity_at(b_pool, t) for t in (0, budget / 2, budget * 0.9)] == [0, 1, 1]


@pytest.mark.parametrize("args, words", [
    (["--bench.runs", "0"], "bench.runs"),
    (["--bench.target_pass1", "1.5"], "bench.target_pass1"),
    (["--run.worker_cpus", "[999]"], "run.worker_cpus"),
])
def test_bad_settings_are_one_clear_error(args, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        _, cfg, _ = parse(async_bench, "async", args)
        async_bench.check(cfg)


TINY = ["--model.hidden_size", "64", "--model.intermediate_size", "128", "--model.num_hidden_layers", "1",
        "--model.num_attention_heads", "2", "--model.num_key_value_heads", "1", "--model.head_dim", "32",
        "--env.args.max_level", "1", "--pretrain.corpus_docs", "200", "--pretrain.max_steps", "4",
        "--pretrain.batch_size", "4", "--engine.max_new_tokens", "16", "--engine.numerics", "fast",
        "--orchestrator.backend", "local", "--run.trainer_cpus", "[]", "--run.worker_cpus", "[]",
        "--orchestrator.tasks_per_step", "2", "--orchestrator.group_size", "2",
        "--orchestrator.heldout_tasks", "4", "--orchestrator.time_budget_s", "3",
        "--trainer.micro_batch_size", "4", "--bench.eval_every", "1"]
"""A 1-layer model mid-trained for 4 steps, 2 x 2 episodes a step, 3 s of RL per run, local workers."""


@pytest.mark.slow  # ~40 s: three runs of tidal's loop with their evaluations, and the simulator
def test_quick_run_end_to_end(tmp_path):
    args = [*TINY, "--quick", "--pretrain.cache_dir", str(tmp_path / "cache"),
            "--bench.runs_dir", str(tmp_path / "runs"), "--json", str(tmp_path / "a.json")]
    bench, cfg, json_path = parse(async_bench, "async", args)
    assert bench.runs == 1
    r = run_async_bench(bench, cfg, json_path, progress=False)
    written = json.loads((tmp_path / "a.json").read_text())
    for key in ("speedup_time_to_target", "sim_error", "elastic", "sync", "async"):
        assert key in written
    for m in ("sync", "async"):
        run = r[m]["runs"][0]
        assert run["steps"] >= 1 and 0 <= run["worker_utilisation"] <= 1
        assert run["curve"][0]["rl_s"] == 0 and run["eval_s_in_loop"] == 0
        assert r[m]["final_pass1"] == run["final_pass1"]
    assert set(r["sync"]["staleness_hist"]) == {"0"}
    assert r["elastic"]["duplicated_trajectories"] == 0 and r["elastic"]["lost_trajectories"] == 0
    assert r["elastic"]["joined"] >= 2
    sim = r["sim_error"]["detail"]
    assert sim["calibrated_on"] == "seed0-sync" and sim["predicted_runs"] == 1
    assert r["sim_error"]["step_time"] == sim["predictions"][0]["error"]["step_time"]
    assert (tmp_path / "runs" / "seed0-async" / "config.toml").is_file()
