"""The long-horizon task family "ledger": facts read early are needed late, many windows later.

A task is a small repository of ``num_files`` files read one at a time (the environment keeps
the cursor, as a pager does). A few files each hold one step of a function ``f`` as a marked
comment, in order; the rest is unrelated code. After the last file the agent submits f's code,
every step in file order on one line ("x//=7;x=min(x,3)"), graded by hidden tests run
in the sandbox (the funcs family's grader). Example file, as ``next_file`` shows it:

    m_ac.py
    def scale_ac(v):
        return v * rate
    # f: x//=7

Why it needs memory: the steps sit in the first ``op_zone`` of the files, so when ``f`` is
written they are many context windows back. A sliding window has dropped them by construction;
an agent that summarises its progress (its summary is f's code so far) carries them across
resets, if every summary copies the last one and adds the new steps faithfully.

Why a tiny byte-level model can learn it on a CPU in minutes: every action is short and
formulaic (open the next file; a summary that copies the code so far and appends the steps seen
since; a submit that copies the code), so what there is to learn is exactly the long-horizon
part: carry the facts through a dozen or more resets. (Steps first stated in words, "multiply by
five", as the funcs family does, were not learned within a 10-minute mid-training: the word to
code mapping is rare in the episodes, one or two lines in ~20 summaries.) For the same reason
the only digits in a task are its steps' constants: file names are letters and the unrelated
code names its constants. With digits in the filler ("LIMIT_4 = 2", "m04.py (4/39)"), a
10-minute mid-training learned to carry each step's operator through every summary but not its
constant (it wrote its favourite digit instead); which digit a step has is the fact to keep.

The held-out split is disjoint by construction, as in funcs: a spec is held out iff a hash of
its canonical form falls in bucket 0.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import dataclass

from tidal.families.funcs import CONST_RANGE, OP_BY_NAME, OPS, Task, canonical, evaluate, slip, split_specs
from tidal.families.ledger.config import LedgerConfig

GENERATOR_VERSION = 5
"""Bump whenever task text, the expert or the demonstrations change (pretrain cache key)."""

TEST_RANGE = (-30, 30)
FUNCTION_HEADER = "def f(x):\n"
STEP_MARK = "# f: "
PROMPT = "Write f: all '# f:' steps.\n"
NO_STEPS = "none"
"""The summary before any step was found."""

LEDGER_OPS = [op for op in OPS if not op[2].startswith("if ")]
"""The funcs steps that are plain assignments, so the code of f is one line: statements joined by
";" (a one-line ``if`` would swallow the statements after it)."""
LEDGER_OP_NAMES = {op[0] for op in LEDGER_OPS}

COMPACT_STATEMENTS = {
    "add": "x+={c}", "sub": "x-={c}", "mul": "x*={c}", "div": "x//={c}", "mod": "x%={c}",
    "rsub": "x={c}-x", "max": "x=max(x,{c})", "min": "x=min(x,{c})", "neg": "x=-x",
    "abs": "x=abs(x)", "sq": "x*=x",
}
"""Each step as the shortest plain Python statement (the funcs family writes ``x = x + 5``).
Every byte of a fact is one token the byte-level model must carry through a dozen or more
summaries, so the family spells facts tersely: ``x+=5;x*=3`` is 9 tokens, ``x = x + 5; x = x * 3``
is 21."""
assert set(COMPACT_STATEMENTS) == LEDGER_OP_NAMES

# Unrelated code, filled with the file's letters and a named constant: no digits (see above).
FILLER = [
    "def scale_{k}(v):\n    return v * {c}",
    "LIMIT_{K} = {c}",
    "def shift_{k}(v):\n    return v + {c}",
    "NAMES_{K} = ['a', 'b']",
    "# tidy up module {k}",
    "def clip_{k}(v):\n    return min(v, {c})",
]
FILLER_CONSTANTS = ["rate", "step", "top", "size", "LOW", "HIGH", "base"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class LedgerTask:
    """One task: the spec of f, the files in reading order, and hidden tests.

    op_files[i] is the index (0-based) of the file holding step i of the spec.
    """

    task_id: str
    spec: tuple[tuple[str, int], ...]
    files: tuple[str, ...]
    op_files: tuple[int, ...]
    tests: tuple[tuple[int, int], ...]
    prompt: str = PROMPT

    @property
    def level(self) -> int:
        return len(self.spec)

    @property
    def reference_solution(self) -> str:
        """The code the agent submits: f's statements on one line."""
        return code_text(self.spec)

    def function_task(self) -> Task:
        """``f`` as a funcs-family task, so the funcs grader runs a submitted body."""
        return Task(self.task_id, self.level, self.spec, FUNCTION_HEADER, self.tests)


def statement(name: str, c: int) -> str:
    return COMPACT_STATEMENTS[name].format(c=c)


def code_text(spec) -> str:
    """What the agent submits and its summaries carry: ``x*=5;x+=7``."""
    return ";".join(statement(n, c) for n, c in spec)


def longest_code(steps: int) -> str:
    """The longest code line of ``steps`` steps (constants up to 10, a slip's reach): how much room
    a summary or a submission needs (byte tokens)."""
    return ";".join([max(STATEMENT_TO_STEP, key=len)] * steps)


def body_text(code: str) -> str:
    """The body of f made of submitted ``code`` (one line of statements), as the grader runs it."""
    return "    " + code.strip() + "\n    return x\n"


def file_letters(index: int) -> str:
    """``aa``, ``ab``, ... ``zz``: a file's name without digits."""
    return LETTERS[index // len(LETTERS)] + LETTERS[index % len(LETTERS)]


def file_name(index: int) -> str:
    return f"m_{file_letters(index)}.py"


def file_text(index: int, step: tuple[str, int] | None, rng: random.Random, filler_lines: int) -> str:
    """One file: ``filler_lines`` lines of unrelated code, and the step's comment (if any) at a
    random place among them."""
    k = file_letters(index)
    lines = [rng.choice(FILLER).format(k=k, K=k.upper(), c=rng.choice(FILLER_CONSTANTS))
             for _ in range(filler_lines)]
    if step is not None:
        lines.insert(rng.randint(0, len(lines)), STEP_MARK + statement(*step))
    return "\n".join(lines) + "\n"


def place_steps(rng: random.Random, cfg: LedgerConfig, count: int) -> tuple[int, ...]:
    """Sorted distinct file indices in the first op_zone of the files."""
    zone = max(count, int(cfg.num_files * cfg.op_zone))
    return tuple(sorted(rng.sample(range(zone), count)))


def make_task(spec, rng: random.Random, cfg: LedgerConfig) -> LedgerTask:
    op_files = place_steps(rng, cfg, len(spec))
    step_at = dict(zip(op_files, spec))
    files = tuple(file_text(i, step_at.get(i), rng, cfg.filler_lines) for i in range(cfg.num_files))
    xs = rng.sample(range(TEST_RANGE[0], TEST_RANGE[1] + 1), cfg.num_tests)
    tests = tuple((x, evaluate(spec, x)) for x in xs)
    layout = hashlib.sha256(("\x00".join(files)).encode()).hexdigest()[:6]
    task_id = f"ledger-{hashlib.sha256(canonical(spec).encode()).hexdigest()[:10]}-{layout}"
    return LedgerTask(task_id, tuple(spec), files, op_files, tests)


def sample_tasks(cfg: LedgerConfig, n: int, seed: int, heldout: bool) -> list[LedgerTask]:
    """``n`` tasks from the training (heldout=False) or held-out (True) split; deterministic in
    (cfg, seed). Specs never cross splits; held-out specs are distinct."""
    rng = random.Random(f"ledger-{seed}-{'heldout' if heldout else 'train'}")
    specs = split_specs(rng, 20 * n + 100, (cfg.min_ops, cfg.max_ops), cfg.heldout_buckets, heldout,
                        LEDGER_OPS)
    tasks: list[LedgerTask] = []
    for spec in specs:
        task = make_task(spec, rng, cfg)
        if every_step_matters(task):
            tasks.append(task)
        if len(tasks) == n:
            return tasks
    raise ValueError(f"could not draw {n} ledger tasks whose every step matters; lower the count")


def every_step_matters(task: LedgerTask) -> bool:
    """Whether no proper subsequence of the steps (none at all included) passes the hidden
    tests: a task that fewer steps also pass (x // 1; max(x, 1) then max(x, 5); negating twice)
    would reward an agent that forgot them."""
    for k in range(len(task.spec)):
        for fewer in itertools.combinations(task.spec, k):
            if all(evaluate(fewer, x) == y for x, y in task.tests):
                return False
    return True


# ---------------------------------------------------------------- the scripted expert


def _all_steps(constants: range):
    for name in LEDGER_OP_NAMES:
        for c in (constants if OP_BY_NAME[name][3] else [0]):
            yield name, c


STATEMENT_TO_STEP = {statement(n, c): (n, c) for n, c in _all_steps(range(0, CONST_RANGE[1] + 2))}
"""Every statement a summary may hold (constants 0..10: a slip can push one out of range)."""


def parse_steps(text: str) -> list[tuple[str, int]]:
    """The steps named by '# f:' comments in a file's text, in order."""
    return [STATEMENT_TO_STEP[line[len(STEP_MARK):]] for line in text.splitlines()
            if line.startswith(STEP_MARK) and line[len(STEP_MARK):] in STATEMENT_TO_STEP]


def parse_code(code: str) -> list[tuple[str, int]]:
    """The steps of a code line (a summary or a submission), spaces ignored; statements not in the
    family's compact form are skipped."""
    statements = [s.replace(" ", "") for s in code.split(";")]
    return [STATEMENT_TO_STEP[s] for s in statements if s in STATEMENT_TO_STEP]


def recall(summary: str | None, observations: list[str]) -> list[tuple[str, int]]:
    """What a reader of a context knows: the carried summary's steps (believed as written), then
    the steps of the files shown after it."""
    memory = parse_code(summary) if summary else []
    for text in observations:
        memory += parse_steps(text)
    return memory


def summary_steps(text: str) -> list[tuple[str, int] | None]:
    """A summary's statements as steps, None for each that is not a step in the family's form
    ("none" and "" are no steps)."""
    if text.strip() in ("", NO_STEPS):
        return []
    return [STATEMENT_TO_STEP.get(s.replace(" ", "")) for s in text.split(";")]


def summary_score(text: str, facts: list[tuple[str, int]]) -> float:
    """How well a summary carries ``facts`` (the steps it should hold, in order), in [0, 1]: the
    longest common subsequence of its statements and the facts over the longer of the two. Right
    = 1; each fact dropped or garbled, or statement added, lowers it; no fact to carry and none
    written = 1."""
    written = summary_steps(text)
    longest = max(len(written), len(facts))
    return 1.0 if longest == 0 else _common_subsequence(written, facts) / longest


def _common_subsequence(a: list, b: list) -> int:
    """Length of the longest common subsequence of ``a`` and ``b`` (None matches nothing)."""
    row = [0] * (len(b) + 1)
    for x in a:
        prev_diag = 0
        for j, y in enumerate(b):
            prev_diag, row[j + 1] = row[j + 1], (prev_diag + 1 if x is not None and x == y
                                                 else max(row[j + 1], row[j]))
    return row[-1]


def summary_text(memory: list[tuple[str, int]]) -> str:
    """What the expert writes when its context is reset: the code of f found so far."""
    return code_text(memory) if memory else NO_STEPS


def slipped(memory: list[tuple[str, int]], rng: random.Random) -> list[tuple[str, int]]:
    """A plausible lapse of memory: one step dropped, or one step garbled (a confused operator
    or an off-by-one constant, the funcs family's slips)."""
    out = list(memory)
    i = rng.randrange(len(out))
    if rng.random() < 0.5:
        del out[i]
        return out
    while out[i] == memory[i]:  # an off-by-one at the range's end can give the same constant
        out[i] = slip(rng, *memory[i])
    return out


class LedgerExpert:
    """The scripted policy the demonstrations come from: open files until there are none, write
    summaries carrying the code found so far, submit it.

    It keeps no state: like a model, it knows only what its context shows (``recall``).
    """

    def __init__(self, rng: random.Random, slip_rate: float):
        self.rng = rng
        self.slip_rate = slip_rate

    def recall(self, summary: str | None, observations: list[str]) -> list[tuple[str, int]]:
        """What a reader of the context knows (``recall``)."""
        return recall(summary, observations)

    def summarize(self, memory: list[tuple[str, int]]) -> str:
        if memory and self.rng.random() < self.slip_rate:
            memory = slipped(memory, self.rng)
        return summary_text(memory)

    def answer(self, memory: list[tuple[str, int]]) -> str:
        return code_text(memory)
