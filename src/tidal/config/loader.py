"""TOML + dotted command-line overrides -> a validated TidalConfig, or one clear ConfigError."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from tidal.config.run import MOVED_KEYS
from tidal.errors import UserError

if TYPE_CHECKING:
    from tidal.config import TidalConfig


class ConfigError(UserError, ValueError):
    """A config the user wrote is wrong; the message names the key and what to fix."""


def parse_value(text: str) -> Any:
    """Parse an override value the way TOML would (numbers, booleans, lists); else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["--trainer.lr", "1e-6", "--engine.top_p=0.9"]`` -> ``{"trainer.lr": 1e-6, ...}``."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"expected an override like --section.key VALUE, got {arg!r}")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ConfigError(f"override --{key} needs a value")
            value = args[i + 1]
            i += 2
        if "." not in key:
            raise ConfigError(f"override --{key} must name a section and a key, like --trainer.lr")
        out[key] = parse_value(value)
    return out


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot override {dotted!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _explain(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(config)"
        if e["type"] == "extra_forbidden" and where in MOVED_KEYS:
            lines.append(_moved(where, MOVED_KEYS[where]))
        elif e["type"] == "extra_forbidden" and len(e["loc"]) == 1:
            lines.append(f"unknown config section [{where}]: check its spelling; a section an "
                         "extension adds comes from its `tidal.sections` entry point, which an "
                         "install writes (tidal's own [online]: bash scripts/setup.sh)")
        elif e["type"] == "extra_forbidden":
            lines.append(f"unknown config key '{where}': remove it or check its spelling")
        else:
            lines.append(f"{where}: {e['msg'].removeprefix('Value error, ')}")
    return "invalid config:\n  " + "\n  ".join(lines)


def _moved(old: str, new: str) -> str:
    """The error for a key or a whole section that now lives elsewhere."""
    if "." not in new:
        return (f"config section [{old}] is now a section of its own: write it as [{new}] in a "
                f"recipe, or --{new}.<key> on the command line (was --{old}.<key>)")
    section, key = new.rsplit(".", 1)
    return (f"config key '{old}' moved to '{new}': write it as [{section}] {key} = ... in a "
            f"recipe, or --{new} on the command line")


def _merge(tree: dict[str, Any], top: dict[str, Any]) -> None:
    """``top``'s keys into ``tree``, section by section (``top`` wins)."""
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            _merge(tree[key], value)
        else:
            tree[key] = value


RECIPES = Path(__file__).resolve().parent.parent / "recipes"
"""Named recipes shipped with tidal (``tidal train smollm2`` reads recipes/smollm2.toml)."""


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES.glob("*.toml"))


def recipe_path(path: str | Path) -> Path:
    """A TOML file, or the name of a shipped recipe (a file of that name wins)."""
    p = Path(path)
    if p.is_file():
        return p
    named = RECIPES / f"{path}.toml"
    if p.suffix == "" and named.is_file():
        return named
    raise ConfigError(f"config file not found: {p} (nor a shipped recipe of that name: "
                      f"{', '.join(recipe_names())})")


def load_config(path: str | Path | None = None, overrides: list[str] | dict | None = None,
                defaults: dict[str, Any] | None = None) -> "TidalConfig":
    """Read TOML (or the default recipe if ``path`` is None), apply overrides, validate.
    ``defaults``: dotted keys beneath the recipe (a benchmark's own defaults): the recipe's keys
    and the overrides win over them."""
    tree: dict[str, Any] = {}
    for key, value in (defaults or {}).items():
        _set_dotted(tree, key, value)
    if path is not None:
        p = recipe_path(path)
        try:
            _merge(tree, tomllib.loads(p.read_text()))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
    return config_from_tree(tree, overrides)


def config_from_tree(tree: dict[str, Any], overrides: list[str] | dict | None = None) -> "TidalConfig":
    """A recipe's nested keys (``tree``, left unchanged) with dotted overrides, validated; one
    ConfigError naming each bad key."""
    from tidal.config import TidalConfig

    tree = copy.deepcopy(tree)
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    for key, value in (overrides or {}).items():
        _set_dotted(tree, key, value)
    model = tree.get("model")
    if isinstance(model, dict) and model.get("init_from"):
        from tidal.model.sources import adopt_checkpoint, resolvable_now

        if resolvable_now(str(model["init_from"])):
            tree["model"] = adopt_checkpoint(model)
    try:
        return TidalConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_explain(e)) from None


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate dotted config overrides (``--section.key VALUE`` or ``--section.key=VALUE``)."""
    known, overrides = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        key = arg[2:].split("=", 1)[0]
        if arg == "--":  # everything after it belongs to the command (e.g. `sandbox exec -- CMD`)
            known.extend(argv[i:])
            break
        if arg.startswith("--") and "." in key and not arg.startswith(("--run-dir", "--resume")):
            take = 1 if "=" in arg else 2
            overrides.extend(argv[i:i + take])
            i += take
        else:
            known.append(arg)
            i += 1
    return known, overrides
