"""The built-in coding task family "funcs": write a Python function from a short description.

A task composes ``level`` simple integer operations ("add 3, then multiply by 2"). The prompt
states the intent in words plus a couple of input/output examples, and opens the function; the
model writes the body. Hidden tests call ``f`` on fresh inputs. Example (level 2):

    # Task: add 3, then multiply by 2.
    # Examples: f(1) == 8, f(-2) == 2
    def f(x):
        x = x + 3          <- the model writes these lines
        x = x * 2
        return x

Why this family: a tiny byte-level model can learn it on a CPU in minutes (each clause of the
description maps to one line of code), it needs real code execution to grade, its difficulty is
a dial (number of operations), and it has a space of millions of distinct specs, so a held-out
split is meaningful. The held-out split is disjoint from training *by construction*: a spec is
held out iff a hash of its canonical form falls in bucket 0, and both samplers filter on that.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Callable

from tidal.families.funcs.config import FuncsConfig

GENERATOR_VERSION = 2
"""Bump whenever prompts, solutions or the corpus change: it is the environment's
corpus_version, part of the pretrain cache key."""

# (name, phrase, code line(s) acting on x, needs_constant, python semantics)
# Code lines are indented one level inside ``def f(x):``; a conditional is a one-line ``if``.
Op = tuple[str, str, str, bool, Callable[[int, int], int]]

OPS: list[Op] = [
    ("add", "add {c}", "x = x + {c}", True, lambda x, c: x + c),
    ("sub", "subtract {c}", "x = x - {c}", True, lambda x, c: x - c),
    ("mul", "multiply by {c}", "x = x * {c}", True, lambda x, c: x * c),
    ("div", "floor-divide by {c}", "x = x // {c}", True, lambda x, c: x // c),
    ("mod", "take it modulo {c}", "x = x % {c}", True, lambda x, c: x % c),
    ("rsub", "subtract it from {c}", "x = {c} - x", True, lambda x, c: c - x),
    ("max", "take the larger of it and {c}", "x = max(x, {c})", True, lambda x, c: max(x, c)),
    ("min", "take the smaller of it and {c}", "x = min(x, {c})", True, lambda x, c: min(x, c)),
    ("neg", "negate it", "x = -x", False, lambda x, c: -x),
    ("abs", "take its absolute value", "x = abs(x)", False, lambda x, c: abs(x)),
    ("sq", "square it", "x = x * x", False, lambda x, c: x * x),
    ("halve_even", "halve it if it is even", "if x % 2 == 0: x = x // 2", False,
     lambda x, c: x // 2 if x % 2 == 0 else x),
    ("add_odd", "add {c} if it is odd", "if x % 2 == 1: x = x + {c}", True,
     lambda x, c: x + c if x % 2 == 1 else x),
]
OP_BY_NAME = {op[0]: op for op in OPS}

# Typical slips of a hurried programmer, used only to make the mid-training corpus realistic.
CONFUSED = {"add": "sub", "sub": "add", "mul": "div", "div": "mul", "mod": "div", "rsub": "sub",
            "max": "min", "min": "max", "neg": "abs", "abs": "neg", "sq": "mul",
            "halve_even": "add_odd", "add_odd": "halve_even"}

CONST_RANGE = (1, 9)
TEST_RANGE = (-30, 30)


@dataclass(frozen=True)
class Task:
    """One task: a spec (ops with constants), its prompt, and hidden test cases."""

    task_id: str
    level: int
    spec: tuple[tuple[str, int], ...]
    prompt: str
    tests: tuple[tuple[int, int], ...]  # (input, expected output)
    instruction: str = ""
    """The same task asked in plain English, for a chat model (``prompt_style = "instruct"``)."""

    @property
    def reference_solution(self) -> str:
        return solution_text(self.spec)


def evaluate(spec: tuple[tuple[str, int], ...], x: int) -> int:
    for name, c in spec:
        x = OP_BY_NAME[name][4](x, c)
    return x


def canonical(spec: tuple[tuple[str, int], ...]) -> str:
    return ";".join(f"{n}:{c}" for n, c in spec)


def is_heldout(spec: tuple[tuple[str, int], ...], buckets: int) -> bool:
    digest = hashlib.sha256(canonical(spec).encode()).digest()
    return int.from_bytes(digest[:8], "big") % buckets == 0


NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def describe(spec: tuple[tuple[str, int], ...]) -> str:
    """The intent in words; constants are spelled out ("add three"), as a person would say them."""
    phrases = [OP_BY_NAME[n][1].format(c=NUMBER_WORDS[c]) for n, c in spec]
    text = ", then ".join(phrases)
    return text[0].upper() + text[1:] + "."


def solution_text(spec: tuple[tuple[str, int], ...]) -> str:
    """The body of ``f`` (what the model must write), ending with a blank line."""
    lines = ["    " + OP_BY_NAME[n][2].format(c=c) for n, c in spec]
    return "\n".join(lines) + "\n    return x\n\n"


def prompt_text(spec, examples: list[tuple[int, int]]) -> str:
    shown = ", ".join(f"f({x}) == {y}" for x, y in examples)
    lines = [f"# Task: {describe(spec)}"]
    if examples:
        lines.append(f"# Examples: {shown}")
    lines.append("def f(x):\n")
    return "\n".join(lines)


def instruction_text(spec, examples: list[tuple[int, int]]) -> str:
    """The task as a person would ask a chat assistant: the steps in words, the examples, and
    what to reply with (a fenced code block is graded; see grader.extract_code)."""
    steps = describe(spec)
    lines = [f"Write a Python function f(x) that takes an integer x, applies these steps in "
             f"order and returns the result: {steps[0].lower()}{steps[1:]}"]
    if examples:
        lines.append("Examples: " + ", ".join(f"f({x}) == {y}" for x, y in examples))
    lines.append("Reply with only the code.")
    return "\n".join(lines)


def random_spec(rng: random.Random, level: int, ops: list[Op] = OPS) -> tuple[tuple[str, int], ...]:
    spec = []
    for _ in range(level):
        name, _, _, needs_c, _ = rng.choice(ops)
        spec.append((name, rng.randint(*CONST_RANGE) if needs_c else 0))
    return tuple(spec)


def make_task(spec, rng: random.Random, num_examples: int, num_tests: int) -> Task:
    xs = rng.sample(range(TEST_RANGE[0], TEST_RANGE[1] + 1), num_examples + num_tests)
    pairs = [(x, evaluate(spec, x)) for x in xs]
    task_id = f"funcs-{hashlib.sha256(canonical(spec).encode()).hexdigest()[:12]}"
    return Task(task_id, len(spec), tuple(spec), prompt_text(spec, pairs[:num_examples]),
                tuple(pairs[num_examples:]), instruction_text(spec, pairs[:num_examples]))


def sample_tasks(cfg: FuncsConfig, n: int, seed: int, heldout: bool) -> list[Task]:
    """``n`` tasks from the training split (heldout=False) or the held-out split (True).

    Deterministic in (cfg, seed). Specs never cross splits (see module docstring).
    """
    rng = random.Random(f"{seed}-{'heldout' if heldout else 'train'}")
    specs = split_specs(rng, n, (cfg.min_level, cfg.max_level), cfg.heldout_buckets, heldout)
    return [make_task(spec, rng, cfg.num_examples, cfg.num_tests) for spec in specs]


def split_specs(rng: random.Random, n: int, levels: tuple[int, int], buckets: int, heldout: bool,
                ops: list[Op] = OPS):
    """Yield ``n`` random specs (levels inclusive, steps from ``ops``) of one split; held-out
    specs are distinct.

    A generator, so a caller may draw more from ``rng`` between specs (task layouts, tests)."""
    seen: set[str] = set()
    made = attempts = 0
    while made < n:
        attempts += 1
        if attempts > 200 * n + 10000:
            raise ValueError(f"could not draw {n} distinct {'held-out' if heldout else 'training'} "
                             f"tasks at levels {levels[0]}..{levels[1]}; "
                             "widen the levels or lower the count")
        spec = random_spec(rng, rng.randint(*levels), ops)
        if is_heldout(spec, buckets) != heldout:
            continue
        if heldout and canonical(spec) in seen:
            continue
        seen.add(canonical(spec))
        made += 1
        yield spec


def slip(rng: random.Random, name: str, c: int) -> tuple[str, int]:
    """A plausible bug for the step ``(name, c)``: a confused operator or an off-by-one constant
    (what the corpus's hurried programmer, fixit's broken line and ledger's garbled summary
    write)."""
    if OP_BY_NAME[name][3] and rng.random() < 0.5:
        return name, max(CONST_RANGE[0], min(CONST_RANGE[1] + 1, c + rng.choice((-1, 1))))
    other = CONFUSED[name]
    return other, (c if c else rng.randint(*CONST_RANGE)) if OP_BY_NAME[other][3] else 0


CODE_LINE_TO_STEP = {"    " + op[2].format(c=c): (op[0], c if op[3] else 0)
                     for op in OPS for c in range(0, CONST_RANGE[1] + 2)}
"""Every line ``solution_text`` writes (constants 0..10: a slip can push one out of range)."""


def parse_solution(source: str) -> tuple[tuple[str, int], ...] | None:
    """The spec of ``def f(x):`` + a body written exactly as ``solution_text`` writes it; None
    for any other text. Lets a scripted demonstration be graded without running code."""
    lines = source.rstrip("\n").split("\n")
    if len(lines) < 2 or lines[0] != "def f(x):" or lines[-1] != "    return x":
        return None
    steps = [CODE_LINE_TO_STEP.get(line) for line in lines[1:-1]]
    return None if None in steps else tuple(steps)
