"""The long-horizon environment "ledger": read many small files, then write f from what they said.

The task family, its expert and its demonstrations live in ``tidal.families.ledger``; this
module is the tool environment the harness drives. Two tools:

    next_file()          the next file of the repository ("no more files" after the last)
    submit(code: str)    f's statements on one line ("x*=5;x+=7"); graded by the
                         hidden tests in the sandbox; ends the episode

The head (shown in every context window, so kept short: the model is byte-level) is the tools'
call forms and the task sentence.
"""

from __future__ import annotations

from typing import Any

from tidal.env import (OBS_CLOSE, OBS_OPEN, Rubric, RubricScore, ToolEnvironment,
                       run_blocking)
from tidal.families.funcs import Grade, grade_many
from tidal.families.ledger import tasks as family
from tidal.families.ledger.tasks import LedgerTask
from tidal.harness import SUMMARY_CLOSE, SUMMARY_OPEN

NO_MORE_FILES = "no more files"
PARTIAL_CREDIT = 0.5
"""Weight of steps_right: partial credit for the steps carried right (success is every hidden
test passing, ``solved``, whatever this term adds)."""


def file_observation(task: LedgerTask, index: int) -> str:
    """What next_file shows for file ``index``: its name and text (no position: that would put
    digits in every observation, see tidal.families.ledger.tasks)."""
    return f"{family.file_name(index)}\n{task.files[index]}"


class LedgerEnvironment(ToolEnvironment):
    system_prompt = ""
    tool_style = "signature"

    def __init__(self, sandbox, rubric: Rubric):
        super().__init__(rubric)
        self.sandbox = sandbox
        self.cursor = 0
        self.submitted: str | None = None
        self.grade: Grade | None = None
        """The hidden tests' verdict on the submission (set by the rubric's tests_pass)."""

    async def setup(self, task: LedgerTask) -> str:
        self.cursor = 0
        self.submitted = None
        return task.prompt.rstrip("\n")

    def tools(self):
        return [self.next_file, self.submit]

    def head(self, task_text: str) -> str:
        """``next_file() submit(code: string)`` and the task: about 60 tokens, paid in every one
        of an episode's dozen-plus context windows (the generic listing costs 90)."""
        assert self.toolset is not None
        return " ".join(t.call_form() for t in self.toolset.tools.values()) + f"\n{task_text}\n"

    def next_file(self) -> str:
        """next file"""
        if self.cursor >= len(self.task.files):
            return NO_MORE_FILES
        text = file_observation(self.task, self.cursor)
        self.cursor += 1
        return text

    def submit(self, code: str) -> str:
        """f's code"""
        self.submitted = code
        self.finish()
        return "submitted"

    def check_summary(self, context: str, summary: str) -> float | None:
        """The summary against the facts its context showed (``read_context``): the steps of the
        summary carried into it (believed as written), then the steps of the files shown since,
        in order (``tasks.summary_score``: 1 = all of them right, nothing added). A mistake is
        thus charged once, to the summary that made it, not again to each later summary that
        copies it faithfully (those the episode's reward already judges)."""
        return family.summary_score(summary, family.recall(*read_context(context)))

    def reason(self, score: RubricScore) -> str:
        return self.grade.reason if self.grade is not None else "done"


def read_context(context: str) -> tuple[str | None, list[str]]:
    """The summary carried into ``context`` (None if none) and the observations shown after it."""
    summary = None
    start = context.rfind(SUMMARY_OPEN)
    if start >= 0:
        end = context.find(SUMMARY_CLOSE, start)
        summary = context[start + len(SUMMARY_OPEN): end if end >= 0 else None]
        context = context[end if end >= 0 else len(context):]
    return summary, [block.split(OBS_CLOSE)[0] for block in context.split(OBS_OPEN)[1:]]


def steps_right(task: LedgerTask, env: "LedgerEnvironment") -> float:
    """Partial credit: the fraction of f's steps the submission has right, in place. Weighted
    0.5 beside tests_pass, so a full success scores >= 1 and anything less < 1: GRPO gets a
    signal from carrying one step of two before any episode passes every test."""
    submitted = family.parse_code(env.submitted or "")
    return sum(a == b for a, b in zip(submitted, task.spec)) / len(task.spec)


def make_tests_pass(sandbox):
    """The rubric's main term: 1.0 when the submitted body passes every hidden test of f."""

    async def tests_pass(task: LedgerTask, env: LedgerEnvironment) -> float:
        body = family.body_text(env.submitted or "")
        [env.grade] = await run_blocking(grade_many, sandbox, [task.function_task()], [body])
        return env.grade.reward

    return tests_pass


def solved(reward: float, info: dict[str, Any]) -> bool:
    """Success: every hidden test passed (the partial credit term never makes an episode solved)."""
    return info.get("reward/tests_pass") == 1.0
