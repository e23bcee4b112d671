"""The statistics of the promotion gate and the canary, as pure functions (no scipy).

    mcnemar_one_sided   paired: does the candidate solve fewer of the same held-out tasks?
    proportion_worse    is the candidate's rate of a bad behaviour higher? (Fisher's exact test)
    msprt               always-valid sequential test of a difference in two rates (the canary)

Every p-value is one-sided, computed exactly from binomial / hypergeometric terms in log space
(math.lgamma), so they hold for small counts and do not overflow for large ones.
"""

from __future__ import annotations

import math


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _log_sum_exp(terms: list[float]) -> float:
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def binomial_upper_tail(k: int, n: int, p: float = 0.5) -> float:
    """P(X >= k) for X ~ Binomial(n, p), 0 < p < 1 (1.0 for k <= 0, 0.0 for k > n)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    terms = [_log_comb(n, j) + j * math.log(p) + (n - j) * math.log1p(-p) for j in range(k, n + 1)]
    return min(1.0, math.exp(_log_sum_exp(terms)))


def mcnemar_one_sided(cand: list[bool], inc: list[bool]) -> tuple[float, int, int]:
    """Exact McNemar test, one-sided: H1 = the candidate solves fewer of the same tasks.

    cand[i], inc[i]: whether each version solved task i (same tasks, same seeds). Only the
    discordant pairs carry information: b = tasks the incumbent solved and the candidate did
    not, c = the reverse. Under H0 (no difference) b ~ Binomial(b + c, 1/2), so
    p = P(X >= b). Returns (p, b, c); p = 1 without any discordant pair."""
    if len(cand) != len(inc):
        raise ValueError(f"mcnemar_one_sided: {len(cand)} candidate results for {len(inc)} "
                         "incumbent results; score both on the same tasks")
    b = sum(1 for x, y in zip(cand, inc) if y and not x)
    c = sum(1 for x, y in zip(cand, inc) if x and not y)
    return binomial_upper_tail(b, b + c), b, c


def _check_counts(name: str, bad: int, n: int) -> None:
    if not (isinstance(bad, int) and isinstance(n, int) and 0 <= bad <= n):
        raise ValueError(f"proportion_worse: {name} needs 0 <= bad <= n (integers), got "
                         f"bad={bad!r}, n={n!r}")


def proportion_worse(bad_c: int, n_c: int, bad_i: int, n_i: int) -> float:
    """One-sided Fisher's exact test (always exact, whatever the counts): H1 = the candidate's
    rate of a bad behaviour (bad_c / n_c) is higher than the incumbent's (bad_i / n_i).

    Conditional on the margins, the candidate's count X is hypergeometric: N = n_c + n_i
    responses, K = bad_c + bad_i bad ones, n_c drawn; p = P(X >= bad_c)
    = sum_x C(K, x) C(N - K, n_c - x) / C(N, n_c). p = 1 when either side has no responses."""
    _check_counts("the candidate", bad_c, n_c)
    _check_counts("the incumbent", bad_i, n_i)
    if n_c == 0 or n_i == 0:
        return 1.0
    N, K = n_c + n_i, bad_c + bad_i
    top = min(K, n_c)
    log_total = _log_comb(N, n_c)
    terms = [_log_comb(K, x) + _log_comb(N - K, n_c - x) - log_total
             for x in range(bad_c, top + 1) if n_c - x <= N - K]
    return min(1.0, math.exp(_log_sum_exp(terms))) if terms else 0.0


def msprt(successes_c: int, n_c: int, successes_i: int, n_i: int,
          tau: float) -> tuple[float, float]:
    """Mixture sequential probability ratio test of a difference in two rates (Johari, Pekelis,
    Walsh 2017, "Always valid inference"), normal mixture with plug-in variance:

        diff   = p_c - p_i,          p_c = successes_c / n_c,  p_i = successes_i / n_i
        V      = p_c (1 - p_c) / n_c + p_i (1 - p_i) / n_i
        Lambda = sqrt(V / (V + tau^2)) * exp(diff^2 tau^2 / (2 V (V + tau^2)))

    H0: the rates are equal; the mixture over the effect is N(0, tau^2). Checked after every
    event, ``Lambda >= 1 / alpha`` is significant at level alpha however often one looks (the
    always-valid p-value is min(1, 1 / max Lambda so far)); the sign of diff says which side
    is better. For the variance only, each rate is kept within [1/(2n), 1 - 1/(2n)] so that V > 0
    when a side has seen all successes or none. Returns (Lambda, diff); (1.0, 0.0) while either
    side has no events."""
    if tau <= 0 or not math.isfinite(tau):
        raise ValueError(f"msprt: tau must be a finite number > 0, got {tau}")
    for name, s, n in (("candidate", successes_c, n_c), ("incumbent", successes_i, n_i)):
        if not (0 <= s <= n):
            raise ValueError(f"msprt: the {name} needs 0 <= successes <= n, got {s} of {n}")
    if n_c == 0 or n_i == 0:
        return 1.0, 0.0
    pc, pi = successes_c / n_c, successes_i / n_i
    diff = pc - pi
    V = _rate_variance(pc, n_c) + _rate_variance(pi, n_i)
    t2 = tau * tau
    log_lambda = 0.5 * math.log(V / (V + t2)) + diff * diff * t2 / (2 * V * (V + t2))
    return (math.exp(log_lambda) if log_lambda < 700 else math.inf), diff


def _rate_variance(p: float, n: int) -> float:
    q = min(max(p, 0.5 / n), 1 - 0.5 / n)
    return q * (1 - q) / n


def median(values: list[float]) -> float:
    """The median (mean of the middle two for an even count); raises on an empty list."""
    if not values:
        raise ValueError("median of no values")
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
