"""ToolEnvironment: an Environment whose actions are tool calls and whose reward is a Rubric.

A subclass writes ``setup(task) -> task text``, the tools (typed methods with docstrings, listed
by ``tools()``) and calls ``self.finish()`` from the tool that ends the episode (say ``submit``).
Two optional hooks report on the episode for metrics: ``level()`` (the task's difficulty, for
pass rates by level) and ``reason(score)`` (why it scored what it did: "pass", "wrong_answer").
Every model turn goes through ``step``: parse the call, validate its arguments, run the tool,
answer with its output — or, for anything malformed, with what was wrong (``info["tool_error"]``
names the kind). A mistake costs the model a turn and tokens; it never ends the episode early and
never raises.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from tidal.env.base import Environment, StepResult
from tidal.env.rubric import Rubric, RubricScore
from tidal.env.toolcall import CALL_CLOSE, MalformedCall, parse_call
from tidal.env.tools import ToolSet, ToolStyle


class ToolEnvironment(Environment):
    system_prompt: str = "Call one tool per turn."
    """Shown first in the context, before the tool listing and the task."""
    tool_style: ToolStyle = "json"
    """How tools are listed: "json" (name, description, JSON schema) or "signature" (compact)."""
    max_call_chars: int = 4096
    """Longest JSON a tool call may carry, characters; longer calls are refused unparsed."""
    tool_timeout_s: float = 30.0
    """A tool running longer is abandoned and the model told so."""
    max_observation_chars: int = 2000
    """Tool output beyond this is cut (the harness also caps observation tokens)."""

    stop = [CALL_CLOSE]

    def __init__(self, rubric: Rubric):
        self.rubric = rubric
        self.task: Any = None
        self.done = False
        self.toolset: ToolSet | None = None
        self.turns = 0
        self.tool_errors = 0
        """Steps so far and how many were malformed (rubric functions may read both)."""

    @abstractmethod
    async def setup(self, task: Any) -> str:
        """Prepare the episode's state for ``task``; return the task text."""

    @abstractmethod
    def tools(self) -> list[Callable[..., Any]]:
        """This episode's tools (usually bound methods)."""

    def finish(self) -> None:
        """Called by a tool: the episode ends after this step and the rubric scores it."""
        self.done = True

    def level(self) -> int | None:
        """The task's difficulty level, reported as ``Trajectory.level`` (held-out pass@1 by
        level). Default: the task's ``level`` attribute if it has one, else None."""
        return getattr(self.task, "level", None)

    def reason(self, score: RubricScore) -> str:
        """Why the finished episode scored ``score``, reported as ``Trajectory.reason`` and
        counted in each step's and eval's ``reasons`` (say "pass", "wrong_answer",
        "syntax_error"). Default: "done". Episodes the harness cuts short keep its reason
        ("turn_budget", "token_budget", "context")."""
        return "done"

    def report(self, info: dict[str, Any]) -> dict[str, Any]:
        """``info`` with the episode's level added (when ``level()`` knows one)."""
        level = self.level()
        return info if level is None else {**info, "level": level}

    async def end(self, reason: str) -> StepResult:
        return StepResult("", 0.0, True, self.report({"reason": reason}))

    async def reset(self, task: Any) -> str:
        self.task, self.done = task, False
        text = await self.setup(task)
        self.toolset = ToolSet(self.tools())
        return self.head(text)

    def head(self, task_text: str) -> str:
        """The context's head, shown in every context window: system prompt, tool listing, task.
        Override to shorten it (a long-horizon environment pays for it once per window)."""
        return f"{self.system_prompt}\nTools:\n{self.toolset.render(self.tool_style)}\n{task_text}\n"

    async def step(self, action: str) -> StepResult:
        assert self.toolset is not None, "step() before reset()"
        self.turns += 1
        try:
            call = parse_call(action, self.max_call_chars)
            output = await self.toolset.run(call, self.tool_timeout_s)
        except MalformedCall as e:
            self.tool_errors += 1
            return StepResult(f"error ({e.kind}): {e}", info={"tool_error": e.kind})
        output = _cap(output, self.max_observation_chars)
        if not self.done:
            return StepResult(output)
        score = await self.rubric.score(self.task, self)
        info: dict[str, Any] = {f"reward/{k}": v for k, v in score.parts.items()}
        info["reason"] = self.reason(score)
        return StepResult(output, score.total, True, self.report(info))


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"...[{len(text) - limit} more characters]"
