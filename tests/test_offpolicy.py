"""Off-policy corrections (trainer/offpolicy.py) against hand-computed cases.

One row of three trained tokens with pi_prox = (0.5, 0.2, 0.9) and pi_behaviour = (0.25, 0.4,
0.3), so w = pi_prox / pi_behaviour = (2, 0.5, 3) exactly, geometric mean 3^(1/3) ~ 1.442; a
second row is on-policy (w = 1)."""

import math

import pytest
import torch

from tidal.trainer.config import OffPolicyConfig
from tidal.trainer.grpo import ppo_clip_loss
from tidal.trainer.offpolicy import behaviour_weights

PROX = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.7, 0.7, 0.7]]))
BEHAVIOUR = torch.log(torch.tensor([[0.25, 0.4, 0.3], [0.7, 0.7, 0.7]]))
MASK = torch.ones(2, 3)


def weights(**cfg):
    return behaviour_weights(PROX, BEHAVIOUR, MASK, OffPolicyConfig(**cfg))


def test_decoupled_weights_are_the_ratio():
    rho, st = weights(kind="decoupled")
    torch.testing.assert_close(rho, torch.tensor([[2.0, 0.5, 3.0], [1, 1, 1]]))
    assert st.is_masked_tokens == 0 and st.is_truncated_tokens == 0


def test_truncated_is_caps_the_ratio():
    rho, st = weights(kind="truncated_is", is_cap=2.5)
    torch.testing.assert_close(rho, torch.tensor([[2.0, 0.5, 2.5], [1, 1, 1]]))
    assert st.is_truncated_tokens == 1 and st.is_masked_tokens == 0
    assert st.is_weight_mean == pytest.approx((2 + 0.5 + 2.5 + 3) / 6)


def test_masked_is_zeroes_tokens_outside_the_band():
    rho, st = weights(kind="masked_is", mask_low=0.6, mask_high=2.5)
    torch.testing.assert_close(rho, torch.tensor([[2.0, 0.0, 0.0], [1, 1, 1]]))
    assert st.is_masked_tokens == 2


@pytest.mark.parametrize("band, kept_first_row", [((0.9, 1.1), False), ((1.4, 1.5), True)])
def test_geo_mask_keeps_or_drops_whole_rows_by_the_geometric_mean(band, kept_first_row):
    rho, st = weights(kind="geo_mask", geo_low=band[0], geo_high=band[1], is_cap=2.5)
    first = [2.0, 0.5, 2.5] if kept_first_row else [0.0, 0.0, 0.0]
    second = [1.0, 1.0, 1.0] if band[0] <= 1.0 <= band[1] else [0.0, 0.0, 0.0]
    torch.testing.assert_close(rho, torch.tensor([first, second]))
    assert st.is_masked_tokens == (0 if kept_first_row else 3) + (0 if second[0] else 3)


def test_padding_is_never_weighted_or_counted():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    rho, st = behaviour_weights(PROX, BEHAVIOUR, mask, OffPolicyConfig(kind="masked_is", mask_low=0.6))
    torch.testing.assert_close(rho, torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    assert st.is_masked_tokens == 1


def test_decoupled_loss_ratio_is_against_the_proximal_policy_weighted_by_rho():
    """new = prox (one step per batch): ratio 1, so pg = -rho * A per token and the gradient on
    each token's logprob is -rho * A / tokens; k3 stays against the behaviour policy."""
    rho, _ = weights(kind="truncated_is", is_cap=2.5)
    new = PROX[:1].clone().requires_grad_(True)
    loss, st = ppo_clip_loss(new, BEHAVIOUR[:1], torch.tensor([1.5]), MASK[:1], 0.2, 0.28,
                             "token_mean", prox_lp=new.detach(), token_weight=rho[:1])
    assert loss.item() == pytest.approx(-1.5 * (2 + 0.5 + 2.5) / 3)
    loss.backward()
    torch.testing.assert_close(new.grad, torch.tensor([[-1.5 * 2 / 3, -1.5 * 0.5 / 3, -1.5 * 2.5 / 3]]))
    k3 = [w - 1 - math.log(w) for w in (2.0, 0.5, 3.0)]
    assert st.kl == pytest.approx(sum(k3) / 3, rel=1e-5)
    assert st.ratio_mean == pytest.approx(1.0)


def test_bands_must_be_ordered():
    with pytest.raises(ValueError, match="mask_low"):
        OffPolicyConfig(mask_low=2.0, mask_high=1.0)
