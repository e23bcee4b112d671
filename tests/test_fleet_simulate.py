"""The fleet simulator (tidal.fleet.simulate) and its calibration: deterministic, within the
staleness bound, sync slower than async, nothing lost when a pool goes, constants recovered."""

import json
import math
import tomllib

import numpy as np
import pytest

from tidal.cli import main
from tidal.config import load_config
from tidal.fleet.calibrate import calibrate, model_toml
from tidal.fleet.sim_model import SimModel, SimulateError, sim_model_from
from tidal.fleet.simulate import example_path, load_simulate_recipe, simulate_config
from tidal.sync.pull import predict_delivery_s

FAST = SimModel(tokens_per_s=1000, rollout_tokens_mean=50, rollout_tokens_sigma=0.5, grade_s=0.01,
                train_fixed_s=0.5, train_per_token_s=1e-4, publish_s=0.05, worker_start_s=0.0)


def _cfg(*overrides, fleet=None, tmp_path=None):
    if fleet is None:
        return load_config(None, ["--orchestrator.time_budget_s", "1e6", *overrides])
    path = tmp_path / "r.toml"
    path.write_text(fleet)
    return load_config(path, ["--orchestrator.time_budget_s", "1e6", *overrides])


TWO_REGIONS = """
[fleet]
trainer_region = "home"
lease_s = 10.0
heartbeat_s = 1.0
regions = [{ name = "home" }, { name = "far" }]
links = [{ a = "home", b = "far", bandwidth_mbps = 100, latency_ms = 80 }]
[[fleet.pools]]
name = "fixed"
region = "home"
workers = 2
[[fleet.pools]]
name = "borrowed"
region = "far"
workers = 3
schedule = [{ at_s = 0, workers = 3 }, { at_s = 20, workers = 0 }, { at_s = 60, workers = 2 }]
"""


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    cfg = _cfg()
    a, b = simulate_config(cfg, FAST, 20, seed=1), simulate_config(cfg, FAST, 20, seed=1)
    assert a.to_json() == b.to_json()
    assert simulate_config(cfg, FAST, 20, seed=2).step_times != a.step_times


def test_a_fast_trainer_with_plenty_of_work_keeps_workers_busy():
    fast_trainer = FAST.model_copy(update={"train_fixed_s": 0.0, "train_per_token_s": 0.0, "publish_s": 0.0})
    r = simulate_config(_cfg("--orchestrator.max_staleness", "4", "--orchestrator.tasks_per_step", "32"),
                        fast_trainer, 30, seed=0)
    assert r.steps == 30 and r.worker_utilisation > 0.95


@pytest.mark.parametrize("max_staleness", [0, 1, 3])
def test_staleness_never_exceeds_the_bound(tmp_path, max_staleness):
    cfg = _cfg("--orchestrator.max_staleness", str(max_staleness), fleet=TWO_REGIONS, tmp_path=tmp_path)
    r = simulate_config(cfg, FAST, 30, seed=0)
    assert r.steps == 30 and r.dropped_stale == 0
    assert max(r.staleness_hist) <= max_staleness
    assert sum(r.staleness_hist.values()) == 30 * cfg.orchestrator.tasks_per_step * cfg.orchestrator.group_size


def test_sync_mode_keeps_workers_less_busy_than_async():
    slow_trainer = FAST.model_copy(update={"train_fixed_s": 2.0})
    sync = simulate_config(_cfg("--orchestrator.max_staleness", "0"), slow_trainer, 20, seed=0)
    async_ = simulate_config(_cfg("--orchestrator.max_staleness", "2"), slow_trainer, 20, seed=0)
    assert sync.worker_utilisation < async_.worker_utilisation
    assert sync.step_time_s > async_.step_time_s
    assert set(sync.staleness_hist) == {0}


@pytest.mark.parametrize("leave", ["expire", "release"])
def test_a_pool_that_drops_to_zero_requeues_its_work_and_nothing_is_lost(tmp_path, leave):
    cfg = _cfg(fleet=TWO_REGIONS, tmp_path=tmp_path)
    r = simulate_config(cfg, FAST.model_copy(update={"leave": leave}), 40, seed=0)
    assert r.steps == 40 and not r.stalled
    assert r.requeued_by_pool.get("borrowed", 0) > 0 and "fixed" not in r.requeued_by_pool
    assert r.lost == 0 and r.trained_twice == 0
    assert set(r.utilisation_by_pool) == {"fixed", "borrowed"}
    assert r.sync_latency_s["far"] > r.sync_latency_s["home"]


def test_a_region_cut_off_past_its_lease_rejoins_and_late_results_are_counted_duplicates(tmp_path):
    fleet = TWO_REGIONS.replace(
        'schedule = [{ at_s = 0, workers = 3 }, { at_s = 20, workers = 0 }, { at_s = 60, workers = 2 }]', "")
    model = SimModel(**{**FAST.model_dump(), "partitions": [{"region": "far", "start_s": 5.0, "end_s": 40.0}]})
    r = simulate_config(_cfg(fleet=fleet, tmp_path=tmp_path), model, 40, seed=0)
    assert r.steps == 40 and r.requeued_by_pool.get("borrowed", 0) > 0
    assert r.lost == 0 and r.trained_twice == 0
    assert r.duplicates > 0  # the cut-off workers' results, re-run elsewhere meanwhile


def test_a_fleet_with_no_capacity_stalls_instead_of_hanging(tmp_path):
    fleet = TWO_REGIONS.replace("workers = 2\n", "workers = 0\n").replace(
        "{ at_s = 60, workers = 2 }", "{ at_s = 60, workers = 0 }")
    r = simulate_config(_cfg(fleet=fleet, tmp_path=tmp_path), FAST, 1000, seed=0)
    assert r.stalled and r.steps < 1000 and r.lost == 0


def test_delivery_is_latency_plus_the_larger_of_transfer_and_decode():
    # the simulator uses the sync layer's model: 1.8 MB over 1 Gbit/s, 25 ms one way, a 214 MB
    # model decoded while it streams in at 2.389 GB/s: 25 ms + max(14.4 ms, 89.6 ms)
    assert predict_delivery_s(1.8e6, 214e6, 1e9, 0.025, 2.389e9) == pytest.approx(0.1146, abs=1e-3)
    assert predict_delivery_s(1e6, 0, 8e6, 0.1, 1.0, hops=2) == pytest.approx(2 * (0.1 + 1.0))


def _synthetic_run(tmp_path, rng, steps=40, workers=2, tasks=8, group=8, tps=900.0, mean=60.0,
                   sigma=0.6, grade=0.02, fixed=0.4, per_token=3e-4, publish=0.07):
    """A metrics.jsonl written as the loop would with known constants."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(f"[orchestrator]\nnum_workers = {workers}\ntasks_per_step = {tasks}\n"
                                     f"group_size = {group}\n")
    lines, n = [], tasks * group
    mu = math.log(mean) - sigma ** 2 / 2
    for s in range(1, steps + 1):
        gen_tokens = float(rng.lognormal(mu, sigma, n).round().sum())
        gen_s = gen_tokens / tps
        trained = gen_tokens
        lines.append({"kind": "step", "step": s, "generate_s": gen_s, "grade_s": grade * n,
                      "gen_tokens_per_s": gen_tokens / gen_s * workers, "train/tokens": trained,
                      "trajectories": n, "train_s": fixed + per_token * trained, "publish_s": publish,
                      "step_time_s": 3.0})
    lines.append({"kind": "worker", "worker": 0, "state": "busy", "start_s": 5.5, "end_s": 7.0})
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return run


def test_calibration_recovers_known_constants(tmp_path):
    run = _synthetic_run(tmp_path, np.random.default_rng(0))
    m = calibrate(run)
    assert m.tokens_per_s == pytest.approx(900.0, rel=1e-6)
    assert m.rollout_tokens_mean == pytest.approx(60.0, rel=0.05)
    assert m.rollout_tokens_sigma == pytest.approx(0.6, rel=0.3)
    assert m.grade_s == pytest.approx(0.02)
    assert (m.train_fixed_s, m.train_per_token_s) == (pytest.approx(0.4), pytest.approx(3e-4))
    assert m.publish_s == pytest.approx(0.07) and m.worker_start_s == 5.5
    assert sim_model_from(tomllib.loads(model_toml(m))["simulate"]) == m


def test_calibrate_cli_writes_a_simulate_table(tmp_path, capsys):
    run = _synthetic_run(tmp_path, np.random.default_rng(1))
    out = tmp_path / "model.toml"
    assert main(["simulate", "calibrate", str(run), "--out", str(out)]) == 0
    assert "[simulate]" in out.read_text()
    assert main(["simulate", "calibrate", str(tmp_path / "nowhere")]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


def test_the_examples_are_found_by_name_and_run(tmp_path, capsys):
    assert example_path("local").is_file() and example_path("global").is_file()
    out = tmp_path / "sim.json"
    assert main(["simulate", "local", "--steps", "5", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    for key in ("step_time_s", "worker_utilisation", "staleness_hist", "steps_per_hour", "sync_latency_s",
                "requeued"):
        assert key in r
    assert r["steps"] == 5 and "utilisation" in capsys.readouterr().out
    cfg, model = load_simulate_recipe("global")
    assert len(cfg.fleet.regions) == 4 and model.full_bytes == 1e12
    r = simulate_config(cfg, model, 2, seed=0)
    assert r.steps == 2 and set(r.sync_latency_s) == {"us-west", "us-east", "europe", "asia"}


@pytest.mark.parametrize("text, names", [
    ("[simulate]\ntokens_per_s = -1\n", "simulate.tokens_per_s"),
    ("[simulate]\ntokens_per_sec = 1\n", "simulate.tokens_per_sec"),
    ("[simulate]\npartitions = [{ region = 'local', start_s = 5, end_s = 1 }]\n", "end_s"),
    ("[orchestrator]\nsteps = 3\n", "[simulate]"),
    (("[simulate]\n[fleet]\nregions = [{ name = 'local' }, { name = 'moon' }]\n"
      "pools = [{ name = 'p', region = 'moon' }]\n"), "fleet.links"),
    ("[simulate]\npartitions = [{ region = 'mars', start_s = 1, end_s = 2 }]\n", "simulate.partitions.0.region"),
])
def test_a_bad_simulate_recipe_is_one_clear_error(tmp_path, capsys, text, names):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["simulate", str(path), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert names in err and "Traceback" not in err
    with pytest.raises(SimulateError):
        cfg, model = load_simulate_recipe(path)
        simulate_config(cfg, model, 2, seed=0)
