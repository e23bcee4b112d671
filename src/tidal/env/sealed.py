"""Sealed grading: hidden tests and the verifier live outside the agent's sandbox and run after
the episode, in a fresh sandbox, on files the agent could not have planted.

A ``SealedTask`` names the task's pristine files, the glob patterns of files the agent may
change (``editable``), the visible test/verifier files it sees but must not change
(``protected``), the hidden test files it never sees (``hidden``), and the verifier. After the
episode, ``grade_sealed`` builds the grading workspace from scratch (``grading_files``):

    pristine files
    + the agent's final version of each *editable* file (new ones matching a pattern too;
      a deleted editable file stays deleted)
    + the hidden files (last, so nothing the agent wrote replaces them)

Everything else the agent wrote is left out: an edited visible test, a planted ``conftest.py``,
``sitecustomize.py``, ``usercustomize.py``, ``pytest.ini`` or ``*.pth`` (``RUNNER_CONFIG``:
never taken from the agent whatever the patterns say), a file outside the workspace. Protected
files are hash-checked (``changed_protected``, sha256) and reported as ``tampered``; grading
uses their pristine text either way. (Mounting them read-only in the agent's workspace is the
sandbox's business; this module does not rely on it.)

Three ways to read the result, strongest first:

  outputs   ``SealedTask.expected`` is set: the grading program prints the candidate's outputs
            on the hidden inputs in one nonce-stamped line (``<nonce> out v1 v2 ...``) and the
            *host* compares them with ``expected``, which never enters the sandbox.
  verdict   ``program`` is given (or the verifier reads the nonce): the program prints a
            nonce-stamped verdict (``<nonce> pass ...``, tidal.env.grading) and passes iff the
            word is ``pass``.
  exit      neither: the verifier argv (e.g. ``python -m unittest``) passes iff it exits 0.

Threat model (honest): the agent's editable code is *imported and run inside the grading
process*; grading does not isolate it from the verifier. So that code can

  - exit early (``os._exit(0)`` at import or in the function): in *exit* mode that is a pass;
    in verdict and outputs mode it leaves no stamped line, so it fails (``no_result``);
  - patch the runner, builtins or ``unittest`` / ``pytest`` internals, or return an object whose
    ``__eq__`` is always true: in exit and verdict mode such tricks can turn failing hidden
    assertions into a pass; in outputs mode only an ``int``'s own ``repr`` counts, compared on
    the host, so they cannot;
  - read the nonce from the verifier's memory (``__main__._nonce``, stack frames) and print a
    forged verdict: the nonce stops only blind forgery. In outputs mode a forged line still has
    to carry the right values, which the sandbox never holds;
  - read the hidden files (they are in the grading workspace in exit and verdict mode) and
    special-case their inputs. In outputs mode the hidden inputs are visible to the code at
    grading time, but not their expected values, so special-casing them needs the answers.

What outputs mode guarantees: the reward is earned only by printing the expected values for
inputs whose answers are nowhere in the sandbox, i.e. by computing them. What the other modes
leave open is what the tamper detector (tidal.integrity: early exits, always-true ``__eq__``,
runner patches, skip markers, hard-coded outputs, reads of grader files) is there to catch,
from the final diff, the actions and the sandbox trace. Protected-file edits are reported here
(``tampered``) and never reach grading. The sandbox itself (tidal.sandbox) keeps the code from
the host, the network and other runs in every mode.
"""

from __future__ import annotations

import fnmatch
import hashlib
import posixpath
import secrets
from dataclasses import dataclass, field
from typing import Any

from tidal.env.grading import NO_RESULT, NONCE_PREAMBLE, grading_slots, parse_verdict

RUNNER_CONFIG = ("conftest.py", "sitecustomize.py", "usercustomize.py", "pytest.ini", "*.pth")
"""Basenames that configure the test runner or the interpreter: grading takes them from the
pristine files only (or not at all), never from the agent, whatever ``editable`` says."""

OUTPUTS_WORD = "out"
"""The verdict word of an outputs-mode line: ``<nonce> out v1 v2 ...``."""

INT_OUTPUTS_PROGRAM = NONCE_PREAMBLE + """\
sys.dont_write_bytecode = True
_inputs = {inputs!r}
try:
    from {module} import {name} as _f
except SyntaxError:
    print(_nonce, "syntax_error", flush=True)
    raise SystemExit(0)
except Exception:
    print(_nonce, "runtime_error", flush=True)
    raise SystemExit(0)
def _one(_x):
    try:
        _y = _f(_x)
        return repr(_y) if type(_y) is int else "?"
    except Exception:
        return "!"
print(_nonce, "%s", *[_one(_x) for _x in _inputs], flush=True)
""" % OUTPUTS_WORD


def int_outputs_program(module: str, name: str, inputs: list) -> str:
    """An outputs-mode grading program for a function of one argument returning an int: it
    imports ``name`` from ``module`` and prints ``<nonce> out y1 y2 ...`` for ``inputs``
    (``?`` for anything but an int, whose repr an always-equal object cannot fake; ``!`` for an
    exception). The answers are not in it: the host compares (SealedTask.expected)."""
    return INT_OUTPUTS_PROGRAM.format(module=module, name=name, inputs=list(inputs))


PROGRAM_FILE = "main.py"
"""Where ``Sandbox.run_python`` writes a grading program: no task file may use this path."""


def safe_path(path: str) -> bool:
    """A plain relative path inside the workspace (no absolute path, no ``..``, no ``.``)."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        return False
    return posixpath.normpath(path) == path and not path.startswith("..")


@dataclass(frozen=True)
class SealedTask:
    """A task's files as grading sees them (see the module docstring)."""

    pristine: dict[str, str]
    """The task's files as the agent's workspace starts (relative path -> text)."""
    editable: tuple[str, ...]
    """fnmatch patterns (``*`` crosses ``/``) of the files the agent may change or add."""
    protected: tuple[str, ...] = ()
    """Visible test / verifier files the agent sees but must not change (paths in pristine)."""
    hidden: dict[str, str] = field(default_factory=dict)
    """Hidden test files: written only into the grading workspace, never the agent's."""
    verifier: tuple[str, ...] = ()
    """argv run in the grading sandbox when ``grade_sealed`` gets no program."""
    expected: tuple[str, ...] = ()
    """Outputs mode: the values the grading run must print (host side only; never written into
    any sandbox). Empty: verdict or exit mode."""

    def __post_init__(self):
        for path in [*self.pristine, *self.hidden, *self.protected]:
            if not safe_path(path):
                raise ValueError(f"sealed task path {path!r} is not a plain relative path")
        if clash := sorted(set(self.pristine) & set(self.hidden)):
            raise ValueError(f"hidden files {clash} are also pristine files: the agent would see them")
        if missing := sorted(set(self.protected) - set(self.pristine)):
            raise ValueError(f"protected files {missing} are not among the pristine files")
        if not isinstance(self.editable, tuple) or not all(isinstance(p, str) and p
                                                            for p in self.editable):
            raise ValueError(f"editable must be a tuple of glob patterns, got {self.editable!r}")
        if not isinstance(self.verifier, tuple):
            raise ValueError(f"verifier must be a tuple of argv words, got {self.verifier!r}")


@dataclass(frozen=True)
class SealedVerdict:
    """What sealed grading concluded.

    passed: the hidden tests passed (by the mode's rule, see the module docstring).
    reason: "pass", "wrong_answer" (outputs differ), "fail" (exit mode: nonzero exit), the
        verifier's own verdict word, ``no_result`` (no stamped line), or the sandbox's kill
        reason ("timeout", "memory", ...).
    fields: the words after the verdict word on the stamped line (outputs mode: the outputs).
    tampered: protected files the agent changed or deleted (they did not reach grading).
    matched: outputs mode: how many outputs equal the expected ones (0 otherwise).
    trace: the grading run's sandbox trace, when the sandbox recorded one (else None).
    """

    passed: bool
    reason: str
    fields: tuple[str, ...]
    tampered: tuple[str, ...]
    matched: int = 0
    trace: Any = None


def runner_config(path: str) -> bool:
    """Whether ``path``'s basename configures the runner or interpreter (RUNNER_CONFIG)."""
    base = posixpath.basename(path)
    return any(fnmatch.fnmatchcase(base, pattern) for pattern in RUNNER_CONFIG)


def is_editable(task: SealedTask, path: str) -> bool:
    """Whether grading takes the agent's version of ``path``."""
    if not safe_path(path) or path in task.protected or path in task.hidden or runner_config(path):
        return False
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in task.editable)


def grading_files(task: SealedTask, final_files: dict[str, str]) -> dict[str, str]:
    """The grading workspace: pristine + the agent's editable files + hidden (module docstring)."""
    files = {p: t for p, t in task.pristine.items() if not (is_editable(task, p) and p not in final_files)}
    files.update({p: t for p, t in final_files.items() if is_editable(task, p)})
    files.update(task.hidden)
    return files


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def changed_protected(task: SealedTask, final_files: dict[str, str]) -> list[str]:
    """Protected files whose final text differs from the pristine one by sha256, or that are gone."""
    return sorted(p for p in task.protected
                  if p not in final_files or sha256(final_files[p]) != sha256(task.pristine[p]))


def grade_sealed(sandbox, task: SealedTask, final_files: dict[str, str],
                 program: str | None = None) -> SealedVerdict:
    """Grade the episode's ``final_files`` in a fresh sandbox run (blocking; holds one of the
    sandbox's grading slots): ``program`` through ``run_python`` (it must start with
    tidal.env.grading.NONCE_PREAMBLE), else ``task.verifier`` through ``run``; a fresh nonce
    on stdin either way. Never raises for anything the graded code does."""
    files = grading_files(task, final_files)
    tampered = tuple(changed_protected(task, final_files))
    if program is None and not task.verifier:
        raise ValueError("grade_sealed needs a program or a SealedTask with a verifier")
    if program is not None and PROGRAM_FILE in files:
        raise ValueError(f"a grading program is written to {PROGRAM_FILE!r}, which the task uses")
    nonce = secrets.token_hex(8)
    with grading_slots(sandbox):
        if program is not None:
            result = sandbox.run_python(program, stdin=nonce + "\n", files=files)
        else:
            result = sandbox.run(list(task.verifier), files, stdin=nonce + "\n")
    stamped = program is not None or bool(task.expected)
    return read_result(task, result, nonce, stamped, tampered)


def read_result(task: SealedTask, result, nonce: str, stamped: bool,
                tampered: tuple[str, ...]) -> SealedVerdict:
    """The verdict of one grading run (see SealedVerdict)."""
    trace = getattr(result, "trace", None)
    if result.killed_reason:
        return SealedVerdict(False, result.killed_reason, (), tampered, 0, trace)
    if not stamped:
        passed = result.exit_code == 0
        return SealedVerdict(passed, "pass" if passed else "fail", (), tampered, 0, trace)
    line = parse_verdict(result.stdout, nonce)
    if line is None:
        return SealedVerdict(False, NO_RESULT, (), tampered, 0, trace)
    word, fields = line
    if not task.expected:
        return SealedVerdict(word == "pass", word, fields, tampered, 0, trace)
    if word != OUTPUTS_WORD:
        return SealedVerdict(False, word, fields, tampered, 0, trace)
    matched = sum(1 for got, want in zip(fields, task.expected) if got == want)
    passed = len(fields) == len(task.expected) and matched == len(task.expected)
    return SealedVerdict(passed, "pass" if passed else "wrong_answer", fields, tampered, matched,
                         trace)
