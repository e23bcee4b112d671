"""The code an episode wrote, as every rule reads it: ``Unit`` (a file's changed lines, or a
snippet from an action), how the units are found (``changed_lines``, ``action_units``), and the
path helpers the rules share (``rel_path``, ``is_test_path``, ``GRADER_WORDS``). context.py
gathers one episode's units into a ``Context``; ast_helpers.py holds the AST helpers.

Only code the episode *wrote* is judged: for each workspace file the lines that differ between
before and after (difflib), plus code in the actions (a single-turn answer, a shell command, a
heredoc, ``python -c``). Python is read with ``ast`` (imports resolved, so ``from os import
_exit as q; q(0)`` is ``os._exit``); anything that does not parse, and shell commands, are
scanned line by line.
"""

from __future__ import annotations

import ast
import difflib
import re
import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from tidal.integrity.ast_helpers import build_aliases
from tidal.integrity.confidence import clip, conf
from tidal.evidence.records import Evidence, Finding


LARGE_DIFF = 25_000_000
"""Files whose line counts multiply past this are diffed as line sets (new lines only),
difflib being quadratic at worst."""

TEST_DIRS = {"tests", "test", "testing", "__tests__"}
GRADER_WORDS = ("hidden", "grader", "grading", "verifier", "expected_output", "expected-output",
                "expected", "reward", "solution", "answer", "ground_truth", "groundtruth",
                "ground-truth", "gold", "oracle", "judge", "private_test", "secret", "score")
"""Path components that name what grades an episode (a workspace file of the same name is the
task's own and is not counted)."""


def rel_path(path: str) -> str:
    """A workspace path as the evidence keys it: without ``/workspace/`` or leading ``./``."""
    path = path.removeprefix("/workspace/")
    while path.startswith("./"):
        path = path[2:]
    return path


def is_test_path(path: str) -> bool:
    """A visible test by its name: test_*.py, *_test.py, conftest.py, or under tests/."""
    p = PurePosixPath(path)
    name = p.name
    return (name.startswith("test_") or name.endswith(("_test.py", "_tests.py")) or name == "conftest.py"
            or any(part in TEST_DIRS for part in p.parts[:-1]))


# ---------------------------------------------------------------- units of changed code


@dataclass
class Unit:
    """One piece of code the episode wrote: a workspace file's after-text with the lines that
    changed, or a snippet from an action (``file`` then ""; every line counts)."""

    file: str
    text: str
    changed: frozenset[int] | None = None
    """1-based lines of ``text`` that are new or changed; None: all of them."""
    kind: str = "python"
    """"python", "shell" or "text"."""
    path: str = ""
    """The workspace path the code belongs to (for an action that writes a file), for context."""
    is_new: bool = True
    tree: ast.AST | None = None
    lines: list[str] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    parents: dict = field(default_factory=dict)
    nodes: list = field(default_factory=list)
    """Every AST node, walked once."""
    bindings: dict = field(default_factory=dict)
    """name -> the expressions bound to it (assignments, for-loop iterables)."""

    def __post_init__(self):
        self.lines = self.text.splitlines()
        if self.kind == "python":
            try:
                self.tree = ast.parse(self.text)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                self.tree = None
        if self.tree is not None:
            self.aliases = build_aliases(self.tree)
            self.nodes = list(ast.walk(self.tree))
            for node in self.nodes:
                for child in ast.iter_child_nodes(node):
                    self.parents[child] = node
                if isinstance(node, ast.Assign):
                    for t in node.targets:
                        if isinstance(t, ast.Name):
                            self.bindings.setdefault(t.id, []).append(node.value)
                elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
                    self.bindings.setdefault(node.target.id, []).append(node.iter)

    @property
    def where(self) -> str:
        return self.path or self.file

    @property
    def is_test(self) -> bool:
        return is_test_path(self.where) if self.where else False

    def touches(self, first: int, last: int | None = None) -> bool:
        if self.changed is None:
            return True
        return any(n in self.changed for n in range(first, (last or first) + 1))

    def node_touched(self, node) -> bool:
        first = getattr(node, "lineno", None)
        return first is not None and self.touches(first, getattr(node, "end_lineno", first))

    def finding(self, type_: str, key: str, first: int, last: int | None = None,
                confidence: float | None = None) -> Finding:
        last = last or first
        text = "\n".join(self.lines[first - 1:last]) if self.lines else self.text
        return Finding(type_, self.file, (first, last) if self.file else None, clip(text),
                       conf(key) if confidence is None else confidence)

    def at(self, type_: str, key: str, node, confidence: float | None = None) -> Finding:
        return self.finding(type_, key, node.lineno, getattr(node, "end_lineno", node.lineno), confidence)

    def changed_lines(self):
        """(line number, text) of every changed line."""
        for n, line in enumerate(self.lines, 1):
            if self.changed is None or n in self.changed:
                yield n, line


def changed_lines(before: str, after: str) -> frozenset[int]:
    """1-based lines of ``after`` that are new or replaced; a pure deletion marks the line that
    now stands where the deleted ones were."""
    a, b = before.splitlines(), after.splitlines()
    out: set[int] = set()
    if len(a) * len(b) > LARGE_DIFF:
        old = set(a)
        return frozenset(n for n, line in enumerate(b, 1) if line not in old)
    for tag, _i1, _i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            out.update(range(j1 + 1, j2 + 1))
        elif tag == "delete" and b:
            out.add(min(j1 + 1, len(b)))
    return frozenset(out)


def kind_of(path: str) -> str:
    if path.endswith((".py", ".pyi", ".pyw")):
        return "python"
    if path.endswith((".sh", ".bash", ".zsh")) or PurePosixPath(path).name in ("Makefile", "Dockerfile", "justfile"):
        return "shell"
    return "text"


FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
HEREDOC = re.compile(r"(?:cat|tee)\s*(?:>>?\s*)?(?P<path>[^\s<>|;&]+)?\s*<<-?\s*['\"]?(?P<tag>\w+)['\"]?[^\n]*\n(?P<body>.*?)\n\s*(?P=tag)\b", re.DOTALL)
PY_HEREDOC = re.compile(r"python[\d.]*\s+-\s*<<-?\s*['\"]?(?P<tag>\w+)['\"]?[^\n]*\n(?P<body>.*?)\n\s*(?P=tag)\b", re.DOTALL)
PY_DASH_C = re.compile(r"python[\d.]*\s+-c\s+(?P<q>['\"])(?P<body>.*?)(?<!\\)(?P=q)", re.DOTALL)
OLD_TEXT_KEYS = ("old", "old_str", "old_string", "old_text", "search", "find", "before", "original", "pattern")
"""Tool arguments that quote the file as it was (an edit's search text): not the episode's code."""
PATH_KEYS = ("path", "file", "filename", "file_path", "filepath", "target", "dest", "name")


def action_units(evidence: Evidence) -> list[Unit]:
    """Snippets of code in the actions: fenced blocks, heredocs, ``python -c`` bodies, shell
    commands, and a whole turn that parses as Python (a single-turn answer). Content an action
    wrote into a workspace file the before/after diff already covers is left to the diff."""
    units: list[Unit] = []
    seen: set[tuple[str, str]] = set()
    known = set(evidence.before) | set(evidence.after)

    def add(text: str, kind: str, path: str = ""):
        text = text.strip("\n")
        if not text.strip() or (text, kind) in seen:
            return
        seen.add((text, kind))
        units.append(Unit("", text, None, kind, path, path not in evidence.before))

    def patch(text: str):
        for target, added in diff_additions(text):
            if target not in known:
                add(textwrap.dedent("\n".join(added)), "python" if target.endswith(".py") else kind_of(target), target)

    def snippet(text: str, path: str = "", code_ok: bool = True):
        if DIFF_START.search(text):
            patch(text)
        blocks = FENCE.findall(text)
        for lang, body in blocks:
            lang = lang.lower()
            if lang in ("diff", "patch", "udiff"):
                continue
            if lang in ("bash", "sh", "shell", "console", "zsh"):
                shell(body)
            elif not code_ok:
                continue
            elif lang in ("python", "py", "python3") or parses(body):
                add(body, "python", path)
            else:
                shell(body)
        if blocks:
            return
        if not code_ok:
            if not parses(text):
                shell(text)
            return
        if (path and path.endswith(".py")) or (not path and parses(text) and looks_like_code(text)):
            add(text, "python", path)
        elif path:
            add(text, kind_of(path), path)
        else:
            code = code_part(text)
            if code:
                add(code, "python")
            shell(text)

    def shell(text: str):
        for m in HEREDOC.finditer(text):
            target = rel_path(m.group("path") or "") if m.group("path") else ""
            if target and target in known:
                continue
            add(m.group("body"), "python" if target.endswith(".py") or parses(m.group("body")) else "text", target)
        for rx in (PY_HEREDOC, PY_DASH_C):
            for m in rx.finditer(text):
                add(m.group("body").replace('\\"', '"'), "python")
        add(HEREDOC.sub("", text), "shell")

    for action in evidence.actions:
        args = action.args if isinstance(action.args, dict) else {}
        path = next((str(args[k]) for k in PATH_KEYS if isinstance(args.get(k), str) and "/" in str(args[k]) or
                     isinstance(args.get(k), str) and "." in str(args[k])), "")
        path = rel_path(path) if path else ""
        covered = bool(path) and path in known
        snippet(action.text or "", path, code_ok=not covered)
        for key, value in flat_strings(args):
            if key in PATH_KEYS or key in OLD_TEXT_KEYS:
                continue
            if covered and key not in ("command", "cmd", "script", "shell"):
                continue
            if key in ("command", "cmd", "script", "shell"):
                shell(value)
            else:
                snippet(value, path)
    return units


DIFF_START = re.compile(r"^(diff --git |--- a/|\+\+\+ b/|--- \S+\n\+\+\+ )", re.MULTILINE)


def diff_additions(text: str) -> list[tuple[str, list[str]]]:
    """(path, added lines) of each file in a unified diff (an answer given as a patch)."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("+++ "):
            target = line[4:].split("\t")[0].strip()
            target = target.removeprefix("b/")
            out.append((target, []))
        elif out and line.startswith("+"):
            out[-1][1].append(line[1:])
    return [(t, lines) for t, lines in out if lines and t != "/dev/null"]


CODE_START = re.compile(r"^(def |class |import |from [\w.]+ import |@\w|async def |if __name__)")


def code_part(text: str) -> str | None:
    """The Python in a turn of prose and unfenced code: from the first line that starts a
    definition or an import, with up to 10 trailing lines of prose dropped until it parses."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if CODE_START.match(line)), None)
    if start is None:
        return None
    body = lines[start:]
    for _ in range(min(10, len(body))):
        chunk = "\n".join(body)
        if parses(chunk):
            return chunk
        body = body[:-1]
    return None


def flat_strings(value, key: str = ""):
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from flat_strings(v, str(k))
    elif isinstance(value, (list, tuple)):
        if value and all(isinstance(v, str) for v in value) and key in ("command", "cmd", "argv", "args"):
            yield "command", shlex.join(value)
        else:
            for v in value:
                yield from flat_strings(v, key)


def parses(text: str) -> bool:
    try:
        ast.parse(text)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def looks_like_code(text: str) -> bool:
    """A turn that parses as Python and is code, not one bare word or sentence-like name."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(not isinstance(n, ast.Expr) or isinstance(n.value, ast.Call) for n in tree.body)
