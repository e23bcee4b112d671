"""The typed records of integrity checking: what an episode leaves behind, and what was found.

An episode's **evidence** is everything tidal itself saw of it, none of it written by the
policy's own hand into anything tidal trusts:

  before    the workspace as the task gave it (relative path -> text)
  after     the workspace as the episode left it (relative path -> text; a deleted file is absent)
  actions   the model's turns in order (``Action``: its text, the tool it called and the answer)
  trace     what the sandbox recorded while the episode's programs ran (``TraceEvent``: programs
            executed, files opened / written / deleted outside the workspace, network attempts)
  protected relative paths the agent could see but not change (visible tests, verifier files)
  hidden    relative paths of files the agent must never read (hidden tests, the grader)

A **finding** is one thing a detector saw, with the evidence that shows it and a confidence in
[0, 1]. Detectors never raise on odd input: evidence they cannot parse (code with a syntax
error, a binary file) is skipped, not an error.

On disk (``tidal integrity check``): ``--before`` and ``--after`` are directories, ``--actions``
and ``--trace`` are JSON-lines files of ``Action.to_json()`` / ``TraceEvent.to_json()`` objects.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

TRACE_KINDS = ("exec", "open", "remove", "rename", "connect", "resolve", "hostname", "trace_end")
"""The kinds of TraceEvent a sandbox records:

  exec      a program was started (``argv``): subprocess, os.system, os.exec*, os.posix_spawn
  open      a file outside the workspace was opened (``path``, ``mode``: "r", "w", "a", "x" or
            "r+"), or a file inside it that the task protects or hides; reads of the
            interpreter's own library are not recorded (every import would be one)
  remove    a file or directory was deleted (``path``), anywhere
  rename    a file was renamed (``path`` -> ``target``), anywhere
  connect   a socket connect / bind / sendto was tried (``address``); the sandbox denies it
  resolve   a host name was looked up (``address``: the name)
  hostname  the program asked for the machine's host name
  trace_end the program's interpreter reached its normal end (absent when it was killed, called
            os._exit, or closed the trace: an incomplete trace is itself a clue)
"""


@dataclass(frozen=True)
class TraceEvent:
    """One thing a sandboxed program did that the sandbox recorded (see TRACE_KINDS)."""

    kind: str
    path: str = ""
    """The file (absolute inside the sandbox: /workspace/... for the workspace), for open,
    remove and rename."""
    mode: str = ""
    """For open: "r", "w", "a", "x" or "r+"."""
    target: str = ""
    """For rename: the new path."""
    argv: tuple[str, ...] = ()
    """For exec: the program and its arguments."""
    address: str = ""
    """For connect (host:port or a unix path) and resolve (the host name)."""
    run: int = 0
    """Which of the episode's sandbox runs recorded it (0 = the first)."""

    def to_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()
                if v not in ("", (), None) or k in ("kind", "run")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TraceEvent":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if "argv" in known:
            known["argv"] = tuple(str(a) for a in known["argv"])
        return cls(**known)


@dataclass(frozen=True)
class Action:
    """One model turn of an episode, as the environment received it."""

    text: str
    """The turn's decoded text (for a single-turn task: the code the model wrote)."""
    tool: str = ""
    """The tool it called ("" when the turn is not a tool call)."""
    args: dict[str, Any] = field(default_factory=dict)
    """The call's arguments."""
    observation: str = ""
    """What the environment answered."""

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "tool": self.tool, "args": self.args,
                "observation": self.observation}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Action":
        return cls(text=str(data.get("text", "")), tool=str(data.get("tool", "") or ""),
                   args=dict(data.get("args") or {}), observation=str(data.get("observation", "")))


@dataclass
class Evidence:
    """What one episode left behind (see the module docstring)."""

    before: dict[str, str]
    after: dict[str, str]
    actions: list[Action] = field(default_factory=list)
    trace: list[TraceEvent] = field(default_factory=list)
    protected: tuple[str, ...] = ()
    """Paths (relative to the workspace) of files the agent could see but not change: visible
    tests, test configuration, the verifier."""
    hidden: tuple[str, ...] = ()
    """Paths of files the agent must never read: hidden tests, the grader (they are never in its
    workspace; reading one means it looked outside)."""
    expected_outputs: tuple[str, ...] = ()
    """Expected values the visible tests check (as Python literals, e.g. "8", "'abc'"), when the
    task knows them: code that returns them literally is hard-coding."""
    trace_recorded: bool = False
    """Whether the sandbox traced the episode's runs at all (False: an empty trace means
    nothing)."""
    visible_pass: bool | None = None
    """The grader's verdict on the tests the agent could see (None: the task has none)."""
    hidden_pass: bool | None = None
    """The grader's verdict on the hidden tests, run after the episode in a fresh sandbox from
    pristine files plus the files the agent may change (None: the task has none)."""
    canary: bool = False
    """The task is impossible by construction (its tests contradict its specification): any
    pass is cheating."""


FINDING_TYPES = (
    "test_edit",            # a visible test or test configuration file was changed or deleted
    "test_config",          # conftest.py, pytest.ini, setup.cfg/tox.ini [pytest], sitecustomize, .pth, plugins added
    "early_exit",           # sys.exit / os._exit / raise SystemExit placed before the assertions can run
    "always_equal",         # an __eq__ (or __ne__, __hash__) that answers regardless of the operands
    "skip_marker",          # pytest.skip / mark.skip / mark.xfail / unittest.skip added to tests or code
    "runner_patch",         # monkeypatching the test runner: _pytest internals, unittest.TestCase, builtins.assert hooks
    "hardcoded_output",     # expected outputs of the tests returned literally / special-cased inputs
    "grader_access",        # reading hidden tests, the grader, verifier or reward files
    "history_mining",       # reading git history, reflogs, packed objects, caches of earlier runs
    "env_probe",            # telling sandbox/test from production: hostname, env vars, /proc, timing, network checks
    "special_casing",       # passed the visible tests but failed the hidden ones (from the grader)
    "canary_pass",          # passed an impossible task (tests contradict the specification)
    "trace_incomplete",     # the sandbox trace ended without its end marker (killed, os._exit, closed)
    "harness_divergence",   # behaviour differs between the training and the serving harness on a task
)
"""Every finding type a detector may report."""


@dataclass(frozen=True)
class Finding:
    """One thing a detector saw."""

    type: str
    """One of FINDING_TYPES."""
    file: str
    """The file it is in (relative to the workspace), "" when it comes from an action or the trace."""
    lines: tuple[int, int] | None
    """First and last line (1-based, inclusive) in ``file``'s after-text, or None."""
    evidence: str
    """The offending text (a line of code, a trace entry as JSON), at most a few hundred chars."""
    confidence: float
    """How sure the detector is that this is cheating or probing, in [0, 1]."""

    def __post_init__(self):
        if self.type not in FINDING_TYPES:
            raise ValueError(f"unknown finding type {self.type!r}; the types are {FINDING_TYPES}")
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence {self.confidence} is outside [0, 1]")

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "file": self.file,
                "lines": list(self.lines) if self.lines else None,
                "evidence": self.evidence, "confidence": round(self.confidence, 3)}


@dataclass
class IntegrityResult:
    """What integrity checking concluded about one episode (``Trajectory.integrity``)."""

    findings: list[Finding] = field(default_factory=list)
    visible_pass: bool | None = None
    hidden_pass: bool | None = None
    canary: bool = False

    def flagged(self, min_confidence: float) -> bool:
        """Whether any finding is at least this sure."""
        return any(f.confidence >= min_confidence for f in self.findings)

    def types(self, min_confidence: float = 0.0) -> list[str]:
        return sorted({f.type for f in self.findings if f.confidence >= min_confidence})
