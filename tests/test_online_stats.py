"""The gate's and the canary's tests against hand-computed values."""

import math

import pytest

from tidal.online.stats import (
    binomial_upper_tail,
    mcnemar_one_sided,
    median,
    msprt,
    proportion_worse,
)


def test_binomial_tail_by_hand():
    assert binomial_upper_tail(3, 4) == pytest.approx(5 / 16)
    assert binomial_upper_tail(0, 4) == 1.0 and binomial_upper_tail(5, 4) == 0.0
    assert binomial_upper_tail(2, 3, 0.25) == pytest.approx(3 * 0.25**2 * 0.75 + 0.25**3)


def test_mcnemar_counts_only_discordant_pairs():
    # 5 tasks the incumbent solved and the candidate lost, none the other way: p = 1/32.
    cand = [False] * 5 + [True] * 10 + [False] * 3
    inc = [True] * 5 + [True] * 10 + [False] * 3
    assert mcnemar_one_sided(cand, inc) == (pytest.approx(1 / 32), 5, 0)
    # b = 3, c = 1: P(X >= 3 | n = 4) = 5/16.
    p, b, c = mcnemar_one_sided([False, False, False, True], [True, True, True, False])
    assert (b, c) == (3, 1) and p == pytest.approx(5 / 16)
    assert mcnemar_one_sided([True, False], [True, False]) == (1.0, 0, 0)
    # A better candidate is never "significantly worse".
    assert mcnemar_one_sided(inc, cand)[0] == 1.0
    with pytest.raises(ValueError, match="same tasks"):
        mcnemar_one_sided([True], [True, False])


def test_fisher_exact_by_hand():
    assert proportion_worse(4, 4, 0, 4) == pytest.approx(1 / 70)  # the lady tasting tea
    assert proportion_worse(3, 3, 0, 3) == pytest.approx(1 / 20)
    # (C(3,2) C(5,2) + C(3,3) C(5,1)) / C(8,4) = 35/70
    assert proportion_worse(2, 4, 1, 4) == pytest.approx(0.5)
    assert proportion_worse(0, 4, 4, 4) == pytest.approx(1.0)
    assert proportion_worse(0, 0, 1, 4) == 1.0
    # Large counts stay finite and exact-ish: 20% vs 10% of 1000 each is far beyond chance.
    assert proportion_worse(200, 1000, 100, 1000) < 1e-8
    with pytest.raises(ValueError, match="0 <= bad <= n"):
        proportion_worse(5, 4, 0, 4)


def test_msprt_by_hand():
    # pc = 0.6, pi = 0.5, n = 100 each, tau = 0.1: V = 0.0049,
    # Lambda = sqrt(0.0049 / 0.0149) * exp(0.01 * 0.01 / (2 * 0.0049 * 0.0149)) = 1.13743
    lam, diff = msprt(60, 100, 50, 100, 0.1)
    assert diff == pytest.approx(0.1) and lam == pytest.approx(1.13743, abs=1e-4)
    assert msprt(0, 0, 5, 10, 0.1) == (1.0, 0.0)
    # No difference: Lambda < 1 (the mixture pays for the effects it did not see).
    assert msprt(50, 100, 50, 100, 0.1)[0] < 1.0
    # A big difference on many events is significant at alpha = 0.05 (Lambda >= 20).
    lam, diff = msprt(200, 400, 300, 400, 0.1)
    assert diff == pytest.approx(-0.25) and lam >= 20
    # All successes on one side and none on the other: still finite variance.
    lam, _ = msprt(40, 40, 0, 40, 0.1)
    assert math.isinf(lam) or lam > 1e6
    with pytest.raises(ValueError, match="tau"):
        msprt(1, 2, 1, 2, 0.0)


def test_median():
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 2.0, 3.0]) == 2.5
    with pytest.raises(ValueError):
        median([])
