"""Grade generated code: run it against the task's hidden tests inside the sandbox.

The program that runs is a small harness with the candidate source embedded as a string. The
harness reads a fresh random nonce from stdin *before* the candidate runs and prints it with the
verdict, so a candidate that prints a fake verdict (or exits early) earns nothing. Everything the
candidate can do wrong — a syntax error, an exception, an infinite loop, a fork bomb, a memory
hog, a flood of output, a network attempt — ends as reward 0 with a recorded reason.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from tidal.envs.funcs.tasks import Task

HARNESS = """\
import sys
_nonce = sys.stdin.readline().strip()
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


def candidate_source(task: Task, completion: str) -> str:
    return task.prompt + completion


def harness_program(task: Task, completion: str) -> str:
    return HARNESS.format(src=candidate_source(task, completion), tests=list(task.tests))


def parse_verdict(stdout: str, nonce: str, total: int) -> tuple[str, int]:
    for line in reversed(stdout.splitlines()):
        parts = line.split()
        if len(parts) >= 4 and parts[0] == nonce:
            return parts[1], int(parts[2])
    return "no_result", 0


def grade_many(sandbox, tasks: list[Task], completions: list[str]) -> list[Grade]:
    """Grade each (task, completion) pair in its own sandbox run; never raises for bad code."""
    nonces = [secrets.token_hex(8) for _ in tasks]
    jobs = [(harness_program(t, c), n + "\n") for t, c, n in zip(tasks, completions, nonces)]
    results = sandbox.run_many(jobs)
    grades = []
    for task, nonce, res in zip(tasks, nonces, results):
        total = len(task.tests)
        if res.killed_reason:
            grades.append(Grade(0.0, res.killed_reason, 0, total, res.wall_s))
            continue
        reason, passed = parse_verdict(res.stdout, nonce, total)
        reward = 1.0 if reason == "pass" else 0.0
        grades.append(Grade(reward, reason, passed, total, res.wall_s))
    return grades
