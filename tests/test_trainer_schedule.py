"""The RL learning-rate schedule (tidal.trainer.schedule) and the loop's default decay length."""

import math

import pytest

from tidal.orchestrator.planning import with_decay
from tidal.trainer.config import TrainerConfig
from tidal.trainer.schedule import lr_at


def test_warm_up_ramps_linearly_to_lr():
    cfg = TrainerConfig(lr=1e-3, warmup_steps=4, lr_schedule="constant")
    assert [lr_at(cfg, v) for v in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_decay_ends_at_min_ratio_and_stays(kind):
    cfg = TrainerConfig(lr=1e-3, warmup_steps=2, lr_schedule=kind, decay_steps=10, min_lr_ratio=0.1)
    lrs = [lr_at(cfg, v) for v in range(20)]
    assert lrs[2] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:]))  # never rises after warm-up
    assert lrs[12] == pytest.approx(1e-4) and lrs[19] == pytest.approx(1e-4)
    middle = 1e-4 + 0.9e-3 * (0.5 * (1 + math.cos(math.pi * 0.5)) if kind == "cosine" else 0.5)
    assert lrs[7] == pytest.approx(middle)


def test_zero_decay_steps_keeps_lr_and_the_loop_fills_in_the_run_length():
    cfg = TrainerConfig(lr=1e-3, warmup_steps=5, lr_schedule="cosine")
    assert lr_at(cfg, 100) == pytest.approx(1e-3)
    filled = with_decay(cfg, steps=105)
    assert filled.decay_steps == 100
    assert lr_at(filled, 105) == pytest.approx(1e-4)
    assert with_decay(TrainerConfig(decay_steps=7), steps=500).decay_steps == 7


def test_trainer_lr_scale_multiplies_the_schedule_and_is_saved():
    import torch

    from tidal.trainer.trainer import Trainer

    model = torch.nn.Linear(2, 2)
    model.config = type("C", (), {"is_moe": False})()
    cfg = TrainerConfig(lr=1e-3, warmup_steps=0, lr_schedule="constant")
    t = Trainer(model, cfg)
    t.lr_scale = 0.25
    assert t.lr_at(3) == pytest.approx(2.5e-4)
    state = t.state_dict()
    fresh = Trainer(model, cfg)
    fresh.load_state_dict(state)
    assert fresh.lr_scale == 0.25
