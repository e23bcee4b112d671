"""GRPO pure functions, checked against numbers worked out by hand."""

import math

import pytest
import torch

from tidal.trainer.grpo import (
    NO_REPLAY,
    collate,
    group_advantages,
    loss_weights,
    ppo_clip_loss,
    token_logprobs,
)
from tidal.trajectory import Segment, Trajectory

PAD = 256


def seg(prompt, completion, logprobs=None, mask=None, experts=None):
    n = len(completion)
    return Segment(
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=logprobs if logprobs is not None else [-0.5] * n,
        versions=[0] * n,
        loss_mask=mask if mask is not None else [1] * n,
        experts=experts,
    )

# ---------------------------------------------------------------- group_advantages


def test_group_advantages_centres_and_scales_per_group():
    # group 0: rewards 1, 0 -> mean 0.5, unbiased std sqrt(0.5) = 0.7071
    # group 1: rewards 2, 4, 6 -> mean 4, unbiased std 2
    adv = group_advantages([1.0, 0.0, 2.0, 4.0, 6.0], [0, 0, 1, 1, 1], normalize_std=True, eps=0.0)
    s = math.sqrt(0.5)
    torch.testing.assert_close(adv, torch.tensor([0.5 / s, -0.5 / s, -1.0, 0.0, 1.0]))


def test_group_advantages_without_std_is_mean_centred():
    adv = group_advantages([1.0, 0.0, 2.0, 4.0, 6.0], [0, 0, 1, 1, 1], normalize_std=False)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -2.0, 0.0, 2.0]))


def test_group_with_equal_rewards_gets_exactly_zero():
    adv = group_advantages([1.0, 1.0, 1.0, 0.0, 1.0], [7, 7, 7, 3, 3], normalize_std=True)
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert adv[3] < 0 < adv[4]


def test_group_ids_need_not_be_contiguous():
    adv = group_advantages([0.0, 5.0, 1.0, 5.0], [1, 2, 1, 2], normalize_std=False)
    assert adv.tolist() == [-0.5, 0.0, 0.5, 0.0]


# ---------------------------------------------------------------- collate


def test_collate_aligns_targets_mask_and_logprobs():
    # prompt [10, 11], completion [20, 21, 22] where 21 was written by the environment.
    t = Trajectory("t", 0, [seg([10, 11], [20, 21, 22], [-1.0, 0.0, -3.0], [1, 0, 1])], reward=1.0)
    b = collate([t], PAD, advantages=torch.tensor([0.7]))
    assert b.input_ids.tolist() == [[10, 11, 20, 21]]
    assert b.targets.tolist() == [[11, 20, 21, 22]]
    assert b.loss_mask.tolist() == [[0, 1, 0, 1]]
    assert b.old_logprobs.tolist() == [[0.0, -1.0, 0.0, -3.0]]
    assert b.advantages.tolist() == pytest.approx([0.7])
    assert b.experts is None


def test_collate_pads_rows_and_gives_every_segment_its_trajectory_advantage():
    t0 = Trajectory("a", 0, [seg([1], [2, 3]), seg([4, 5, 6], [7])], reward=1.0)
    t1 = Trajectory("a", 0, [seg([1], [9])], reward=0.0)
    b = collate([t0, t1], PAD, normalize_std=False)
    assert b.input_ids.tolist() == [[1, 2, PAD], [4, 5, 6], [1, PAD, PAD]]
    assert b.targets.tolist() == [[2, 3, PAD], [5, 6, 7], [9, PAD, PAD]]
    assert b.loss_mask.tolist() == [[1, 1, 0], [0, 0, 1], [1, 0, 0]]
    assert b.advantages.tolist() == [0.5, 0.5, -0.5]
    assert b.row_traj.tolist() == [0, 0, 1]
    assert b.lengths.tolist() == [2, 3, 1]
    sub = b.rows(2, 3)
    assert sub.input_ids.tolist() == [[1]] and sub.loss_mask.tolist() == [[1]]


def test_collate_with_empty_prompt_drops_the_unpredictable_first_token():
    t = Trajectory("t", 0, [seg([], [5, 6, 7], [-1.0, -2.0, -3.0], experts=[[[0]], [[1]], [[2]]])])
    b = collate([t], PAD)
    assert b.input_ids.tolist() == [[5, 6]] and b.targets.tolist() == [[6, 7]]
    assert b.loss_mask.tolist() == [[1, 1]] and b.old_logprobs.tolist() == [[-2.0, -3.0]]
    assert b.experts[0, :, 0, 0].tolist() == [1, 2]


def test_collate_places_experts_at_the_position_that_sampled_each_token():
    # 2 layers, top-1. Completion token j's experts sit at position P + j - 1.
    ex = [[[3], [4]], [[5], [6]]]
    t = Trajectory("t", 0, [seg([10, 11], [20, 21], experts=ex)])
    b = collate([t], PAD)
    assert b.experts.shape == (1, 3, 2, 1)
    assert b.experts[0, :, :, 0].tolist() == [[NO_REPLAY, NO_REPLAY], [3, 4], [5, 6]]


def test_collate_rejects_mixed_dense_and_moe_segments():
    t = Trajectory("t", 0, [seg([1], [2], experts=[[[0]]]), seg([1], [2])])
    with pytest.raises(ValueError, match="experts"):
        collate([t], PAD)


# ---------------------------------------------------------------- token_logprobs


def test_token_logprobs_is_log_softmax_over_temperature():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # softmax = [1/4, 3/4]
    assert token_logprobs(logits, torch.tensor([[1]]), 1.0).item() == pytest.approx(math.log(0.75))
    # T = 0.5 -> logits [0, 2 ln 3] -> softmax [1/10, 9/10]
    assert token_logprobs(logits, torch.tensor([[0]]), 0.5).item() == pytest.approx(math.log(0.1))
    # greedy (T = 0) is scored at T = 1
    assert token_logprobs(logits, torch.tensor([[1]]), 0.0).item() == pytest.approx(math.log(0.75))


# ---------------------------------------------------------------- ppo_clip_loss


def test_ppo_loss_equals_minus_advantage_on_policy():
    lp = torch.tensor([[-1.0, -2.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, st = ppo_clip_loss(lp, lp, torch.tensor([2.0]), mask, 0.2, 0.28, "token_mean")
    assert loss.item() == pytest.approx(-2.0)
    assert st.clip_frac == 0.0 and st.kl == pytest.approx(0.0)
    assert st.ratio_mean == pytest.approx(1.0) and st.tokens == 2


def test_ppo_loss_clips_by_hand():
    old = torch.zeros(1, 4)
    # ratios 1.5, 0.5, 1.1, 2.0 (last token masked)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1, 2.0]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # A = +1: per-token min(r, clip(r, 0.8, 1.28)) = 1.28, 0.5, 1.1 -> loss = -(2.88)/3
    loss, st = ppo_clip_loss(new, old, torch.tensor([1.0]), mask, 0.2, 0.28, "token_mean")
    assert loss.item() == pytest.approx(-2.88 / 3, abs=1e-6)
    assert st.clip_frac == pytest.approx(1 / 3)  # only r=1.5 with A>0 is clipped
    assert st.ratio_max == pytest.approx(1.5)  # the masked 2.0 does not count
    # A = -1: per-token -min(-r, -clip(r)) = max(r, clip(r)) = 1.5, 0.8, 1.1 -> loss = 3.4/3
    loss, st = ppo_clip_loss(new, old, torch.tensor([-1.0]), mask, 0.2, 0.28, "token_mean")
    assert loss.item() == pytest.approx(3.4 / 3, abs=1e-6)
    assert st.clip_frac == pytest.approx(1 / 3)  # only r=0.5 with A<0 is clipped


def test_ppo_k3_kl_by_hand_and_penalty():
    old = torch.zeros(1, 1)
    new = torch.log(torch.tensor([[2.0]]))
    k3 = 2.0 - 1.0 - math.log(2.0)
    loss, st = ppo_clip_loss(new, old, torch.tensor([0.0]), torch.ones(1, 1), 0.2, 0.28, "token_mean", kl_coef=0.5)
    assert st.kl == pytest.approx(k3)
    assert loss.item() == pytest.approx(0.5 * k3)


def test_ppo_gradient_vanishes_where_clipped():
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_()
    loss, _ = ppo_clip_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), 0.2, 0.28, "token_mean")
    loss.backward()
    # d/dlp of -r/2 = -r/2 for the unclipped token; 0 for the clipped one
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, -0.55]]))


def test_seq_mean_weights_each_sequence_equally():
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    per_tok = torch.tensor([[1.0, 1.0, 1.0, 1.0], [5.0, 9.0, 9.0, 9.0], [7.0, 7.0, 7.0, 7.0]])
    w = loss_weights(mask, "seq_mean")
    # rows with tokens: 2 -> (mean 1 + mean 5) / 2 = 3; token_mean: (4 + 5) / 5 = 1.8
    assert (w * per_tok).sum().item() == pytest.approx(3.0)
    assert (loss_weights(mask, "token_mean") * per_tok).sum().item() == pytest.approx(1.8)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_micro_batch_losses_add_up_to_the_full_batch_loss(agg):
    g = torch.Generator().manual_seed(0)
    new, old = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g) * 0.1
    adv = torch.randn(6, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    full, _ = ppo_clip_loss(new, old, adv, mask, 0.2, 0.28, agg, kl_coef=0.1)
    units = mask.sum().item() if agg == "token_mean" else (mask.sum(1) > 0).sum().item()
    parts = sum(
        ppo_clip_loss(new[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], 0.2, 0.28, agg,
                      kl_coef=0.1, num_units=units)[0]
        for i in range(0, 6, 2)
    )
    assert parts.item() == pytest.approx(full.item(), abs=1e-6)
