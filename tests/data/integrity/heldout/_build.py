"""The episode builder the held-out suite's generator uses (see README.md).

An ``Ep`` starts from a task's workspace and records what an agent did, the way the harness
and the sandbox would: tool calls as actions, and for every sandbox run its exec event, the
opens the audit hooks see (protected files, files outside the workspace, write-mode opens),
and the closing ``trace_end`` unless the run ended abnormally.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field


@dataclass
class Task:
    """A task's pristine workspace and what the grader knows about it."""

    name: str
    files: dict[str, str]
    protected: tuple[str, ...]
    hidden: tuple[str, ...]
    expected: tuple[str, ...] = ()
    test_cmd: tuple[str, ...] = ("python", "-m", "pytest", "-q")
    canary: bool = False


@dataclass
class Ep:
    id: str
    label: str
    kind: str
    description: str
    task: Task
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)
    actions: list[dict] = field(default_factory=list)
    trace: list[dict] = field(default_factory=list)
    runs: int = 0

    def __post_init__(self):
        self.before = dict(self.task.files)
        self.after = dict(self.task.files)

    # --- tools ---------------------------------------------------------------------------
    def say(self, text: str) -> "Ep":
        self.actions.append({"text": text, "tool": "", "args": {}, "observation": ""})
        return self

    def read(self, path: str, text: str = "", obs: str | None = None) -> "Ep":
        if obs is None:
            obs = self.after.get(path, f"error: no such file: {path}")
        self.actions.append({"text": text or f"Let me look at {path}.", "tool": "read_file",
                             "args": {"path": path}, "observation": obs})
        return self

    def write(self, path: str, content: str, text: str = "") -> "Ep":
        self.after[path] = content
        self.actions.append({"text": text or f"Writing {path}.", "tool": "write_file",
                             "args": {"path": path, "content": content}, "observation": "ok"})
        return self

    def delete(self, path: str) -> None:
        self.after.pop(path, None)

    def _run_events(self, argv, opens_protected: bool, events, end: bool) -> None:
        n = self.runs
        self.runs += 1
        self.trace.append({"kind": "exec", "argv": list(argv), "run": n})
        if opens_protected:
            for p in self.task.protected:
                if p in self.after:
                    self.trace.append({"kind": "open", "path": "/workspace/" + p, "mode": "r",
                                       "run": n})
        for e in events:
            self.trace.append({**e, "run": n})
        if end:
            self.trace.append({"kind": "trace_end", "run": n})

    def run(self, cmd: str, obs: str, text: str = "", events=(), end: bool = True) -> "Ep":
        """A shell command: the sandbox sees /bin/sh start; only Python children record more."""
        self.actions.append({"text": text or "Running a command.", "tool": "run",
                             "args": {"cmd": cmd}, "observation": obs})
        self._run_events(["/bin/sh", "-c", cmd], False, events, end)
        return self

    def tests(self, obs: str, text: str = "", events=(), end: bool = True) -> "Ep":
        self.actions.append({"text": text or "Running the tests.", "tool": "run_tests",
                             "args": {}, "observation": obs})
        self._run_events(self.task.test_cmd, True, events, end)
        return self

    def submit(self, text: str = "Done.") -> "Ep":
        self.actions.append({"text": text, "tool": "submit", "args": {}, "observation": ""})
        return self

    # --- single-function tasks -----------------------------------------------------------
    def body(self, body: str, obs: str, events=(), end: bool = True) -> "Ep":
        """The single-turn form: the action text is the function body, appended to f.py."""
        self.after["f.py"] = self.before["f.py"] + body
        self.actions.append({"text": body, "tool": "", "args": {}, "observation": obs})
        self._run_events(self.task.test_cmd, True, events, end)
        return self

    def done(self, visible, hidden) -> dict:
        return {"id": self.id, "label": self.label, "kind": self.kind,
                "description": self.description, "before": self.before, "after": self.after,
                "actions": self.actions, "trace": self.trace,
                "protected": list(self.task.protected), "hidden": list(self.task.hidden),
                "expected_outputs": list(self.task.expected), "trace_recorded": True,
                "visible_pass": visible, "hidden_pass": hidden, "canary": self.task.canary}


def sh(cmd: str) -> list[str]:
    return shlex.split(cmd)


def py_run(cmd_argv: list[str], n_events) -> list[dict]:
    """The events a Python child of a shell command records: its exec, then what it did."""
    return [{"kind": "exec", "argv": cmd_argv}, *n_events]


PASS = "3 passed in 0.04s"
FAIL1 = "1 failed, 2 passed in 0.05s"


class Src(str):
    """Task text whose replace() fails loudly when the old text is absent (a silent no-op would
    leave an episode's 'after' equal to its 'before')."""

    def replace(self, old, new, count=-1):  # type: ignore[override]
        if old not in self:
            raise ValueError(f"text to replace not found: {old[:60]!r}")
        return Src(str.replace(self, old, new, count))


def wrap_texts(namespace: dict) -> None:
    for k, v in list(namespace.items()):
        if k.isupper() and type(v) is str:
            namespace[k] = Src(v)
