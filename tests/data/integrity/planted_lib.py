"""Builders for the planted-hack suite: an episode on a workspace, recorded the way tidal's sandbox
and harness record one (see make_planted.py for why the suite exists and how it was written).

An ``Ep`` starts from a task's files and replays the agent's turns: reads, writes, shell commands
(each one sandbox run, traced) and test runs. The workspace it ends with is the case's ``after``,
so before/after/actions/trace always agree with each other.
"""

from __future__ import annotations

import json
import shlex
import textwrap

SHELL_CHARS = set("|&;<>()$`*?{}'\"\\")


class Src(str):
    """File text whose ``replace`` fails loudly when the old text is not there, so an edit an
    episode describes is always an edit the after-text really has."""

    def replace(self, old, new, count=-1):
        if old not in self:
            raise ValueError(f"edit does not apply: {old[:60]!r} not in {self[:60]!r}...")
        return Src(str.replace(self, old, new, count))

    def __add__(self, other):
        return Src(str.__add__(self, other))

    def __radd__(self, other):
        return Src(str.__add__(other, self))


def dedent(text: str) -> Src:
    """Source text written indented inside the generator, as a file holds it."""
    return Src(textwrap.dedent(text).lstrip("\n"))


def call_text(thought: str, tool: str, args: dict) -> str:
    """A tool-calling turn as the model writes it: a short thought, then the call."""
    call = json.dumps({"name": tool, "args": args})
    return f"{thought}\n<call>{call}</call>" if thought else f"<call>{call}</call>"


def argv_of(cmd: str) -> list[str]:
    """What the sandbox's exec event records for a shell command."""
    if any(c in SHELL_CHARS for c in cmd):
        return ["sh", "-c", cmd]
    return shlex.split(cmd)


def ev(kind: str, run: int = 0, **fields) -> dict:
    out = {"kind": kind, **{k: v for k, v in fields.items() if v not in ("", (), None, [])}}
    out["run"] = run
    return out


class Ep:
    """One episode on a workspace (``before``); protected/hidden as the task declares them."""

    def __init__(self, before: dict[str, str], protected=(), hidden=(), trace_recorded=True):
        self.before = dict(before)
        self.ws = dict(before)
        self.protected = list(protected)
        self.hidden = list(hidden)
        self.actions: list[dict] = []
        self.trace: list[dict] = []
        self.runs = 0
        self.trace_recorded = trace_recorded

    # -- turns -------------------------------------------------------------------------------
    def read(self, path: str, thought: str = "", observation: str | None = None) -> Ep:
        obs = observation if observation is not None else self.ws.get(
            path, f"error: {path}: no such file")
        self.actions.append({"text": call_text(thought, "read_file", {"path": path}),
                             "tool": "read_file", "args": {"path": path}, "observation": obs})
        return self

    def write(self, path: str, content: str, thought: str = "") -> Ep:
        self.ws[path] = content
        self.actions.append({"text": call_text(thought, "write_file",
                                               {"path": path, "content": content}),
                             "tool": "write_file", "args": {"path": path, "content": content},
                             "observation": f"wrote {len(content)} bytes to {path}"})
        return self

    def sh(self, cmd: str, observation: str = "", thought: str = "", events=(), effects=None,
           end: bool = True, exec_argv=None) -> Ep:
        """A shell command: one sandbox run. ``events`` are the trace events it records after
        its own exec (kind, fields); ``effects`` maps paths to new text (None: deleted)."""
        for path, text in (effects or {}).items():
            if text is None:
                self.ws.pop(path, None)
            else:
                self.ws[path] = text
        self.actions.append({"text": call_text(thought, "run", {"cmd": cmd}), "tool": "run",
                             "args": {"cmd": cmd}, "observation": observation})
        self._run(exec_argv or argv_of(cmd), events, end)
        return self

    def test(self, observation: str, thought: str = "", events=(), end: bool = True,
             opens=None) -> Ep:
        """run_tests: pytest over the workspace; it opens the protected test files (recorded)."""
        self.actions.append({"text": call_text(thought, "run_tests", {}), "tool": "run_tests",
                             "args": {}, "observation": observation})
        reads = [("open", {"path": f"/workspace/{p}", "mode": "r"})
                 for p in (self.protected if opens is None else opens) if p in self.ws]
        self._run(["python", "-m", "pytest", "-q"], reads + list(events), end)
        return self

    def say(self, text: str) -> Ep:
        """A turn that calls no tool (the model thinking aloud)."""
        self.actions.append({"text": text, "tool": "", "args": {}, "observation": ""})
        return self

    def submit(self, text: str = "Done.") -> Ep:
        self.actions.append({"text": call_text(text, "submit", {}), "tool": "submit", "args": {},
                             "observation": "submitted"})
        return self

    def _run(self, argv, events, end):
        run = self.runs
        self.runs += 1
        if not self.trace_recorded:
            return
        self.trace.append(ev("exec", run, argv=list(argv)))
        for kind, fields in events:
            self.trace.append(ev(kind, run, **fields))
        if end:
            self.trace.append(ev("trace_end", run))

    # -- the case ----------------------------------------------------------------------------
    def case(self, id: str, label: str, kind: str, description: str, *, visible_pass,
             hidden_pass, expected=(), canary=False) -> dict:
        return {"id": id, "label": label, "kind": kind, "description": description,
                "before": self.before, "after": self.ws, "actions": self.actions,
                "trace": self.trace if self.trace_recorded else [],
                "protected": self.protected, "hidden": self.hidden,
                "expected_outputs": list(expected), "trace_recorded": self.trace_recorded,
                "visible_pass": visible_pass, "hidden_pass": hidden_pass, "canary": canary}


def func_case(id: str, label: str, kind: str, description: str, *, stub: str, body: str,
              test: str, visible_pass, hidden_pass, expected=(), canary=False, hidden=True,
              events=(), end=True, test_after=None, observation=None, runner="python") -> dict:
    """A single-function task: the model writes ``body`` under ``stub`` in f.py; the visible
    example test is test_f.py, run once in the sandbox (``runner`` test_f.py)."""
    stub, test = dedent(stub), dedent(test)
    body = dedent(body)
    body = textwrap.indent(body, "    ")
    after_test = dedent(test_after) if test_after is not None else test
    if observation is None:
        observation = "ok" if visible_pass else "AssertionError"
    argv = ["python", "test_f.py"] if runner == "python" else ["python", "-m", "pytest", "-q",
                                                                 "test_f.py"]
    trace = [ev("exec", 0, argv=argv), ev("open", 0, path="/workspace/test_f.py", mode="r")]
    trace += [ev(k, 0, **f) for k, f in events]
    if end:
        trace.append(ev("trace_end", 0))
    return {"id": id, "label": label, "kind": kind, "description": description,
            "before": {"f.py": stub, "test_f.py": test},
            "after": {"f.py": stub + body, "test_f.py": after_test},
            "actions": [{"text": body, "tool": "", "args": {}, "observation": observation}],
            "trace": trace, "protected": ["test_f.py"],
            "hidden": ["hidden/test_f_hidden.py"] if hidden else [],
            "expected_outputs": list(expected), "trace_recorded": True,
            "visible_pass": visible_pass, "hidden_pass": hidden_pass if hidden else None,
            "canary": canary}
