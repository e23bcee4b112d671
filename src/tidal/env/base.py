"""The environment interface: what the harness drives and what a user implements.

An ``Environment`` is one episode's world. The harness calls ``reset(task)`` once, then
``step(action)`` with each model turn's text until ``done`` or a budget runs out (then
``end(reason)``), and finally ``close()``. Everything is ``async`` so many episodes share one
event loop (and the engine's continuous batching) while tools wait on sandboxes.

A user brings an environment as a module exposing ``load_environment(**kwargs) ->
EnvironmentSpec`` (see ``tidal.env.spec`` and ``tidal.env.registry``). Most environments subclass
``tidal.env.tool_env.ToolEnvironment``, which turns typed Python functions into tools.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepResult:
    """What one ``step`` returns.

    observation: text shown to the model next (the harness tokenizes it and masks it out of the
        loss); may be empty.
    reward: reward earned by this step; the episode's reward is the sum over its steps.
    done: the episode is over (the task was submitted, solved or failed for good).
    info: facts for metrics; numbers go into ``Trajectory.info``, ``info["reason"]`` (a string)
        becomes ``Trajectory.reason``.
    """

    observation: str
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Environment(ABC):
    """One episode's world. A fresh instance per episode (``EnvironmentSpec.make``)."""

    stop: list[str] | None = None
    """Stop strings that end a model turn; None = the engine's default (``engine.stop``)."""

    @abstractmethod
    async def reset(self, task: Any) -> str:
        """Start the episode on ``task``; return the first observation (system text and task).
        This text is the context's fixed head: it is kept across self-summarization resets."""

    @abstractmethod
    async def step(self, action: str) -> StepResult:
        """Apply one model turn (its decoded text) and say what happened."""

    async def end(self, reason: str) -> StepResult:
        """The harness stops the episode before ``done`` (``reason``: "turn_budget",
        "token_budget" or "context"). Returns the final reward; override to give partial
        credit. Default: no reward."""
        return StepResult("", 0.0, True, {"reason": reason})

    def check_summary(self, context: str, summary: str) -> float | None:
        """The environment's own check of a self-summary: how well ``summary`` (the text the model
        wrote, without the closing tag) carries the facts ``context`` (the decoded context it
        summarises, before the summary request) showed, a score in [0, 1] (1 = every fact, right).
        The harness asks only with ``harness.summary_reward = "check"`` and makes the score a dense
        reward of the summary's segment. None = no check (the default)."""
        return None

    def evidence(self):
        """What the episode left behind for integrity checking (``tidal.evidence.records.
        Evidence``: workspace before and after, actions, the sandbox trace, the grader's
        visible/hidden verdicts), or None when the environment keeps none. Called once after
        the episode ends, before ``close()``. Default: None."""
        return None

    async def close(self) -> None:
        """Release what the episode holds (sandbox workspaces, files). Called exactly once."""


async def final_answer(env: Environment, answer: str) -> StepResult:
    """``env.step(answer)`` as an episode's last word: a multi-step family that would go on is
    ended with reason "answered", its final reward added (an outside harness's answer, an
    agent's submission)."""
    step = await env.step(answer)
    if step.done:
        return step
    ended = await env.end("answered")
    return StepResult("", step.reward + ended.reward, True, {**step.info, **ended.info})
