"""The "requests" family as a single-turn, instruct-only environment.

reset(task) shows the plain-English request (a chat message); the model's one turn is its answer,
ending at the chat template's end of turn (``stop = []``); step grades the answer's first fenced
code block (else its whole text) with funcs' grader of a one-argument ``f`` against the hidden
tests, and ends the episode. It has no mid-training corpus: it measures what a pretrained chat
model can already do.
"""

from __future__ import annotations

from tidal.env.base import Environment, StepResult
from tidal.env.spec import EnvironmentSpec
from tidal.env.tools import run_blocking
from tidal.envs.funcs import grade_many
from tidal.envs.requests import tasks
from tidal.envs.requests.config import RequestsConfig
from tidal.envs.requests.tasks import Task


class RequestsEnvironment(Environment):
    def __init__(self, sandbox):
        self.sandbox = sandbox
        self.stop: list[str] = []  # a chat answer ends at the template's end of turn
        self.task: Task | None = None

    async def reset(self, task: Task) -> str:
        self.task = task
        return task.instruction

    async def step(self, action: str) -> StepResult:
        assert self.task is not None, "step() before reset()"
        [grade] = await run_blocking(grade_many, self.sandbox, [self.task], [action], "instruct")
        info = {"reason": grade.reason, "passed": grade.passed, "total": grade.total,
                "level": self.task.level}
        return StepResult("", grade.reward, True, info)

    async def end(self, reason: str) -> StepResult:
        return StepResult("", 0.0, True, {"reason": reason, "level": self.task.level})


def load_environment(sandbox=None, config: RequestsConfig | None = None) -> EnvironmentSpec:
    """``config``: the validated ``env.args`` (None = the defaults)."""
    cfg = config or RequestsConfig()
    return EnvironmentSpec(
        name="requests",
        make=lambda: RequestsEnvironment(sandbox),
        sample_tasks=lambda n, seed, heldout: tasks.sample_tasks(cfg, n, seed, heldout),
        corpus_version=tasks.GENERATOR_VERSION,
    )
