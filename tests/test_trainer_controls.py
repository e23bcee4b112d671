"""The loss's controls against collapse: dual-clip, KL to the initial model, the entropy bonus
and its floor (tidal.trainer.grpo.ppo_clip_loss, tidal.trainer.trainer.Trainer)."""

import pytest
import torch
from test_trainer import on_policy_batch, tiny_model

from tidal.trainer.config import TrainerConfig
from tidal.trainer.grpo import ppo_clip_loss
from tidal.trainer.trainer import Trainer


def test_dual_clip_bounds_a_negative_advantage_tokens_loss():
    new = torch.log(torch.tensor([[5.0, 0.5]]))
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    loss, _ = ppo_clip_loss(new, old, torch.tensor([-1.0]), mask, 0.2, 0.28, "token_mean")
    assert loss.item() == pytest.approx((5.0 + 0.8) / 2)  # ratio 5 unclipped for A < 0
    loss, _ = ppo_clip_loss(new, old, torch.tensor([-1.0]), mask, 0.2, 0.28, "token_mean", dual_clip=3.0)
    assert loss.item() == pytest.approx((3.0 + 0.8) / 2)  # capped at c * |A|
    pos, _ = ppo_clip_loss(new, old, torch.tensor([1.0]), mask, 0.2, 0.28, "token_mean", dual_clip=3.0)
    ref, _ = ppo_clip_loss(new, old, torch.tensor([1.0]), mask, 0.2, 0.28, "token_mean")
    assert pos.item() == ref.item()  # A > 0 untouched


def test_kl_to_a_reference_is_k3_of_reference_over_current():
    new = torch.log(torch.tensor([[0.5]]))
    ref = torch.log(torch.tensor([[0.25]]))
    _, st = ppo_clip_loss(new, new, torch.tensor([0.0]), torch.ones(1, 1), 0.2, 0.28, "token_mean",
                          ref_lp=ref)
    assert st.kl == pytest.approx(0.5 - 1 - torch.log(torch.tensor(0.5)).item())


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="dual_clip"):
        TrainerConfig(dual_clip=0.5)


def _step(cfg, seed=0):
    model = tiny_model()
    trainer = Trainer(model, cfg, numerics="fast")
    stats = trainer.step(on_policy_batch(model, seed=seed))
    return trainer, stats


def test_kl_to_initial_is_zero_on_the_first_step_and_holds_the_policy_back():
    base = dict(lr=3e-2, warmup_steps=0)
    free, _ = _step(TrainerConfig(**base))
    held, st = _step(TrainerConfig(**base, kl_coef=50.0, kl_reference="initial"))
    assert st.kl == pytest.approx(0.0, abs=1e-6)  # the reference is the model before the update
    batch = on_policy_batch(tiny_model())
    for t in (free, held):
        t.step(batch)
    start = tiny_model().state_dict()
    moved = lambda t: sum((p - start[n]).norm().item() for n, p in t.model.state_dict().items())
    assert moved(held) < moved(free)
    assert held.reference is not None and free.reference is None


def test_entropy_bonus_raises_entropy_and_the_floor_turns_it_off():
    base = dict(lr=1e-2, warmup_steps=0)
    plain, st_plain = _step(TrainerConfig(**base))
    bonus, st_bonus = _step(TrainerConfig(**base, entropy_coef=1.0))
    assert st_bonus.entropy == pytest.approx(st_plain.entropy)  # same forward before the update
    assert st_bonus.loss < st_plain.loss  # the bonus is subtracted
    _, st_floor = _step(TrainerConfig(**base, entropy_coef=1.0, entropy_floor=1e-3))
    assert st_floor.loss == pytest.approx(st_plain.loss)  # entropy above the floor: no bonus
    batch = on_policy_batch(tiny_model(), seed=1)
    after = {name: t.step(batch).entropy for name, t in (("plain", plain), ("bonus", bonus))}
    assert after["bonus"] > after["plain"]
