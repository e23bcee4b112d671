"""Feedback -> reward: the configured value of the user's signal, and the behaviour penalties.

An invalid tool call, an empty answer and a question instead of an action each get their own
configured reward (in place of the signal, or added to it: ``behaviour_overrides_signal``), so
none of them is a free escape from a rejection: the two reward hacks seen in production.

The version names the reward function exactly: ``cfg.version`` plus a short hash of every value,
so changing a value without renaming still makes a new version (recorded with every reward).
"""

from __future__ import annotations

import hashlib
import json
import math

from tidal.errors import UserError
from tidal.online.config import RewardConfig
from tidal.online.records import SIGNALS, FeedbackEvent

PENALISED = ("invalid_tool_call", "empty", "question")
"""Behaviours (tidal.online.behaviour) whose configured reward replaces (or adds to) the signal."""
BEHAVIOURS = ("action", "question", "empty", "invalid_tool_call", "other")


class BadFeedback(UserError):
    """A feedback event or behaviour the reward function cannot score (says what is wrong)."""


class RewardFunction:
    """``reward(event, behaviour)`` per RewardConfig; ``version`` names the exact values."""

    def __init__(self, cfg: RewardConfig):
        self.cfg = cfg
        values = cfg.model_dump(exclude={"version"})
        digest = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:8]
        self.version = f"{cfg.version}-{digest}"

    def signal_value(self, event: FeedbackEvent) -> float:
        """The configured value of the event's signal alone (no behaviour term)."""
        signal, value = event.signal, event.value
        if signal not in SIGNALS:
            raise BadFeedback(f"unknown feedback signal {signal!r}; use one of {list(SIGNALS)}")
        if signal != "scalar":
            if value is not None:
                raise BadFeedback(f"feedback signal {signal!r} takes no value (got {value!r}); "
                                  "only signal 'scalar' carries one")
            return float(getattr(self.cfg, signal))
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadFeedback(f"a scalar feedback signal needs a numeric value in [-1, 1], "
                              f"got {value!r}")
        if not (math.isfinite(value) and -1.0 <= value <= 1.0):
            raise BadFeedback(f"a scalar feedback value must be in [-1, 1], got {value}")
        return self.cfg.scalar_scale * float(value)

    def reward(self, event: FeedbackEvent, behaviour: str) -> float:
        """The reward of one response: its signal's value, with the behaviour's penalty in its
        place (``behaviour_overrides_signal``) or added to it, for the PENALISED behaviours."""
        if behaviour not in BEHAVIOURS:
            raise BadFeedback(f"unknown behaviour {behaviour!r}; use one of {list(BEHAVIOURS)}")
        signal = self.signal_value(event)
        if behaviour not in PENALISED:
            return signal
        penalty = float(getattr(self.cfg, behaviour))
        return penalty if self.cfg.behaviour_overrides_signal else signal + penalty
