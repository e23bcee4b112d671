"""The reward function: configured signal values, behaviour penalties, versions, bad signals."""

import pytest

from tidal.errors import UserError
from tidal.online.config import RewardConfig
from tidal.online.records import FeedbackEvent
from tidal.online.reward import RewardFunction


def ev(signal, value=None):
    return FeedbackEvent("cmpl-1", signal, value=value)


def test_signals_get_their_configured_values():
    rf = RewardFunction(RewardConfig(scalar_scale=0.5))
    assert rf.reward(ev("accepted"), "action") == 0.75
    assert rf.reward(ev("edited"), "action") == 0.25
    assert rf.reward(ev("rejected"), "other") == -0.25
    assert rf.reward(ev("dissatisfied"), "action") == -0.5
    assert rf.reward(ev("scalar", 0.8), "action") == pytest.approx(0.4)


@pytest.mark.parametrize("behaviour,penalty", [("invalid_tool_call", -1.0), ("empty", -0.5),
                                               ("question", -0.5)])
def test_hacks_are_never_a_free_escape(behaviour, penalty):
    rf = RewardFunction(RewardConfig())
    assert rf.reward(ev("accepted"), behaviour) == penalty  # in place of the user's accept
    added = RewardFunction(RewardConfig(behaviour_overrides_signal=False))
    assert added.reward(ev("accepted"), behaviour) == pytest.approx(0.75 + penalty)


def test_a_changed_value_is_a_new_version():
    a, b = RewardFunction(RewardConfig()), RewardFunction(RewardConfig())
    c = RewardFunction(RewardConfig(accepted=0.7))
    assert a.version == b.version and a.version.startswith("reward-v1-")
    assert c.version != a.version and c.version.startswith("reward-v1-")


@pytest.mark.parametrize("event,behaviour,words", [
    (ev("liked"), "action", "unknown feedback signal"),
    (ev("scalar"), "action", "numeric value"),
    (ev("scalar", 1.5), "action", "[-1, 1]"),
    (ev("scalar", float("nan")), "action", "[-1, 1]"),
    (ev("scalar", True), "action", "numeric value"),
    (ev("accepted", 0.5), "action", "takes no value"),
    (ev("accepted"), "shrug", "unknown behaviour"),
])
def test_bad_signals_raise_a_clear_error(event, behaviour, words):
    with pytest.raises(UserError, match=words.replace("[", r"\[").replace("]", r"\]")):
        RewardFunction(RewardConfig()).reward(event, behaviour)
