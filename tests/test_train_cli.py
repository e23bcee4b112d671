"""`tidal train` / `tidal eval` from the command line on a tiny random checkpoint (no pretraining)."""

import json

import pytest

from tidal.cli import main
from tidal.config import load_config
from tidal.model import build_model, save_pretrained

FAST = ["--orchestrator.steps", "2", "--orchestrator.tasks_per_step", "2", "--orchestrator.group_size", "2",
        "--orchestrator.heldout_tasks", "4", "--orchestrator.eval_every", "1", "--orchestrator.backend", "local",
        "--engine.max_new_tokens", "16"]


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "model"
    cfg = load_config(None, ["--model.hidden_size", "32", "--model.num_hidden_layers", "1",
                             "--model.num_attention_heads", "2", "--model.num_key_value_heads", "1",
                             "--model.head_dim", "16", "--model.intermediate_size", "64"])
    save_pretrained(build_model(cfg.model, seed=0), path)
    return path


def test_train_writes_metrics_summary_plot(tmp_path, tiny_ckpt, capsys):
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), "--model.init_from", str(tiny_ckpt), *FAST]) == 0
    summary = json.loads((run / "summary.json").read_text())
    for key in ("heldout_pass1_before", "heldout_pass1_after", "heldout_tasks", "wall_s", "steps",
                "trajectories"):
        assert key in summary
    assert summary["steps"] == 2 and summary["trajectories"] == 8 and summary["heldout_tasks"] == 4
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        for key in ("reward_mean", "pass_rate", "gen_tokens_per_s", "step_time_s", "train/loss"):
            assert key in s
    assert [e["label"] for e in evals] == ["before", "step 1", "after"]
    assert (run / "reward.png").stat().st_size > 1000
    assert (run / "config.toml").is_file()
    report = (run / "report.html").read_text()
    assert "No summary.json" not in report and "plot-workers" in report
    out = capsys.readouterr().out
    best = max(evals, key=lambda e: e["heldout_pass1"])  # the first of equals
    assert summary["best_step"] == best["step"] and summary["heldout_pass1_best"] == best["heldout_pass1"]
    assert f"held-out pass@1, best checkpoint (step {best['step']})" in out  # the headline, as such
    assert "held-out pass@1, final checkpoint (step 2)" in out
    resolved = summary["dtypes"]["model.dtype"]["resolved"]
    assert out.splitlines()[0].startswith(f"dtype: model auto -> {resolved}, trainer auto -> ")
    saved = load_config(run / "config.toml")  # the run's record: resolved, so a resume keeps them
    assert saved.model.requested_dtype("dtype") == resolved and "cpu" in summary
    numerics = summary["numerics"]  # the probed deterministic paths, printed and recorded
    assert numerics["mode"] == "deterministic" and numerics["dtype"] == resolved
    assert f"numerics: deterministic {resolved}: linear={numerics['linear']} " in out


def test_eval_command(tiny_ckpt, capsys):
    assert main(["eval", str(tiny_ckpt), "--tasks", "3", "--engine.max_new_tokens", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tasks"] == 3 and 0.0 <= out["pass1"] <= 1.0
    assert out["integrity"] is None  # funcs keeps no evidence


def test_eval_reports_the_cheat_and_canary_rates_of_a_checkpoint(tiny_ckpt, capsys):
    assert main(["eval", str(tiny_ckpt), "--tasks", "3", "--engine.max_new_tokens", "8",
                 "--env.name", "hackable", "--env.integrity.eval_canaries", "4"]) == 0
    integrity = json.loads(capsys.readouterr().out)["integrity"]
    assert integrity["canary_episodes"] + integrity["episodes"] > 0
    assert {"cheat_rate", "flag_rate", "canary_cheat_rate"} <= set(integrity)


def test_missing_checkpoint_is_one_clear_error(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "error" in err and "nope" in err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    assert main(["train", "--run-dir", str(tmp_path / "r"), "--model.init_from", str(bad)]) == 2
    assert "config.json" in capsys.readouterr().err


def test_eval_of_a_run_dir_names_its_final_and_best_checkpoints(tmp_path, tiny_ckpt, capsys):
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), "--model.init_from", str(tiny_ckpt), *FAST]) == 0
    summary = json.loads((run / "summary.json").read_text())
    capsys.readouterr()
    assert main(["eval", str(run), "--tasks", "2"]) == 0  # the run's own config.toml
    out = json.loads(capsys.readouterr().out)
    assert out["run_dir"] == str(run)
    assert out["final"]["checkpoint"] == summary["final_checkpoint"] and out["final"]["step"] == 2
    assert out["best"]["checkpoint"] == summary["best_checkpoint"]
    assert out["best"]["step"] == summary["best_step"] and out["best"]["tasks"] == 2
    (run / "summary.json").unlink()  # a run that has not finished: its latest checkpoint and best
    assert main(["eval", str(run), "--tasks", "2"]) == 0
    unfinished = json.loads(capsys.readouterr().out)
    assert unfinished["final"]["checkpoint"] == summary["final_checkpoint"]
    assert unfinished["best"]["checkpoint"] == summary["best_checkpoint"]
