"""Reward as a weighted sum of named reward functions.

    rubric = Rubric([(tests_pass, 1.0), (few_turns, 0.1)])
    score = await rubric.score(task, env)      # RubricScore(total=1.07, parts={...})

Each function takes ``(task, state)`` — the episode's task and its environment object — and
returns a float; it may be ``async``. Keeping the parts separate lets metrics show which term
moved, and lets a cheating detector look at one term alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RewardFn = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class RubricScore:
    total: float
    parts: dict[str, float]
    """Unweighted value of each function, by its name."""


class Rubric:
    def __init__(self, terms: list[tuple[RewardFn, float]]):
        if not terms:
            raise ValueError("a Rubric needs at least one (function, weight) term")
        names = [fn.__name__ for fn, _ in terms]
        if len(set(names)) != len(names):
            raise ValueError(f"reward functions must have distinct names, got {names}")
        self.terms = list(terms)

    async def score(self, task: Any, state: Any) -> RubricScore:
        parts: dict[str, float] = {}
        total = 0.0
        for fn, weight in self.terms:
            value = fn(task, state)
            if inspect.isawaitable(value):
                value = await value
            parts[fn.__name__] = float(value)
            total += weight * float(value)
        return RubricScore(total, parts)
