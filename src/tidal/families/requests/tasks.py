"""The "requests" family: everyday coding requests about strings and lists, asked in plain English.

Each task is one *kind* of request (reverse a string, the sum of the even numbers of a list,
remove duplicates keeping order, ...) on a random example, asked as a chat message:

    Write a Python function f(x) that takes a string x and returns x reversed.
    Example: f('river') == 'revir'
    Reply with only the code.

Hidden tests call ``f`` on fresh random inputs of the same kind. A kind is its words, a generator
of random inputs and a reference solution (``Kind.solution``, the source of ``f``); the expected
outputs are the reference run on the host, so the hidden tests and the prompt's example always
agree with the reference (tests/test_env_requests.py grades every reference through the real
grader).

Why this family: it is *not* what funcs trains (integer arithmetic), so a chat model's pass@1
here before and after RL on funcs shows whether what it could already do got worse. The
held-out split is disjoint from training by construction: a task is held out iff a hash of its
kind and shown example falls in bucket 0, and both samplers filter on that.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidal.families.requests.config import RequestsConfig

GENERATOR_VERSION = 1
"""Bump whenever kinds, prompts or tests change (the environment's corpus_version)."""

WORDS = ("apple", "river", "stone", "cloud", "garden", "bread", "music", "yellow", "window",
         "tiger", "pencil", "ocean", "forest", "candle", "silver", "rabbit", "orange", "planet",
         "coffee", "summer", "winter", "button", "dragon", "lemon", "mirror", "rocket", "shadow",
         "basket", "castle", "engine", "island", "jacket", "kitten", "ladder", "market", "needle",
         "pepper", "rain", "sun", "tree", "book", "door", "fish", "lamp", "moon", "road", "star",
         "wind", "idea", "echo", "unit", "area", "eye", "ant", "owl", "sky", "cup", "map", "pie")
"""Lowercase English words the string inputs are made of."""

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _word(rng: random.Random) -> str:
    """A word, or 3..8 random lowercase letters (so a kind has far more examples than words)."""
    if rng.random() < 0.4:
        return rng.choice(WORDS)
    return "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 8)))


def _sentence(rng: random.Random) -> str:
    """2..6 lowercase words separated by single spaces."""
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))


def _mixed_case(rng: random.Random) -> str:
    return "".join(c.upper() if rng.random() < 0.4 else c for c in _word(rng))


def _maybe_palindrome(rng: random.Random) -> str:
    """A palindrome half of the time (else a word or letters, rarely one)."""
    if rng.random() < 0.5:
        return _word(rng)
    half = "".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 4)))
    return half + rng.choice(["", rng.choice(LETTERS)]) + half[::-1]


def _ints(rng: random.Random) -> list[int]:
    """A non-empty list of 1..8 integers in -20..20."""
    return [rng.randint(-20, 20) for _ in range(rng.randint(1, 8))]


def _small_ints(rng: random.Random) -> list[int]:
    """A non-empty list of 1..6 integers in -5..5 (products stay small)."""
    return [rng.randint(-5, 5) for _ in range(rng.randint(1, 6))]


def _repeats(rng: random.Random) -> list[int]:
    """2..10 integers in 0..6, so duplicates are common."""
    return [rng.randint(0, 6) for _ in range(rng.randint(2, 10))]


def _words(rng: random.Random) -> list[str]:
    """A non-empty list of 1..6 words."""
    return [rng.choice(WORDS) for _ in range(rng.randint(1, 6))]


@dataclass(frozen=True)
class Kind:
    """One kind of request: ``f(x)`` takes ``takes`` and returns ``returns``.

    name: its id (part of a task's id and held-out hash).
    level: 1 = one obvious step; 2 = a step with a rule to keep (order, ties, words).
    takes: what x is, after "takes" ("a string x").
    returns: what f returns, after "returns" ("x reversed").
    inputs: a random input from a seeded generator.
    solution: the reference ``f`` as source (what a correct answer may be); the hidden tests'
        expected outputs are this run on the host."""

    name: str
    level: int
    takes: str
    returns: str
    inputs: Callable[[random.Random], Any]
    solution: str


STRING = "a string x"
SENTENCE = "a string x of lowercase words separated by single spaces"
INTS = "a non-empty list of integers x"
WORD_LIST = "a non-empty list of strings x"

KINDS: tuple[Kind, ...] = (
    # strings
    Kind("reverse_string", 1, STRING, "x reversed", _word,
         "def f(x):\n    return x[::-1]\n"),
    Kind("count_vowels", 1, STRING, "the number of vowels (a, e, i, o, u) in x", _sentence,
         "def f(x):\n    return sum(1 for c in x if c in 'aeiou')\n"),
    Kind("upper", 1, STRING, "x in upper case", _sentence,
         "def f(x):\n    return x.upper()\n"),
    Kind("swap_case", 1, STRING,
         "x with every upper-case letter made lower case and every lower-case letter made upper "
         "case", _mixed_case,
         "def f(x):\n    return x.swapcase()\n"),
    Kind("remove_vowels", 1, STRING, "x with every vowel (a, e, i, o, u) removed", _sentence,
         "def f(x):\n    return ''.join(c for c in x if c not in 'aeiou')\n"),
    Kind("is_palindrome", 1, STRING,
         "True if x reads the same forwards and backwards, else False", _maybe_palindrome,
         "def f(x):\n    return x == x[::-1]\n"),
    Kind("first_char_repeated", 1, "a non-empty string x",
         "the first character of x repeated as many times as x is long", _word,
         "def f(x):\n    return x[0] * len(x)\n"),
    Kind("double_chars", 2, STRING, "x with every character written twice", _word,
         "def f(x):\n    return ''.join(c + c for c in x)\n"),
    Kind("count_first_char", 2, "a non-empty string x",
         "how many times the first character of x occurs in x", _sentence,
         "def f(x):\n    return x.count(x[0])\n"),
    Kind("longest_word_length", 1, SENTENCE, "the length of the longest word in x", _sentence,
         "def f(x):\n    return max(len(w) for w in x.split(' '))\n"),
    Kind("count_words", 1, SENTENCE, "the number of words in x", _sentence,
         "def f(x):\n    return len(x.split(' '))\n"),
    Kind("capitalize_words", 2, SENTENCE,
         "x with the first letter of every word in upper case", _sentence,
         "def f(x):\n    return ' '.join(w[0].upper() + w[1:] for w in x.split(' '))\n"),
    Kind("reverse_words", 2, SENTENCE,
         "the words of x in reverse order, separated by single spaces", _sentence,
         "def f(x):\n    return ' '.join(reversed(x.split(' ')))\n"),
    # lists of integers
    Kind("sum_even", 1, INTS, "the sum of the even numbers in x", _ints,
         "def f(x):\n    return sum(v for v in x if v % 2 == 0)\n"),
    Kind("largest", 1, INTS, "the largest element of x", _ints,
         "def f(x):\n    return max(x)\n"),
    Kind("max_minus_min", 1, INTS,
         "the largest element of x minus the smallest element of x", _ints,
         "def f(x):\n    return max(x) - min(x)\n"),
    Kind("count_positive", 1, INTS, "how many elements of x are greater than zero", _ints,
         "def f(x):\n    return sum(1 for v in x if v > 0)\n"),
    Kind("sort_descending", 1, INTS, "a list of the elements of x sorted in descending order",
         _ints,
         "def f(x):\n    return sorted(x, reverse=True)\n"),
    Kind("squares", 1, INTS, "a list of the squares of the elements of x, in order", _ints,
         "def f(x):\n    return [v * v for v in x]\n"),
    Kind("odd_elements", 1, INTS, "a list of the odd elements of x, in order", _ints,
         "def f(x):\n    return [v for v in x if v % 2 == 1]\n"),
    Kind("reverse_list", 1, INTS, "a list of the elements of x in reverse order", _ints,
         "def f(x):\n    return x[::-1]\n"),
    Kind("product", 1, INTS, "the product of the elements of x", _small_ints,
         "def f(x):\n    p = 1\n    for v in x:\n        p *= v\n    return p\n"),
    Kind("remove_duplicates", 2, INTS,
         "a list of the elements of x without duplicates, each kept where it first occurs",
         _repeats,
         "def f(x):\n    out = []\n    for v in x:\n        if v not in out:\n"
         "            out.append(v)\n    return out\n"),
    Kind("running_sum", 2, INTS,
         "a list whose element i is the sum of the elements of x from index 0 to index i", _ints,
         "def f(x):\n    out, s = [], 0\n    for v in x:\n        s += v\n        out.append(s)\n"
         "    return out\n"),
    Kind("index_of_largest", 2, INTS,
         "the index of the largest element of x (the first one if it occurs more than once)",
         _repeats,
         "def f(x):\n    return x.index(max(x))\n"),
    # lists of strings
    Kind("longest_string", 2, WORD_LIST,
         "the longest string in x (the first one if several are equally long)", _words,
         "def f(x):\n    return max(x, key=len)\n"),
    Kind("join_hyphens", 1, WORD_LIST, "the strings of x joined by '-'", _words,
         "def f(x):\n    return '-'.join(x)\n"),
    Kind("lengths", 1, WORD_LIST, "a list of the lengths of the strings in x, in order", _words,
         "def f(x):\n    return [len(s) for s in x]\n"),
)
KIND_BY_NAME = {k.name: k for k in KINDS}


@dataclass(frozen=True)
class Task:
    """One request: its kind, the example it shows, and hidden test cases.

    ``prompt`` and ``instruction`` are the same plain-English request (``instruction`` as funcs
    names it; the family is instruct-only, so funcs' grader grades it with style "instruct")."""

    task_id: str
    level: int
    kind: str
    prompt: str
    tests: tuple[tuple[Any, Any], ...]  # (input, expected output)
    examples: tuple[tuple[Any, Any], ...] = ()
    """The (input, output) pairs the request shows."""

    @property
    def instruction(self) -> str:
        return self.prompt

    @property
    def reference_solution(self) -> str:
        return KIND_BY_NAME[self.kind].solution


@functools.cache
def reference(kind_name: str) -> Callable[[Any], Any]:
    """The reference ``f`` of a kind, compiled from its (trusted, in-repo) solution source."""
    namespace: dict[str, Any] = {}
    exec(compile(KIND_BY_NAME[kind_name].solution, f"<requests:{kind_name}>", "exec"), namespace)
    return namespace["f"]


def expected(kind: Kind, x: Any) -> Any:
    """The reference's output on ``x`` (on a copy: ``x`` is stored in the task as drawn)."""
    return reference(kind.name)(copy.deepcopy(x))


def canonical(kind: Kind, example: Any) -> str:
    return f"{kind.name}:{example!r}"


def is_heldout(kind: Kind, example: Any, buckets: int) -> bool:
    digest = hashlib.sha256(canonical(kind, example).encode()).digest()
    return int.from_bytes(digest[:8], "big") % buckets == 0


def instruction_text(kind: Kind, examples: list[tuple[Any, Any]]) -> str:
    """The request as a person would write it to a chat assistant (a fenced code block in the
    answer is graded; see tidal.families.funcs.grader.extract_code)."""
    lines = [f"Write a Python function f(x) that takes {kind.takes} and returns {kind.returns}."]
    if examples:
        shown = ", ".join(f"f({x!r}) == {y!r}" for x, y in examples)
        lines.append(("Example: " if len(examples) == 1 else "Examples: ") + shown)
    lines.append("Reply with only the code.")
    return "\n".join(lines)


def draw_tests(kind: Kind, rng: random.Random, n: int, avoid: list[Any]) -> list[tuple[Any, Any]]:
    """``n`` hidden tests on distinct inputs not in ``avoid``, whose expected outputs are not all
    the same (so no constant answer passes)."""
    for _ in range(100):
        seen = {repr(x) for x in avoid}
        xs = []
        while len(xs) < n:
            x = kind.inputs(rng)
            if repr(x) not in seen:
                seen.add(repr(x))
                xs.append(x)
        tests = [(x, expected(kind, x)) for x in xs]
        if n == 1 or len({repr(y) for _, y in tests}) > 1:
            return tests
    raise ValueError(f"kind {kind.name!r}: could not draw {n} tests with differing outputs")


def make_task(kind: Kind, example: Any, rng: random.Random, num_examples: int,
              num_tests: int) -> Task:
    """A task of ``kind`` whose first shown example (the one the split hashes) is ``example``;
    with ``num_examples = 0`` it is shown nowhere and only names the task."""
    shown = [example]
    while len(shown) < num_examples:
        x = kind.inputs(rng)
        if repr(x) not in {repr(s) for s in shown}:
            shown.append(x)
    examples = [(x, expected(kind, x)) for x in shown[:num_examples]]
    tests = draw_tests(kind, rng, num_tests, shown)
    task_id = f"requests-{hashlib.sha256(canonical(kind, example).encode()).hexdigest()[:12]}"
    return Task(task_id, kind.level, kind.name, instruction_text(kind, examples), tuple(tests),
                tuple(examples))


def kinds_in(cfg: RequestsConfig) -> list[Kind]:
    return [k for k in KINDS if cfg.min_level <= k.level <= cfg.max_level]


def sample_tasks(cfg: RequestsConfig, n: int, seed: int, heldout: bool) -> list[Task]:
    """``n`` tasks from the training split (heldout=False) or the held-out split (True).

    Deterministic in (cfg, seed). A (kind, example) never crosses splits (see the module
    docstring); held-out tasks are distinct."""
    rng = random.Random(f"requests-{seed}-{'heldout' if heldout else 'train'}")
    kinds = kinds_in(cfg)
    seen: set[str] = set()
    out: list[Task] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 200 * n + 10000:
            raise ValueError(f"could not draw {n} distinct {'held-out' if heldout else 'training'} "
                             f"requests at levels {cfg.min_level}..{cfg.max_level}; "
                             "lower the count")
        kind = rng.choice(kinds)
        example = kind.inputs(rng)
        if is_heldout(kind, example, cfg.heldout_buckets) != heldout:
            continue
        if heldout and canonical(kind, example) in seen:
            continue
        seen.add(canonical(kind, example))
        out.append(make_task(kind, example, rng, cfg.num_examples, cfg.num_tests))
    return out
