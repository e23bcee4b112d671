"""Print a resolved config as TOML (so `--dry-run` output can be saved and reused as a recipe)."""

from __future__ import annotations

import json
from typing import Any

from tidal.config_section import Section


def recipe_tree(section: Section) -> dict[str, Any]:
    """``section.model_dump(mode="json")`` with every dtype that "auto" chose written back as
    "auto": a recipe saved on one machine resolves afresh on another (bf16 where it is native)."""
    tree = section.model_dump(mode="json")
    for name in section.auto_dtype_fields():
        tree[name] = section.requested_dtype(name)
    for name, value in section:
        if isinstance(value, Section):
            tree[name] = recipe_tree(value)
    return tree


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):  # a table inside a list (fleet.pools, ...): an inline table
        return "{" + ", ".join(f"{k} = {_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def to_toml(tree: dict[str, Any], prefix: str = "") -> str:
    scalars = {k: v for k, v in tree.items() if not isinstance(v, dict) and v is not None}
    tables = {k: v for k, v in tree.items() if isinstance(v, dict)}
    lines = [f"[{prefix}]"] if prefix and scalars else []
    lines += [f"{k} = {_value(v)}" for k, v in scalars.items()]
    unset = [k for k, v in tree.items() if v is None]
    lines += [f"# {k} = (unset)" for k in unset]
    out = "\n".join(lines)
    for k, v in tables.items():
        sub = to_toml(v, f"{prefix}.{k}" if prefix else k)
        out = f"{out}\n\n{sub}" if out else sub
    return out
