"""The canary's decision: keep serving a share of traffic, promote, or roll back.

The test is the mixture sequential probability ratio test (stats.msprt: Johari et al. 2017,
normal mixture N(0, tau^2) over the difference in rates, plug-in variance), which stays valid
however often it is looked at, so the decision is re-taken after every feedback event:

    accept rate      accepted or edited, or a scalar > 0, over the canary's / incumbent's events
    guard rates      invalid_tool_call, empty and question, each over the same events

    nothing is decided before each side has min_test_events (the plug-in variance is
    meaningless on a handful), then:
    rollback  at once when any mSPRT is significant (Lambda >= 1 / alpha) in the bad direction:
              a lower accept rate, or a higher guard rate
    promote   from min_events on: when the accept rate is significantly higher (and nothing
              is worse), or when nothing is significantly worse and no point estimate
              is worse either (accept rate >= incumbent's, every guard rate <= incumbent's)
    at max_events: decided on the point estimates alone (promote iff none is worse)
    continue  otherwise
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tidal.online.config import CanaryConfig
from tidal.online.records import FeedbackEvent
from tidal.online.reward import RewardFunction
from tidal.online.stats import msprt

GUARDS = ("invalid_tool_call", "empty", "question")

LAMBDA_CAP = 1e300
"""Lambda as recorded (JSON has no infinity); the decision uses the uncapped value."""

Outcome = tuple[str, float | None, str]
"""(signal, value, behaviour) of one feedback event, as the store returns them."""


@dataclass
class CanaryDecision:
    action: str
    """"continue" | "promote" | "rollback"."""
    reason: str
    stats: dict[str, Any]
    """Per metric: candidate and incumbent rates, Lambda, diff, significant; and the counts."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def is_accept(signal: str, value: float | None) -> bool:
    """Accepted, edited then kept, or a positive scalar."""
    return signal in ("accepted", "edited") or (signal == "scalar" and (value or 0.0) > 0)


def canary_decision(cand: list[Outcome], inc: list[Outcome], cfg: CanaryConfig,
                    reward: RewardFunction) -> CanaryDecision:
    """The decision of the module docs; ``reward`` validates every outcome's signal (a bad one
    raises) and gives the mean reward per side, recorded beside the test."""
    stats = {"events": len(cand), "incumbent_events": len(inc),
             "reward_mean": _mean_reward(cand, reward),
             "incumbent_reward_mean": _mean_reward(inc, reward)}
    tests = {"accept_rate": _test([is_accept(s, v) for s, v, _ in cand],
                                  [is_accept(s, v) for s, v, _ in inc], cfg, higher_is_bad=False)}
    for g in GUARDS:
        tests[g] = _test([b == g for *_, b in cand], [b == g for *_, b in inc], cfg,
                         higher_is_bad=True)
    stats["tests"] = tests
    if len(cand) < cfg.min_test_events or len(inc) < cfg.min_test_events:
        return CanaryDecision("continue", f"fewer than {cfg.min_test_events} events on a side",
                              stats)
    worse = [n for n, t in tests.items() if t["significant"] and t["worse"]]
    if worse:
        return CanaryDecision("rollback", f"significantly worse: {', '.join(worse)}", stats)
    if not cand or not inc:
        return CanaryDecision("continue", "no events on one side yet", stats)
    acc = tests["accept_rate"]
    if (acc["significant"] and not acc["worse"] and len(cand) >= cfg.min_events
            and not any(t["worse"] for t in tests.values())):
        return CanaryDecision("promote", "accept rate significantly higher", stats)
    point_worse = [n for n, t in tests.items() if t["worse"]]
    if len(cand) >= cfg.max_events:
        if point_worse:
            return CanaryDecision("rollback", f"max_events reached; point estimates worse: "
                                  f"{', '.join(point_worse)}", stats)
        return CanaryDecision("promote", "max_events reached; no point estimate worse", stats)
    if len(cand) >= cfg.min_events and not point_worse:
        return CanaryDecision("promote", "min_events reached; not worse", stats)
    return CanaryDecision("continue", f"{len(cand)} of {cfg.min_events}..{cfg.max_events} "
                          "events; undecided", stats)


def _test(c: list[bool], i: list[bool], cfg: CanaryConfig, higher_is_bad: bool) -> dict[str, Any]:
    lam, diff = msprt(sum(c), len(c), sum(i), len(i), cfg.tau)
    return {"candidate": sum(c) / len(c) if c else 0.0, "incumbent": sum(i) / len(i) if i else 0.0,
            "lambda": min(lam, LAMBDA_CAP), "diff": diff, "threshold": 1 / cfg.alpha,
            "significant": lam >= 1 / cfg.alpha,
            "worse": (diff > 0) if higher_is_bad else (diff < 0)}


def _mean_reward(outcomes: list[Outcome], reward: RewardFunction) -> float:
    rs = [reward.reward(FeedbackEvent("", s, value=v), b) for s, v, b in outcomes]
    return sum(rs) / len(rs) if rs else 0.0
