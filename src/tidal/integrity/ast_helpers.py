"""The AST helpers every rule shares: dotted names resolved through a unit's imports
(``qualname``, ``call_name``), walks up the tree (``ancestors``, ``enclosing_function``,
``in_main_guard``), constant folding and normalised literals (``const_value``, ``literal_norm``,
``trivial``). Apart from code_units.py: they read single nodes and need nothing of an episode."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidal.integrity.code_units import Unit


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
