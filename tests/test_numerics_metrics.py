"""Mismatch metrics against hand-computed cases."""

import math

import pytest
import torch

from tidal.numerics import mismatch_metrics, routing_flip_metrics


def test_identical_logprobs_are_bitwise_equal_with_zero_kl():
    a = torch.tensor([-0.5, -1.25, -3.0])
    m = mismatch_metrics(a, a.clone())
    assert m["bitwise_equal_fraction"] == 1.0
    assert m["kl_k3"] == 0.0 and m["max_abs_logprob_diff"] == 0.0


def test_one_ulp_apart_is_not_bitwise_equal():
    a = torch.tensor([-0.5, -1.0])
    b = a.clone()
    b[1] = torch.nextafter(b[1], torch.tensor(0.0))
    m = mismatch_metrics(a, b)
    assert m["bitwise_equal_fraction"] == 0.5
    assert 0 < m["max_abs_logprob_diff"] < 1e-6


def test_k3_matches_hand_computation():
    a = torch.tensor([-1.0, -2.0])
    b = torch.tensor([-1.5, -2.0])
    # token 0: log r = b - a = -0.5; k3 = (e^-0.5 - 1) + 0.5
    expected = ((math.exp(-0.5) - 1) + 0.5) / 2
    m = mismatch_metrics(a, b)
    assert m["kl_k3"] == pytest.approx(expected, rel=1e-12)
    assert m["mean_abs_logprob_diff"] == pytest.approx(0.25)


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="differ in length"):
        mismatch_metrics(torch.zeros(3), torch.zeros(2))


def test_routing_flips_ignore_order_within_topk():
    engine = torch.tensor([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])  # 2 tokens, 2 layers, k=2
    trainer = torch.tensor([[[1, 0], [2, 3]], [[4, 5], [6, 1]]])
    m = routing_flip_metrics(engine, trainer)
    assert m["flip_rate_per_layer"] == [0.0, 0.5]
    assert m["flip_rate"] == 0.25
    assert m["tokens_with_flip_fraction"] == 0.5
