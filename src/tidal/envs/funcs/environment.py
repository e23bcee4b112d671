"""The built-in "funcs" family as a single-turn environment (the default ``env.name``).

reset(task) shows the prompt (``# Task: ...`` and ``def f(x):``); the model's one turn is the
function body (ending at the engine's stop string); step grades it in the sandbox against the
hidden tests and ends the episode. This is exactly what the single-turn rollout did before
environments existed, so the default recipe trains the same way.
"""

from __future__ import annotations

import threading

from tidal.env.base import Environment, StepResult
from tidal.env.spec import EnvironmentSpec
from tidal.env.tools import run_blocking
from tidal.envs.funcs import tasks as family
from tidal.envs.funcs.tasks import Task
from tidal.envs.funcs.grader import grade_many


class FuncsEnvironment(Environment):
    def __init__(self, sandbox, slots: threading.BoundedSemaphore):
        self.sandbox = sandbox
        self.slots = slots
        self.task: Task | None = None

    async def reset(self, task: Task) -> str:
        self.task = task
        return task.prompt

    async def step(self, action: str) -> StepResult:
        assert self.task is not None, "step() before reset()"
        grade = await run_blocking(self._grade, action)
        info = {"reason": grade.reason, "passed": grade.passed, "total": grade.total,
                "level": self.task.level}
        return StepResult("", grade.reward, True, info)

    def _grade(self, completion: str):
        # At most sandbox.concurrency gradings at once across every episode (as run_many did).
        with self.slots:
            return grade_many(self.sandbox, [self.task], [completion])[0]


def load_environment(sandbox, config) -> EnvironmentSpec:
    """``config``: the run's EnvConfig (levels, test counts, corpus realism)."""
    slots = threading.BoundedSemaphore(sandbox.cfg.concurrency if sandbox is not None else 1)
    return EnvironmentSpec(
        name="funcs",
        make=lambda: FuncsEnvironment(sandbox, slots),
        sample_tasks=lambda n, seed, heldout: family.sample_tasks(config, n, seed, heldout),
        build_corpus=lambda n_docs, seed: family.build_corpus(config, n_docs, seed),
        corpus_version=family.GENERATOR_VERSION,
    )
