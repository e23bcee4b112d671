"""Grade a funcs-shaped candidate: ``f`` of one argument, checked on hidden ``(x, y)`` pairs.

The program is a small checker with the candidate source embedded as a string, run through
tidal.env.grading (nonce-stamped verdict, a grading slot per run, never raises for bad code):
a syntax error, an exception, an infinite loop, a fork bomb, a memory hog, a flood of output or
a network attempt all end as reward 0 with a recorded reason.

The checker holds the whole candidate and its hidden tests, so equal programs are graded once
(``env.sandbox.share_verdicts``; tidal.env.grading.VerdictMemo says why and what it costs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tidal.env.grading import NONCE_PREAMBLE, run_graded_many
from tidal.families.funcs.tasks import Task

CHECKER = NONCE_PREAMBLE + """\
_src = {src!r}
_tests = {tests!r}
try:
    _code = compile(_src, "solution.py", "exec")
except (SyntaxError, ValueError) as e:
    print(_nonce, "syntax_error", 0, len(_tests), flush=True)
    raise SystemExit(0)
_ns = {{}}
try:
    exec(_code, _ns)
    _f = _ns["f"]
    _passed = sum(1 for _x, _y in _tests if _f(_x) == _y)
except Exception as e:
    print(_nonce, "runtime_error", 0, len(_tests), type(e).__name__, flush=True)
    raise SystemExit(0)
print(_nonce, "pass" if _passed == len(_tests) else "wrong_answer", _passed, len(_tests), flush=True)
"""


@dataclass
class Grade:
    """Outcome of one candidate: reward in [0, 1] (1 = every hidden test passed)."""

    reward: float
    reason: str
    passed: int
    total: int
    wall_s: float


FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)
"""A fenced code block: the opening fence (with any language tag) to the closing one, or to the
end of the text when the answer was cut before it closed."""


def extract_code(answer: str) -> str:
    """A chat answer's program: its first fenced code block, else the whole answer. Code written
    before the first fence (``def f(x): ...`` then a closing fence and prose, the opening fence
    left out) is the program: the text after that fence is the explanation."""
    m = FENCE.search(answer)
    if m is None:
        return answer
    before = answer[: m.start()]
    return before if "def " in before else m[1]


def candidate_source(task: Task, completion: str, style: str = "code") -> str:
    """The program to run: the prompt's ``def f(x):`` and the body the model wrote ("code"),
    or the code of a chat answer ("instruct"), which must define ``f`` itself."""
    if style == "instruct":
        return extract_code(completion)
    return task.prompt + completion


def checker_program(task: Task, completion: str, style: str = "code") -> str:
    return CHECKER.format(src=candidate_source(task, completion, style), tests=list(task.tests))


def grade_many(sandbox, tasks: list[Task], completions: list[str],
               style: str = "code") -> list[Grade]:
    """Grade each (task, completion) pair in the sandbox, each distinct program once (see the
    module docstring); never raises for bad code. ``style``: FuncsConfig.prompt_style."""
    programs = [checker_program(t, c, style) for t, c in zip(tasks, completions)]
    verdicts = run_graded_many(sandbox, programs, share=sandbox.cfg.share_verdicts)
    grades = []
    for task, verdict in zip(tasks, verdicts):
        passed = int(verdict.fields[0]) if verdict.fields else 0
        reward = 1.0 if verdict.reason == "pass" else 0.0
        grades.append(Grade(reward, verdict.reason, passed, len(task.tests), verdict.wall_s))
    return grades


def reward_of(grade: Grade, partial_credit: float = 0.0) -> float:
    """An episode's reward: 1 when every hidden test passed, else ``partial_credit`` times the
    fraction passed (FuncsConfig.partial_credit)."""
    if grade.reward >= 1.0 or not grade.total:
        return grade.reward
    return partial_credit * grade.passed / grade.total
