"""Example environment "fixit": one line of calc.py does not do what its comment says; fix it.

A complete environment (docs/environments.md walks through it): its settings, tasks, a tool, a
rubric, what counts as success and ``load_environment``; its mid-training corpus is in
corpus.py. It builds only on public names (tidal.env, and the funcs family's task generator and
grader). The context's head is calc.py with line numbers; the model's turn rewrites the code
of one line, which runs the hidden tests; the episode ends when they all pass:

    calc.py
    1 def f(x):
    2  x = x + 3 # add 3
    3  x = x // 2 # multiply by 2
    4  return x
    <call>{"fix":{"line":3,"code":"x = x * 2"}}</call>
    <obs>6/6 pass</obs>

Sized for the default recipe (a byte-level model, a 256-token window, 96 tokens kept free for
each turn): the head is 40-100 tokens and a fix with its answer ~70, so there is room for a
second try after a wrong fix when the head is short.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tidal.env import (Rubric, RubricScore, StepResult, ToolEnvironment,
                       ToolError, run_blocking)
from tidal.families import funcs
from tidal.families.funcs import Grade

HELDOUT_BUCKETS = 10


class FixitConfig(BaseModel):
    """fixit's settings: ``env.args`` when ``env.name = "fixit"``."""

    model_config = ConfigDict(extra="forbid")
    min_level: int = Field(1, ge=1)
    """Fewest steps in f (lines between ``def`` and ``return``; one of them is wrong)."""
    max_level: int = Field(2, ge=1)
    """Most steps in f."""
    num_tests: int = Field(6, ge=1)
    """Hidden tests each fix runs calc.py against."""
    fix_slip_rate: float = Field(0.5, ge=0.0, lt=1.0)
    """Mid-training corpus realism: the chance that the expert's first fix is itself wrong
    (see corpus.py); 0 = the expert always fixes the line."""

    @model_validator(mode="after")
    def _check(self) -> "FixitConfig":
        if self.min_level > self.max_level:
            raise ValueError(f"min_level ({self.min_level}) exceeds max_level ({self.max_level})")
        return self


@dataclass(frozen=True)
class FixitTask:
    task_id: str
    prompt: str
    files: dict[str, str]
    tests: funcs.Task
    """A funcs task with an empty prompt: grading it runs calc.py against its hidden tests."""

    @property
    def level(self) -> int:
        return self.tests.level


def code_of(name: str, c: int) -> str:
    """The code of one step, unindented: ``x = x + 3``."""
    return funcs.OP_BY_NAME[name][2].format(c=c)


def phrase_of(name: str, c: int) -> str:
    """What one step does, in words: ``add 3``."""
    return funcs.OP_BY_NAME[name][1].format(c=c)


def source_of(spec, written=None) -> str:
    """calc.py: each step of ``spec`` commented with what it should do, its code that of
    ``written`` (default: ``spec``). One-space indents: every character is a token."""
    lines = [f" {code_of(*w)} # {phrase_of(*s)}\n" for s, w in zip(spec, written or spec)]
    return "def f(x):\n" + "".join(lines) + " return x\n"


def confused(rng: random.Random, name: str, c: int) -> tuple[str, int]:
    """A slip that confuses the operator (``*`` for ``//``) and keeps the constant, if the
    confused operator takes one: so the right constant is on the broken line twice, in its code
    and its comment (a byte-level model this small copies a digit unreliably)."""
    while True:
        step = funcs.slip(rng, name, c)
        if step[0] != name:
            return step


def make_task(spec, rng: random.Random, num_tests: int) -> FixitTask | None:
    """calc.py implements ``spec`` except for one line, whose code has the wrong operator (its
    comment is right); None when the slip changes nothing the hidden tests see."""
    tests = dataclasses.replace(funcs.make_task(spec, rng, num_examples=0, num_tests=num_tests),
                                prompt="")
    broken = rng.randrange(len(spec))
    written = tuple(confused(rng, *op) if i == broken else op for i, op in enumerate(spec))
    if all(funcs.evaluate(written, x) == y for x, y in tests.tests):
        return None
    return FixitTask(f"fixit-{tests.task_id}", "calc.py", {"calc.py": source_of(spec, written)},
                     tests)


def sample_tasks(cfg: FixitConfig, n: int, seed: int, heldout: bool) -> list[FixitTask]:
    """Deterministic in the arguments; a spec is held out iff the funcs family holds it out."""
    rng = random.Random(f"fixit-{seed}-{heldout}")
    tasks: list[FixitTask] = []
    while len(tasks) < n:
        spec = funcs.random_spec(rng, rng.randint(cfg.min_level, cfg.max_level))
        if funcs.is_heldout(spec, HELDOUT_BUCKETS) == heldout:
            task = make_task(spec, rng, cfg.num_tests)
            if task is not None:
                tasks.append(task)
    return tasks


def numbered(text: str) -> str:
    """``1 def f(x):`` ...: each line with its number, as fix() counts them."""
    return "".join(f"{i} {line}\n" for i, line in enumerate(text.splitlines(), 1))


Grader = Callable[[FixitTask, str], Grade]
"""(task, calc.py's text) -> the hidden tests' verdict."""


class Fixit(ToolEnvironment):
    tool_style = "signature"

    def __init__(self, grade: Grader, rubric: Rubric):
        super().__init__(rubric)
        self.grade = grade
        self.source = ""
        """calc.py as it stands."""
        self.verdict: Grade | None = None
        """The hidden tests' verdict on calc.py after the latest fix (None before one)."""

    async def setup(self, task: FixitTask) -> str:
        self.source = task.files["calc.py"]
        return task.prompt

    def head(self, task_text: str) -> str:
        """The file's name and calc.py, numbered. The tool's form is what the corpus teaches
        (the generic listing would cost 60 tokens of a 256-token window)."""
        return f"{task_text}\n{numbered(self.source)}"

    def tools(self):
        return [self.fix]

    def fix(self, line: int, code: str) -> str:
        """Replace the code of line ``line`` of calc.py (its indent and comment are kept); runs
        the tests."""
        lines = self.source.splitlines()
        if not 1 <= line <= len(lines):
            raise ToolError(f"calc.py has lines 1-{len(lines)}")
        if "\n" in code:
            raise ToolError("code is one line")
        old, comment = lines[line - 1].partition(" #")[::2]
        indent = old[: len(old) - len(old.lstrip())]
        lines[line - 1] = indent + code.strip() + (f" #{comment}" if comment else "")
        self.source = "\n".join(lines) + "\n"
        self.verdict = self.grade(self.task, self.source)
        if self.verdict.passed == self.verdict.total:
            self.finish()
        return report(self.verdict)

    async def end(self, reason: str) -> StepResult:
        """Out of room or turns before the tests passed: calc.py as it stands is scored."""
        if self.verdict is None:
            self.verdict = await run_blocking(self.grade, self.task, self.source)
        score = await self.rubric.score(self.task, self)
        info: dict[str, Any] = {f"reward/{k}": v for k, v in score.parts.items()}
        return StepResult("", score.total, True, self.report({**info, "reason": reason}))

    def reason(self, score: RubricScore) -> str:
        return self.verdict.reason  # "pass" (the tests pass: the episode ends)


def report(grade: Grade) -> str:
    """``2/6 pass``, and why when calc.py did not run (``0/6 pass (syntax_error)``)."""
    why = "" if grade.reason in ("pass", "wrong_answer") else f" ({grade.reason})"
    return f"{grade.passed}/{grade.total} pass{why}"


def tests_pass(task: FixitTask, env: Fixit) -> float:
    """1 if calc.py passes every hidden test at the end. No partial credit: the broken file
    already passes some tests, and RL on the fraction learned to leave the line as it was."""
    return 1.0 if env.verdict.passed == env.verdict.total else 0.0


def clean_calls(task: FixitTask, env: Fixit) -> float:
    """1 if the tests pass and no tool call of the episode was malformed. Only a solved episode
    earns it: a failed one scores 0 however it failed, so a GRPO group that all failed carries
    no signal (the bonus alone would be normalised into a full-size advantage)."""
    return 1.0 if env.tool_errors == 0 and tests_pass(task, env) == 1.0 else 0.0


RUBRIC = Rubric([(tests_pass, 1.0), (clean_calls, 0.1)])


def all_tests_pass(reward: float, info: dict[str, Any]) -> bool:
    """Success is every hidden test passing: the reward (up to 1.1) also has clean_calls' bonus."""
    return info.get("reward/tests_pass") == 1.0
