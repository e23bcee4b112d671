"""The deterministic guarantee acted on at run time (orchestrator.numerics_watch): a step whose
trained tokens are not the trainer's bits warns once and is counted, or stops RL."""

from __future__ import annotations

import pytest
import torch
from test_orchestrator import cfg_with, ckpt, records  # noqa: F401  (the module-scoped checkpoint)

from tidal.numerics import metrics
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


def test_a_broken_promise_warns_once_and_is_counted(tmp_path, ckpt, parted_bits, capsys):  # noqa: F811
    summary = loop.run_rl(cfg_with("--orchestrator.steps", "3"), tmp_path, ckpt, progress=False)
    err = capsys.readouterr().err
    assert err.count("engine.numerics = 'deterministic' but") == 1 and "RL goes on" in err
    compared = [s for s in records(tmp_path, "step") if s.get("train/mismatch_tokens")]
    assert summary.steps == 3 and compared and summary.numerics["mismatched_steps"] == len(compared)
    assert summary.numerics["mismatch"].startswith("step 1: engine.numerics = 'deterministic' but")
    [event] = records(tmp_path, "guard")
    assert event["detector"] == "numerics_mismatch" and event["action"] == "log" and event["step"] == 1
    assert 0 < event["evidence"]["bitwise_equal_fraction"] < 1


def test_on_mismatch_stop_ends_rl_after_the_step(tmp_path, ckpt, parted_bits, capsys):  # noqa: F811
    cfg = cfg_with("--orchestrator.steps", "5", "--engine.on_mismatch", "stop")
    summary = loop.run_rl(cfg, tmp_path, ckpt, progress=False)
    assert summary.steps == 1 and "RL stops after this step" in capsys.readouterr().err
    assert [e["label"] for e in records(tmp_path, "eval")][-1] == "after"  # still evaluated
    assert [e["action"] for e in records(tmp_path, "guard")] == ["stop"]


def test_fast_numerics_promise_nothing_so_nothing_is_said(tmp_path, ckpt, parted_bits):  # noqa: F811
    cfg = cfg_with("--orchestrator.steps", "2", "--engine.numerics", "fast", "--engine.on_mismatch", "stop")
    summary = loop.run_rl(cfg, tmp_path, ckpt, progress=False)
    assert summary.steps == 2 and summary.numerics["mismatched_steps"] == 0
    assert records(tmp_path, "guard") == []
