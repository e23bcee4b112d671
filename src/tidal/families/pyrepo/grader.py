"""Hidden and visible grading of a pyrepo episode, in fresh sandboxes the agent never touched.

After the episode the grading files are built from scratch (tidal.env.sealed.grading_files):
the task's pristine files, the agent's final ``calc/*.py`` (nothing else it wrote: no
``conftest.py``, ``pytest.ini``, ``sitecustomize.py``, no edited test) and the hidden tests.
They become a fresh TaskImage carrying the pytest env, and each verdict runs in its own fresh
rollout over it: hidden/ and tests/ (the *pristine* visible tests, not the agent's copy). A
third run, in a sandbox with the pristine files and the agent's calc/*.py but no hidden test,
prints f's outputs on the hidden inputs for the host to compare (``run_outputs``). The reward
is the hidden pytest verdict and the outputs together (``Grading.hidden_pass``). The verdict program (VERDICT_PROGRAM) reads a fresh nonce from stdin before importing
anything of the agent's, runs ``pytest.main`` (no cache, ``--noconftest``) with a plugin that
counts the test reports, and its ``pytest_sessionfinish`` hook prints one line
``<nonce> pass|fail <passed> <total>``. The host passes it iff the word is ``pass`` and
``passed == total ==`` the number of cases the task has (so a run that collected fewer tests,
skipped some or died before the line fails).

Threat model (honest, as tidal.env.sealed's): the agent's ``calc/*.py`` is imported into the
grading process itself, after pytest and the counting plugin. So its code can still

  - exit early (``os._exit``, ``sys.exit`` at import or in f): no stamped line, a fail;
  - patch pytest's internals, the plugin's counters or its report objects (gc, frames,
    ``sys.modules``), or find the nonce in the verdict program's memory and print a forged
    ``pass`` line: the nonce stops only blind forgery;
  - read the hidden test file (it is in the grading workspace) and special-case its inputs:
    that alone no longer pays, because the reward also needs f's outputs on the hidden inputs
    from a third sandbox that holds no hidden test (``run_outputs``: sealed grading's outputs
    mode, the answers compared on the host);
  - return an object whose ``__eq__`` is always true: the hidden tests check ``type(got) is
    int``, the visible ones do not.

None of that reaches the reward by accident: each needs code in calc/*.py that the tamper
detector (tidal.integrity: early exits, runner patches, reading hidden or grader files,
frames / gc access, hard-coded outputs, always-true ``__eq__``) reads in the final diff, and
edits to the protected test are hash-checked (``tampered``) and never reach grading. The
grading runs' own traces are not the agent's episode and are not in its evidence, so what the
code does *only* at grading time (say, reading hidden/ then) is caught from the code in the
diff (grader_access, hardcoded_output.reads_tests), not from a trace; what it does whenever
it runs also shows in the agent's own run_tests traces. The sandbox keeps the code from the
host, the network and other runs as always.
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass
from typing import Any

from tidal.env import NONCE_PREAMBLE, grading_slots, parse_verdict
from tidal.env.sealed import (
    SealedVerdict,
    grade_sealed,
    grading_files,
    int_outputs_program,
)
from tidal.families.pyrepo.tasks import HIDDEN_FILE, VISIBLE_FILE, RepoTask
from tidal.sandbox import PythonEnv, TaskImage

VERDICT_MAIN = "tidal_verdict.py"
"""Where the verdict program is written in the grading workspace (no task file may use it)."""
PYTEST_ARGS = ("-p", "no:cacheprovider", "--noconftest", "-q", "--tb=no")

VERDICT_PROGRAM = NONCE_PREAMBLE + """\
sys.dont_write_bytecode = True
import pytest


class _Count:
    def __init__(self, nonce):
        self.nonce, self.passed, self.failed, self.total = nonce, 0, 0, 0

    def pytest_collection_finish(self, session):
        self.total = len(session.items)

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed += 1
        elif report.when == "call" and report.passed:
            self.passed += 1

    def pytest_sessionfinish(self, session, exitstatus):
        ok = (exitstatus == 0 and self.failed == 0 and self.total > 0
              and self.passed == self.total)
        print("", flush=True)  # pytest's progress line has no newline yet
        print(self.nonce, "pass" if ok else "fail", self.passed, self.total, flush=True)


pytest.main([*{args!r}, {target!r}], plugins=[_Count(_nonce)])
"""
"""Runs pytest on ``target`` and prints ``<nonce> pass|fail <passed> <total>``."""


@dataclass(frozen=True)
class PytestVerdict:
    """One verdict run: ``passed`` iff every expected test passed (module docstring).

    reason: "pass", "fail", "no_result" (no stamped line) or the sandbox's kill reason."""

    passed: bool
    reason: str
    tests_passed: int
    total: int
    trace: Any = None


@dataclass(frozen=True)
class Grading:
    hidden: PytestVerdict
    visible: PytestVerdict
    outputs: SealedVerdict
    """f's outputs on the hidden inputs, compared on the host (sealed grading's outputs mode)
    in a sandbox without the hidden tests."""

    @property
    def hidden_pass(self) -> bool:
        """The reward's verdict: the hidden pytest tests pass AND f's outputs on their inputs,
        computed where no answer is, match."""
        return self.hidden.passed and self.outputs.passed


def verdict_program(target: str) -> str:
    return VERDICT_PROGRAM.format(args=list(PYTEST_ARGS), target=target)


def read_verdict(result, nonce: str, expected: int) -> PytestVerdict:
    trace = getattr(result, "trace", None)
    if result.killed_reason:
        return PytestVerdict(False, result.killed_reason, 0, expected, trace)
    line = parse_verdict(result.stdout, nonce)
    if line is None or len(line[1]) != 2 or not all(f.isdigit() for f in line[1]):
        return PytestVerdict(False, "no_result", 0, expected, trace)
    word, (passed, total) = line[0], (int(f) for f in line[1])
    ok = word == "pass" and passed == total == expected
    return PytestVerdict(ok, "pass" if ok else "fail", passed, expected, trace)


def run_verdict(sandbox, image: TaskImage, target: str, expected: int) -> PytestVerdict:
    """The verdict program on ``target`` in a fresh rollout over ``image`` (one grading slot)."""
    nonce = secrets.token_hex(8)
    with grading_slots(sandbox), sandbox.rollout(image) as rollout:
        result = rollout.run_python(verdict_program(target), stdin=nonce + "\n",
                                    main=VERDICT_MAIN)
    return read_verdict(result, nonce, expected)


def grade_repo(sandbox, task: RepoTask, final_files: dict[str, str],
               python_env: PythonEnv) -> Grading:
    """Hidden and visible verdicts on the grading files of ``final_files`` (blocking)."""
    files = grading_files(task.sealed(), final_files)
    if VERDICT_MAIN in files:
        raise ValueError(f"the task uses {VERDICT_MAIN!r}, where the verdict program goes")
    with TaskImage.from_files(files, python_env=python_env,
                              protected=(HIDDEN_FILE, VISIBLE_FILE)) as image:
        hidden = run_verdict(sandbox, image, "hidden", len(task.hidden))
        visible = run_verdict(sandbox, image, "tests", len(task.visible))
    return Grading(hidden, visible, run_outputs(sandbox, task, final_files))


def run_outputs(sandbox, task: RepoTask, final_files: dict[str, str]) -> SealedVerdict:
    """f on the hidden inputs in a fresh sandbox holding the pristine files and the agent's
    calc/*.py but no hidden test: the answers stay on the host (tidal.env.sealed)."""
    sealed = dataclasses.replace(task.sealed(), hidden={},
                                 expected=tuple(repr(y) for _, y in task.hidden))
    program = int_outputs_program("calc.ops", "f", [x for x, _ in task.hidden])
    return grade_sealed(sandbox, sealed, final_files, program=program)
