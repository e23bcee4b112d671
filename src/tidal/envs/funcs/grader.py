"""Grade a funcs-shaped candidate: ``f`` of one argument, checked on hidden ``(x, y)`` pairs.

The program is a small checker with the candidate source embedded as a string, run through
tidal.env.grading (nonce-stamped verdict, a grading slot per run, never raises for bad code):
a syntax error, an exception, an infinite loop, a fork bomb, a memory hog, a flood of output or
a network attempt all end as reward 0 with a recorded reason.

Identical programs are graded once (``VerdictMemo``; ``env.sandbox.share_verdicts``): a checker program holds the whole
candidate and its hidden tests, so two equal programs run the same code on the same inputs. RL
samples the same completion for a task many times over (28% of a funcs step's episodes at the
start of RL, more as the policy sharpens), and each grading is a sandbox start (~15-70 ms).
A candidate whose verdict is not a function of its text (it reads the clock or random numbers,
or ran into the time limit on a loaded machine) gives every identical copy the first run's
verdict: one draw of its randomness, shared by its copies.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass

from tidal.env.grading import NONCE_PREAMBLE, Verdict, run_graded_many
from tidal.envs.funcs.tasks import Task

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


def candidate_source(task: Task, completion: str) -> str:
    return task.prompt + completion


def checker_program(task: Task, completion: str) -> str:
    return CHECKER.format(src=candidate_source(task, completion), tests=list(task.tests))


MEMO_PROGRAMS = 4096
"""Verdicts a sandbox's memo keeps (least recently used dropped first); ~1 KB of program each."""


class VerdictMemo:
    """Verdicts of the programs graded through one sandbox, by program text, shared by every
    thread grading through it; a program already running is waited for, not started again."""

    def __init__(self, size: int = MEMO_PROGRAMS):
        self.size = size
        self.runs = 0
        """Programs actually run (the rest were answered from the memo)."""
        self._lock = threading.Lock()
        self._verdicts: OrderedDict[str, Future] = OrderedDict()

    def grade(self, sandbox, programs: list[str]) -> list[Verdict]:
        """The verdict of each program, running each distinct unknown one once (in parallel,
        through run_graded_many); results in program order."""
        futures, mine = [], {}
        with self._lock:
            for program in programs:
                future = self._verdicts.get(program)
                if future is None:
                    future = mine.setdefault(program, Future())
                    self._verdicts[program] = future
                self._verdicts.move_to_end(program)
                futures.append(future)
            while len(self._verdicts) > self.size:
                self._verdicts.popitem(last=False)
            self.runs += len(mine)
        if mine:
            try:
                for future, verdict in zip(mine.values(), run_graded_many(sandbox, list(mine))):
                    future.set_result(verdict)
            except BaseException as e:  # waiters must not hang; the next caller runs it again
                with self._lock:
                    for program, future in mine.items():
                        if self._verdicts.get(program) is future:
                            del self._verdicts[program]
                        if not future.done():
                            future.set_exception(e)
                raise
        return [f.result() for f in futures]


_memos: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_memos_lock = threading.Lock()


def verdict_memo(sandbox) -> VerdictMemo:
    """The one memo of ``sandbox`` (made on first use; it goes with the sandbox)."""
    with _memos_lock:
        if sandbox not in _memos:
            _memos[sandbox] = VerdictMemo()
        return _memos[sandbox]


def grade_many(sandbox, tasks: list[Task], completions: list[str]) -> list[Grade]:
    """Grade each (task, completion) pair in the sandbox, each distinct program once (see the
    module docstring); never raises for bad code."""
    programs = [checker_program(t, c) for t, c in zip(tasks, completions)]
    if sandbox.cfg.share_verdicts:
        verdicts = verdict_memo(sandbox).grade(sandbox, programs)
    else:
        verdicts = run_graded_many(sandbox, programs)
    grades = []
    for task, verdict in zip(tasks, verdicts):
        passed = int(verdict.fields[0]) if verdict.fields else 0
        reward = 1.0 if verdict.reason == "pass" else 0.0
        grades.append(Grade(reward, verdict.reason, passed, len(task.tests), verdict.wall_s))
    return grades
