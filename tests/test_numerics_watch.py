"""The deterministic guarantee acted on at run time (orchestrator.numerics_watch): a step whose
trained tokens are not the trainer's bits stops RL with an error by default, or goes on corrected,
or is logged once; every such step is counted."""

from __future__ import annotations

import pytest
import torch
import json

from test_orchestrator import TINY, cfg_with, ckpt, records  # noqa: F401  (the module-scoped checkpoint)

from tidal.cli import main
from tidal.config.loader import ConfigError
from tidal.numerics import metrics
from tidal.numerics.ops import DeterministicLinear
from tidal.orchestrator import loop
from tidal.trainer import trainer as trainer_module


@pytest.fixture
def parted_bits(monkeypatch):
    """The trainer's logprobs of every step nudged at one token: what a machine where the probe's
    paths do not hold gives."""
    real = metrics.mismatch_metrics

    def nudged(engine_lp: torch.Tensor, trainer_lp: torch.Tensor) -> dict:
        trainer_lp = trainer_lp.clone()
        if trainer_lp.numel():
            trainer_lp[0] = torch.nextafter(trainer_lp[0], torch.tensor(0.0))
        return real(engine_lp, trainer_lp)

    monkeypatch.setattr(trainer_module, "mismatch_metrics", nudged)


def test_deterministic_numerics_hold_here_and_nothing_is_said(tmp_path, ckpt, capsys):  # noqa: F811
    summary = loop.run_rl(cfg_with("--orchestrator.steps", "2"), tmp_path, ckpt, progress=False)
    assert summary.numerics["mismatched_steps"] == 0 and summary.numerics["mismatch"] is None
    assert records(tmp_path, "guard") == [] and "numerics" not in capsys.readouterr().err
    assert all(s["train/mismatch_bitwise_equal_fraction"] == 1.0 for s in records(tmp_path, "step"))


@pytest.fixture
def row_count_kernel(monkeypatch):
    """A kernel that is not batch-invariant, swapped in after start-up (the probe has chosen its
    paths): the deterministic linear's output is rounded by a factor that depends on the rows of
    the call, so the engine's calls of one to a few rows and the trainer's whole batch differ."""
    real = DeterministicLinear.__call__

    def by_rows(self, x):
        rows = x.numel() // x.shape[-1]
        return real(self, x) * (1 + 2.0 ** -12 * (rows % 3))

    monkeypatch.setattr(DeterministicLinear, "__call__", by_rows)


def test_a_non_invariant_kernel_stops_the_run_at_its_first_step(tmp_path, ckpt, row_count_kernel, capsys):  # noqa: F811
    summary = loop.run_rl(cfg_with("--orchestrator.steps", "5"), tmp_path, ckpt, progress=False)
    err = capsys.readouterr().err
    assert summary.steps == 1 and "RL stops after this step, saves and exits with an error" in err
    assert "linear=" in err and "attention=" in err and "tidal doctor" in err  # the op set, what to do
    assert [e["label"] for e in records(tmp_path, "eval")][-1] == "after"  # still evaluated
    [event] = records(tmp_path, "guard")
    assert event["detector"] == "numerics_mismatch" and event["action"] == "stop" and event["step"] == 1
    assert event["evidence"]["bitwise_equal_fraction"] < 1 and "linear=" in event["evidence"]["opset"]


def test_tidal_train_exits_with_an_error_after_saving(tmp_path, ckpt, row_count_kernel, capsys):  # noqa: F811
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), "--model.init_from", str(ckpt), *TINY,
                 "--orchestrator.steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "tidal train: error: RL stopped at step 1: engine.numerics = 'deterministic' but" in err
    summary = json.loads((run / "summary.json").read_text())  # nothing stored is lost
    assert summary["numerics"]["mismatched_steps"] == 1 and summary["steps"] == 1
    assert (run / "report.html").is_file() and any(run.glob("checkpoints/*"))


def test_log_says_it_once_and_counts_every_step(tmp_path, ckpt, parted_bits, capsys):  # noqa: F811
    cfg = cfg_with("--orchestrator.steps", "3", "--orchestrator.guard.numerics_mismatch", "log")
    summary = loop.run_rl(cfg, tmp_path, ckpt, progress=False)
    err = capsys.readouterr().err
    assert err.count("engine.numerics = 'deterministic' but") == 1 and "RL goes on uncorrected" in err
    compared = [s for s in records(tmp_path, "step") if s.get("train/mismatch_tokens")]
    assert summary.steps == 3 and compared and summary.numerics["mismatched_steps"] == len(compared)
    assert summary.numerics["mismatch"].startswith("step 1: engine.numerics = 'deterministic' but")
    [event] = records(tmp_path, "guard")
    assert event["detector"] == "numerics_mismatch" and event["action"] == "log" and event["step"] == 1


def test_correct_goes_on_with_truncated_importance_sampling(tmp_path, ckpt, row_count_kernel, capsys):  # noqa: F811
    cfg = cfg_with("--orchestrator.steps", "3", "--orchestrator.guard.numerics_mismatch", "correct")
    summary = loop.run_rl(cfg, tmp_path, ckpt, progress=False)
    assert summary.steps == 3 and "trainer.off_policy.kind = 'truncated_is' from the next step" in capsys.readouterr().err
    steps = records(tmp_path, "step")
    assert "train/is_weight_mean" not in steps[0] and all("train/is_weight_mean" in s for s in steps[1:])
    assert [e["action"] for e in records(tmp_path, "guard")] == ["correct"]


def test_an_old_recipe_key_names_the_new_one():
    with pytest.raises(ConfigError, match=r"'engine.on_mismatch' moved to 'orchestrator.guard.numerics_mismatch': "
                                          r"write it as \[orchestrator.guard\] numerics_mismatch"):
        cfg_with("--engine.on_mismatch", "stop")


def test_fast_numerics_promise_nothing_so_nothing_is_said(tmp_path, ckpt, parted_bits):  # noqa: F811
    cfg = cfg_with("--orchestrator.steps", "2", "--engine.numerics", "fast")
    summary = loop.run_rl(cfg, tmp_path, ckpt, progress=False)
    assert summary.steps == 2 and summary.numerics["mismatched_steps"] == 0
    assert records(tmp_path, "guard") == []
