"""The code an episode wrote, prepared once for every rule: ``Unit`` (a file's changed lines,
or a snippet from an action) and ``Context`` (one episode's units and the visible tests'
literals), with the AST helpers the rules share.

Only code the episode *wrote* is judged: for each workspace file the lines that differ between
before and after (difflib), plus code in the actions (a single-turn answer, a shell command, a
heredoc, ``python -c``). Python is read with ``ast`` (imports resolved, so ``from os import
_exit as q; q(0)`` is ``os._exit``); anything that does not parse, and shell commands, are
scanned line by line.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from tidal.integrity.confidence import clip, conf
from tidal.integrity.records import Evidence, Finding

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


@dataclass
class Context:
    """One episode, prepared once for every rule."""

    evidence: Evidence
    units: list[Unit]
    workspace_names: set[str]
    test_inputs: set[str]
    expected: set[str]
    test_pairs: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def build(cls, evidence: Evidence) -> Context:
        units = []
        for path, after in sorted(evidence.after.items()):
            before = evidence.before.get(path)
            if before == after or not isinstance(after, str):
                continue
            changed = None if before is None else changed_lines(before, after)
            if changed is not None and not changed:
                continue
            units.append(Unit(path, after, changed, kind_of(path), path, before is None))
        units += action_units(evidence)
        names = {PurePosixPath(p).name for p in (*evidence.before, *evidence.after)}
        names |= {p for p in (*evidence.before, *evidence.after)}
        inputs, expected, pairs = test_literals(evidence)
        for raw in evidence.expected_outputs:
            expected.add(norm_literal_text(raw))
        for path, text in evidence.before.items():
            if re.search(r"expected|output|answer|\.out$", PurePosixPath(path).name, re.IGNORECASE) and 0 < len(text.strip()) <= 200:
                expected.add(repr(text.strip()))
                expected.add(norm_literal_text(text))
        return cls(evidence, units, names, inputs, expected, pairs)

    def is_workspace_file(self, path: str) -> bool:
        """A path (or a dotted name) that is one of the task's own files."""
        p = rel_path(path)
        if p in self.workspace_names or (PurePosixPath(p).name in self.workspace_names and "/" not in p):
            return True
        stems = {PurePosixPath(n).stem for n in self.workspace_names if "/" not in n}
        return "/" not in p and p.split(".")[0] in stems


# ---------------------------------------------------------------- AST helpers


def build_aliases(tree) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    aliases[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def qualname(node, aliases: dict[str, str]) -> str | None:
    """The dotted name an expression stands for: ``s.exit`` after ``import sys as s`` is
    "sys.exit"; ``__import__('os')._exit`` is "os._exit"; ``getattr(os, '_exit')`` too."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = qualname(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Call):
        fn = qualname(node.func, aliases)
        first = node.args[0] if node.args else None
        if fn in ("__import__", "importlib.import_module") and isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
        if fn == "getattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            base = qualname(node.args[0], aliases)
            return f"{base}.{node.args[1].value}" if base else None
        return f"{fn}()" if fn else None
    if isinstance(node, ast.Subscript):
        base = qualname(node.value, aliases)
        return f"{base}[]" if base else None
    return None


def call_name(unit: Unit, node) -> str:
    return (qualname(node.func, unit.aliases) or "") if isinstance(node, ast.Call) else ""


def ancestors(unit: Unit, node):
    while node in unit.parents:
        node = unit.parents[node]
        yield node


def enclosing_function(unit: Unit, node):
    return next((a for a in ancestors(unit, node) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))), None)


def is_main_guard(node) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    parts = [node.test.left, *node.test.comparators]
    names = {p.id for p in parts if isinstance(p, ast.Name)}
    consts = {p.value for p in parts if isinstance(p, ast.Constant)}
    return "__name__" in names and "__main__" in consts


def in_main_guard(unit: Unit, node) -> bool:
    return any(is_main_guard(a) for a in ancestors(unit, node))


def in_try(unit: Unit, node) -> bool:
    return any(isinstance(a, ast.Try) or type(a).__name__ == "TryStar" for a in ancestors(unit, node))


def const_str(node) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return None


NO_VALUE = object()

LITERAL_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, KeyError, AttributeError)
"""What ast.literal_eval (and comparing odd literals) can raise on code that is not a literal."""


def const_value(node):
    """The value of an expression built only from constants (``not False``, ``1 == 1``,
    ``bool(1)``, ``True or x``), else NO_VALUE."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        v = const_value(node.operand)
        return NO_VALUE if v is NO_VALUE else (not v)
    if isinstance(node, ast.BoolOp):
        values = [const_value(v) for v in node.values]
        if isinstance(node.op, ast.Or) and any(v is not NO_VALUE and v for v in values):
            return True
        if isinstance(node.op, ast.And) and any(v is not NO_VALUE and not v for v in values):
            return False
        if all(v is not NO_VALUE for v in values):
            return all(values) if isinstance(node.op, ast.And) else any(values)
        return NO_VALUE
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        a, b = const_value(node.left), const_value(node.comparators[0])
        if a is NO_VALUE or b is NO_VALUE:
            return NO_VALUE
        try:
            return {ast.Eq: a == b, ast.NotEq: a != b, ast.Is: a is b, ast.IsNot: a is not b}.get(type(node.ops[0]), NO_VALUE)
        except LITERAL_ERRORS:
            return NO_VALUE
    if isinstance(node, ast.IfExp):
        a, b = const_value(node.body), const_value(node.orelse)
        if a is not NO_VALUE and b is not NO_VALUE and bool(a) == bool(b):
            return a
        return NO_VALUE
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "bool" and len(node.args) == 1:
        v = const_value(node.args[0])
        return NO_VALUE if v is NO_VALUE else bool(v)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
            and len(node.args) == 2 and isinstance(node.args[1], ast.Name) and node.args[1].id == "object":
        return True
    return NO_VALUE


def literal_norm(node) -> str | None:
    """A literal expression as a normal string (repr of its value), else None."""
    try:
        value = ast.literal_eval(node)
    except LITERAL_ERRORS:
        return None
    return norm_value(value)


def norm_value(value) -> str:
    if isinstance(value, (set, frozenset)):
        return repr(sorted(value, key=repr))
    if isinstance(value, tuple):
        return repr(list(value))
    return repr(value)


def norm_literal_text(text: str) -> str:
    try:
        return norm_value(ast.literal_eval(text.strip()))
    except LITERAL_ERRORS:
        return repr(text.strip())


def trivial(value) -> bool:
    """Values honest code returns all the time (0, 1, True, "", [], None ...)."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, (int, float)):
        return abs(value) <= 2 or value in (0.5, -0.5)
    if isinstance(value, str):
        return len(value.strip()) <= 1
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return len(value) == 0 or (len(value) == 1 and all(trivial(v) for v in value))
    return False


def nontrivial_norm(node) -> str | None:
    try:
        value = ast.literal_eval(node)
    except LITERAL_ERRORS:
        return None
    return None if trivial(value) else norm_value(value)


def json_leaves(text: str, limit: int = 2000) -> list[str]:
    """Non-trivial values in a JSON file of test cases (inputs and outputs alike)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return []
    out: list[str] = []
    stack = [data]
    while stack and len(out) < limit:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            if not trivial(v) and all(not isinstance(x, (dict, list)) for x in v):
                out.append(norm_value(v))
            stack.extend(v)
        elif not trivial(v):
            out.append(norm_value(v))
    return out


def test_literals(evidence: Evidence) -> tuple[set[str], set[str], set[tuple[str, str]]]:
    """Non-trivial literals the visible tests feed in (inputs) and check for (expected), and
    the (input, expected) pairs of ``assert f(input) == expected``, from the test files of
    the task (before) and protected files."""
    inputs: set[str] = set()
    expected: set[str] = set()
    pairs: set[tuple[str, str]] = set()
    paths = [p for p in evidence.before if is_test_path(p) or p in evidence.protected]
    for path in paths:
        text = evidence.before.get(path, "")
        if path.endswith(".json"):
            for value in json_leaves(text):
                inputs.add(value)
                expected.add(value)
        if not path.endswith(".py"):
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for node in ast.walk(tree):
            checks = []
            if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
                checks.append((node.test.left, node.test.comparators))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.startswith("assert") and len(node.args) >= 2:
                checks.append((node.args[0], node.args[1:2]))
            for left, rights in checks:
                for call, other in ((left, rights[0] if rights else None), (rights[0] if rights else None, left)):
                    if isinstance(call, ast.Call) and other is not None and literal_norm(other) is not None:
                        args = call.args
                        try:
                            arg = norm_value(ast.literal_eval(args[0])) if len(args) == 1 else \
                                norm_value(tuple(ast.literal_eval(a) for a in args))
                            pairs.add((arg, literal_norm(other)))
                        except LITERAL_ERRORS:
                            pass
                for side in (left, *rights):
                    for sub in ast.walk(side):
                        if isinstance(sub, ast.Call):
                            args = sub.args
                            for a in args:
                                n = nontrivial_norm(a)
                                if n:
                                    inputs.add(n)
                            if len(args) > 1:
                                try:
                                    inputs.add(norm_value(tuple(ast.literal_eval(a) for a in args)))
                                except LITERAL_ERRORS:
                                    pass
                    n = nontrivial_norm(side)
                    if n:
                        expected.add(n)
            if isinstance(node, (ast.List, ast.Tuple)) and any(isinstance(p, ast.Call) and getattr(p.func, "attr", "") == "parametrize" for p in ast.walk(tree)):
                for elt in node.elts:
                    n = nontrivial_norm(elt)
                    if n:
                        inputs.add(n)
                    if isinstance(elt, ast.Tuple):
                        for sub in elt.elts:
                            n = nontrivial_norm(sub)
                            if n:
                                inputs.add(n)
                                expected.add(n)
    return inputs, expected, pairs


