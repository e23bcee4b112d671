"""``Context``: one episode prepared once for every rule: its units (code_units.py) and the
literals the visible tests feed in and check for (``test_literals``), which the hard-coded-output
rules compare the episode's code with. Apart from code_units.py, which finds the code, because this
reads the task's own tests."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from tidal.evidence.records import Evidence
from tidal.integrity.ast_helpers import LITERAL_ERRORS, literal_norm, nontrivial_norm, norm_literal_text, norm_value, trivial
from tidal.integrity.code_units import Unit, action_units, changed_lines, is_test_path, kind_of, rel_path


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
