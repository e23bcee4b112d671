"""The "pyrepo" tasks: a small repository whose tests fail, built from a funcs spec.

    calc/__init__.py
    calc/ops.py           def f(x): its docstring states the spec, its body is missing
                          (raise NotImplementedError) or wrong (one step slipped)
    tests/test_ops.py     visible pytest tests (num_visible cases), read-only in the workspace
    hidden/test_hidden.py hidden pytest tests (num_hidden cases on other inputs): only ever in
                          the grading sandbox, never in the agent's workspace

The agent may change ``calc/*.py`` (EDITABLE); grading takes nothing else from it. Hidden
inputs differ from the visible ones and at least one hidden answer differs from every visible
answer, so hard-coding the visible answers always fails the hidden tests. The hidden tests also
check that f returns an ``int``, so an object whose ``__eq__`` is always true fails them.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from tidal.env.sealed import SealedTask
from tidal.families import funcs
from tidal.families.pyrepo.config import PyrepoConfig

GENERATOR_VERSION = 1
"""Bump whenever the repository's files or the prompt change."""

INPUT_RANGE = (-30, 30)
OPS_FILE = "calc/ops.py"
INIT_FILE = "calc/__init__.py"
VISIBLE_FILE = "tests/test_ops.py"
HIDDEN_FILE = "hidden/test_hidden.py"
EDITABLE = ("calc/*.py",)
PROTECTED = (VISIBLE_FILE,)
MISSING_BODY = "    raise NotImplementedError\n"

INIT_TEXT = '"""calc: small integer functions."""\n'
VISIBLE_TEMPLATE = '''"""Tests of calc.ops.f."""

import pytest

from calc.ops import f


@pytest.mark.parametrize("x, expected", {cases})
def test_f(x, expected):
    assert f(x) == expected
'''
HIDDEN_TEMPLATE = '''"""Hidden tests of calc.ops.f: other inputs (graded after the episode)."""

import pytest

from calc.ops import f


@pytest.mark.parametrize("x, expected", {cases})
def test_f(x, expected):
    got = f(x)
    assert type(got) is int and got == expected
'''
PROMPT = ("The tests of this repository fail: make f in calc/ops.py do what its docstring says. "
          "tests/test_ops.py is read-only; hidden tests check f on other inputs after you "
          "submit().\nFiles: {files}")


def ops_text(spec, body: str) -> str:
    """calc/ops.py with the spec's description as f's docstring and ``body`` as its body."""
    return (f'"""Operations of the calc package."""\n\n\ndef f(x):\n'
            f'    """{funcs.describe(spec)}"""\n{body}')


def body_text(spec) -> str:
    """A body implementing ``spec`` (funcs' solution_text, one trailing newline)."""
    return funcs.solution_text(spec).rstrip("\n") + "\n"


@dataclass(frozen=True)
class RepoTask:
    """One repository task (module docstring)."""

    task_id: str
    level: int
    spec: tuple[tuple[str, int], ...]
    prompt: str
    files: dict[str, str]
    """The agent's workspace as the task gives it (relative path -> text)."""
    visible: tuple[tuple[int, int], ...]
    hidden: tuple[tuple[int, int], ...]
    broken: str
    """"missing" or "wrong": how f's body starts."""

    @property
    def hidden_files(self) -> dict[str, str]:
        return {HIDDEN_FILE: HIDDEN_TEMPLATE.format(cases=list(self.hidden))}

    @property
    def reference_solution(self) -> str:
        """calc/ops.py with an honest body."""
        return ops_text(self.spec, body_text(self.spec))

    def sealed(self) -> SealedTask:
        """How grading sees the task: pristine files, calc/*.py from the agent, hidden tests."""
        return SealedTask(pristine=dict(self.files), editable=EDITABLE, protected=PROTECTED,
                          hidden=self.hidden_files)


def task_id(spec) -> str:
    return f"pyrepo-{hashlib.sha256(funcs.canonical(spec).encode()).hexdigest()[:12]}"


def starting_body(spec, rng: random.Random, wrong_rate: float, visible) -> tuple[str, str]:
    """(kind, body): a slipped implementation failing a visible case, else a missing one."""
    if rng.random() < wrong_rate:
        i = rng.randrange(len(spec))
        written = tuple(funcs.slip(rng, *op) if j == i else op for j, op in enumerate(spec))
        if any(funcs.evaluate(written, x) != y for x, y in visible):
            return "wrong", body_text(written)
    return "missing", MISSING_BODY


def make_task(spec, rng: random.Random, cfg: PyrepoConfig) -> RepoTask | None:
    """The repository of ``spec`` on fresh inputs; None when no hidden answer differs from
    every visible one (hard-coding would then pass the hidden tests)."""
    xs = rng.sample(range(INPUT_RANGE[0], INPUT_RANGE[1] + 1), cfg.num_visible + cfg.num_hidden)
    pairs = [(x, funcs.evaluate(spec, x)) for x in xs]
    visible, hidden = tuple(pairs[:cfg.num_visible]), tuple(pairs[cfg.num_visible:])
    if all(y in {v for _, v in visible} for _, y in hidden):
        return None
    broken, body = starting_body(spec, rng, cfg.wrong_body_rate, visible)
    files = {INIT_FILE: INIT_TEXT, OPS_FILE: ops_text(spec, body),
             VISIBLE_FILE: VISIBLE_TEMPLATE.format(cases=list(visible))}
    prompt = PROMPT.format(files=", ".join(sorted(files)))
    return RepoTask(task_id(spec), len(spec), tuple(spec), prompt, files, visible, hidden, broken)


def sample_tasks(cfg: PyrepoConfig, n: int, seed: int, heldout: bool) -> list[RepoTask]:
    """``n`` tasks of one split, deterministic in the arguments; a spec is held out iff funcs
    holds it out (same hash, ``cfg.heldout_buckets``), so the splits never overlap."""
    if n < 0:
        raise ValueError(f"cannot sample {n} tasks")
    rng = random.Random(f"pyrepo-{seed}-{'heldout' if heldout else 'train'}")
    tasks: list[RepoTask] = []
    for spec in funcs.split_specs(rng, 4 * n + 16, cfg.levels, cfg.heldout_buckets, heldout):
        if len(tasks) == n:
            break
        task = make_task(spec, rng, cfg)
        if task is not None:
            tasks.append(task)
    if len(tasks) < n:
        raise ValueError(f"could not draw {n} pyrepo tasks at levels {list(cfg.levels)}; "
                         "widen the levels or lower the count")
    return tasks
