"""The built-in "funcs" family as a single-turn environment (the default ``env.name``).

reset(task) shows the prompt (``# Task: ...`` and ``def f(x):``); the model's one turn is the
function body (ending at the engine's stop string); step grades it in the sandbox against the
hidden tests and ends the episode. This is exactly what the single-turn rollout did before
environments existed, so the default recipe trains the same way. With ``prompt_style =
"instruct"`` the task is a plain-English chat message instead, and the answer (ending at the chat
template's end of turn) is graded from its fenced code block.
"""

from __future__ import annotations

from tidal.env.base import Environment, StepResult
from tidal.env.spec import EnvironmentSpec
from tidal.env.tools import run_blocking
from tidal.families.funcs import corpus, tasks
from tidal.families.funcs.config import FuncsConfig
from tidal.families.funcs.grader import grade_many, reward_of
from tidal.families.funcs.tasks import Task


class FuncsEnvironment(Environment):
    def __init__(self, sandbox, prompt_style: str = "code", partial_credit: float = 0.0):
        self.sandbox, self.prompt_style, self.partial_credit = sandbox, prompt_style, partial_credit
        self.task: Task | None = None
        if prompt_style == "instruct":
            self.stop = []  # a chat answer ends at the template's end of turn, not a blank line

    async def reset(self, task: Task) -> str:
        self.task = task
        return task.instruction if self.prompt_style == "instruct" else task.prompt

    async def step(self, action: str) -> StepResult:
        assert self.task is not None, "step() before reset()"
        [grade] = await run_blocking(grade_many, self.sandbox, [self.task], [action],
                                     self.prompt_style)
        info = {"reason": grade.reason, "passed": grade.passed, "total": grade.total,
                "level": self.task.level}
        return StepResult("", reward_of(grade, self.partial_credit), True, info)

    async def end(self, reason: str) -> StepResult:
        return StepResult("", 0.0, True, {"reason": reason, "level": self.task.level})


def load_environment(sandbox=None, config: FuncsConfig | None = None) -> EnvironmentSpec:
    """``config``: the validated ``env.args`` (None = the defaults)."""
    cfg = config or FuncsConfig()
    return EnvironmentSpec(
        name="funcs",
        make=lambda: FuncsEnvironment(sandbox, cfg.prompt_style, cfg.partial_credit),
        sample_tasks=lambda n, seed, heldout: tasks.sample_tasks(cfg, n, seed, heldout),
        build_corpus=lambda n_docs, seed: corpus.build_corpus(cfg, n_docs, seed),
        corpus_version=tasks.GENERATOR_VERSION,
    )
