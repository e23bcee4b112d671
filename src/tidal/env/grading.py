"""Grading in the sandbox: run a program that prints a nonce-stamped verdict, and read it back.

A grading program is the environment's own checker with the candidate code embedded in it (as a
string it compiles and runs). It starts with ``NONCE_PREAMBLE``, which reads a fresh random nonce
from stdin *before* the candidate runs, and it reports one verdict line::

    print(_nonce, "pass", 6, 6)            # <nonce> <verdict> <fields...>

A candidate that prints a fake verdict cannot know the nonce, and one that exits early leaves no
line at all; so whatever the candidate does — a syntax error, an exception, an infinite loop, a
fork bomb, a memory hog, a flood of output — ``run_graded`` returns a ``Verdict`` with a reason
and never raises.

Parallel gradings: every run holds one of its sandbox's ``grading_slots`` (``env.sandbox.
concurrency`` of them, shared by every episode and environment grading through that sandbox),
so many episodes finishing at once queue for the CPUs instead of oversubscribing them.
"""

from __future__ import annotations

import secrets
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

NONCE_PREAMBLE = "import sys\n_nonce = sys.stdin.readline().strip()\n"
"""The first lines of a grading program: the nonce is read before any candidate code runs."""

NO_RESULT = "no_result"
"""The reason when the program ended without a verdict line carrying the nonce."""


@dataclass(frozen=True)
class Verdict:
    """What one grading run said.

    reason: the verdict word ("pass", "wrong_answer", ...), or the sandbox's reason for killing
        the program ("timeout", "memory", "cpu", "output", ...), or ``NO_RESULT``.
    fields: the words after the verdict on its line (empty unless the program printed one).
    wall_s: seconds the run took.
    """

    reason: str
    fields: tuple[str, ...]
    wall_s: float


def parse_verdict(stdout: str, nonce: str) -> tuple[str, tuple[str, ...]] | None:
    """The last line of ``stdout`` that starts with ``nonce`` and a verdict word, split into
    (verdict, fields); None if there is none."""
    for line in reversed(stdout.splitlines()):
        parts = line.split()
        if len(parts) >= 2 and parts[0] == nonce:
            return parts[1], tuple(parts[2:])
    return None


_per_sandbox: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_per_sandbox_lock = threading.Lock()


def _of_sandbox(sandbox, kind: str, make):
    """The one ``kind`` object of ``sandbox`` (``make()`` on first use; it goes with the sandbox)."""
    with _per_sandbox_lock:
        held = _per_sandbox.setdefault(sandbox, {})
        if kind not in held:
            held[kind] = make()
        return held[kind]


def grading_slots(sandbox) -> threading.BoundedSemaphore:
    """The one limit on parallel gradings through ``sandbox``: ``sandbox.cfg.concurrency`` runs
    at once, shared by every caller (hold it while a program runs: ``with grading_slots(sb):``).
    ``run_graded`` takes it for you."""
    return _of_sandbox(sandbox, "slots", lambda: threading.BoundedSemaphore(sandbox.cfg.concurrency))


MEMO_PROGRAMS = 4096
"""Verdicts a sandbox's memo keeps (least recently used dropped first); ~1 KB of program each."""


class VerdictMemo:
    """Verdicts of the programs graded through one sandbox, by program text, shared by every
    thread grading through it; a program already running is waited for, not started again.

    Why: a grading program that holds the whole candidate and its tests (funcs' checker, which
    fixit and ledger grade through) runs the same code on the same inputs as any equal program,
    and RL samples the same completion many times over (36 of 128 funcs episodes repeated
    another's at the start of RL, more as the policy sharpens), each grading a sandbox start.
    A program whose verdict is not a function of its text (the clock, randomness, the time limit
    on a loaded machine) gives its copies the first run's verdict."""

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


def verdict_memo(sandbox) -> VerdictMemo:
    """The one memo of ``sandbox``."""
    return _of_sandbox(sandbox, "memo", VerdictMemo)


def run_graded(sandbox, program: str) -> Verdict:
    """Run ``program`` (starting with NONCE_PREAMBLE) with a fresh nonce on stdin, in one of the
    sandbox's grading slots; blocking (in async code: ``await run_blocking(run_graded, ...)``)."""
    nonce = secrets.token_hex(8)
    with grading_slots(sandbox):
        res = sandbox.run_python(program, stdin=nonce + "\n")
    if res.killed_reason:
        return Verdict(res.killed_reason, (), res.wall_s)
    verdict = parse_verdict(res.stdout, nonce)
    if verdict is None:
        return Verdict(NO_RESULT, (), res.wall_s)
    return Verdict(verdict[0], verdict[1], res.wall_s)


def run_graded_many(sandbox, programs: list[str], share: bool = False) -> list[Verdict]:
    """``run_graded`` on each program, as many at once as the grading slots allow; results in
    program order. ``share``: each distinct program runs once per sandbox (``VerdictMemo``), for
    programs that hold everything they run on."""
    if share:
        return verdict_memo(sandbox).grade(sandbox, programs)
    if not programs:
        return []
    with ThreadPoolExecutor(max_workers=min(sandbox.cfg.concurrency, len(programs))) as pool:
        return list(pool.map(lambda p: run_graded(sandbox, p), programs))
