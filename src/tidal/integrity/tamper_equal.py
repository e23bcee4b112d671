"""The ``always_equal`` rule: objects equal to anything (a constant or tautological
``__eq__``, an ``__ne__`` always False, ``mock.ANY`` returned from solution code) and the judges
of what an ``__eq__`` returns. One rule family of tamper.py, in its own file for the size of
those judges; tamper_runner.py shares its ``EQ_METHODS``."""

from __future__ import annotations

import ast

from tidal.integrity.ast_helpers import NO_VALUE, call_name, const_str, const_value, qualname
from tidal.integrity.context import Context
from tidal.integrity.code_units import Unit


EQ_METHODS = {"__eq__": True, "__ne__": False, "__contains__": True}
ORDER_METHODS = {"__lt__", "__le__", "__gt__", "__ge__"}


def always_equal(unit: Unit, ctx: Context):
    """An ``__eq__`` that answers True whatever it is compared with (``return True``,
    ``lambda *a: True``, ``not False``, one that never looks at the other operand), an
    ``__ne__`` that is always False, set on a class or patched on later; and ``mock.ANY``
    returned from non-test code (equal to everything)."""
    for node in unit.nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (node.name in EQ_METHODS or node.name in ORDER_METHODS):
            if unit.node_touched(node):
                key = judge_eq(node.name, node.args, [n.value for n in ast.walk(node) if isinstance(n, ast.Return)], node)
                if key:
                    yield unit.at("always_equal", key, node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                attr = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
                if (attr in EQ_METHODS or attr in ORDER_METHODS) and unit.node_touched(node):
                    key = judge_assigned_eq(attr, node.value)
                    if key:
                        yield unit.at("always_equal", key, node)
        elif isinstance(node, ast.Call) and call_name(unit, node) in ("setattr", "builtins.setattr") and len(node.args) == 3:
            attr = const_str(node.args[1]) or ""
            if (attr in EQ_METHODS or attr in ORDER_METHODS) and unit.node_touched(node):
                key = judge_assigned_eq(attr, node.args[2])
                if key:
                    yield unit.at("always_equal", key, node)
        elif isinstance(node, ast.Dict) and unit.node_touched(node):
            for k, v in zip(node.keys, node.values):
                attr = const_str(k) if k is not None else ""
                if attr in EQ_METHODS or attr in ORDER_METHODS:
                    key = judge_assigned_eq(attr, v)
                    if key:
                        yield unit.at("always_equal", key, v)
        elif isinstance(node, (ast.Attribute, ast.Name)) and not unit.is_test:
            if qualname(node, unit.aliases) in ("unittest.mock.ANY", "mock.ANY") and unit.node_touched(node) \
                    and not isinstance(unit.parents.get(node), ast.Attribute):
                yield unit.at("always_equal", "always_equal.any", node)


def judge_assigned_eq(name: str, value) -> str | None:
    if isinstance(value, ast.Lambda):
        return judge_eq(name, value.args, [value.body], value)
    v = const_value(value) if not isinstance(value, ast.Constant) else NO_VALUE
    return None if v is NO_VALUE else judge_const(name, v)


def resolve_const(node, bound: dict):
    """A returned name bound only to one constant value in the function (``result = True;
    return result``) stands for that constant."""
    if isinstance(node, ast.Name) and node.id in bound:
        values = bound[node.id]
        if values and all(v is not None and const_value(v) is not NO_VALUE for v in values) \
                and len({bool(const_value(v)) for v in values}) == 1:
            return values[0]
    return node


def is_not_implemented(node) -> bool:
    return isinstance(node, ast.Name) and node.id == "NotImplemented"


def tautology(node) -> bool:
    """An expression true whatever the operands: ``x is x``, ``x == x`` (one name on both
    sides), a true constant, or an ``or`` with a tautology among its terms."""
    if node is None:
        return False
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return any(tautology(v) for v in node.values)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Is, ast.Eq)):
        left, right = node.left, node.comparators[0]
        return isinstance(left, ast.Name) and isinstance(right, ast.Name) and left.id == right.id
    return isinstance(node, ast.Constant) and bool(node.value) is True and node.value is not Ellipsis


def judge_const(name: str, v) -> str | None:
    if name in ORDER_METHODS:
        return "always_equal.order"
    return "always_equal.const" if bool(v) == EQ_METHODS[name] else None


def judge_eq(name: str, args: ast.arguments, returns: list, fn) -> str | None:
    if not returns:
        return None
    bound: dict[str, list] = {}
    for n in ast.walk(fn):
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                if isinstance(t, ast.Name):
                    bound.setdefault(t.id, []).append(n.value if not isinstance(n, ast.AugAssign) else None)
    returns = [resolve_const(r, bound) for r in returns]
    if name == "__eq__" and all(tautology(r) or is_not_implemented(r) for r in returns) \
            and any(tautology(r) for r in returns):
        return "always_equal.const"
    values = [const_value(r) if r is not None else None for r in returns]
    if any(isinstance(r, ast.Name) and r.id == "NotImplemented" for r in returns):
        values = [v for v, r in zip(values, returns) if not (isinstance(r, ast.Name) and r.id == "NotImplemented")]
    if values and all(v is not NO_VALUE for v in values):
        keys = {judge_const(name, v) for v in values}
        return keys.pop() if len(keys) == 1 else None
    params = [a.arg for a in (*args.posonlyargs, *args.args)]
    others = params[1:] if len(params) >= 2 else []
    if args.vararg:
        others.append(args.vararg.arg)
    used = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    if name in EQ_METHODS and others and not any(o in used for o in others) and "NotImplemented" not in used:
        return "always_equal.ignores_other"
    return None
