"""How a benchmark is configured: its own few fields, plus the run config through tidal's loader.

    tidal bench NAME [RECIPE.toml] [--json PATH] [--quick] [--bench.FIELD VALUE ...] [--SECTION.KEY VALUE ...]

``--bench.FIELD`` fills the benchmark's own section; every other dotted key overrides the run
config (``TidalConfig``) exactly as ``tidal train`` takes it (``load_config(RECIPE, overrides)``),
so a benchmark never re-declares a field tidal already has: the model it measures is ``[model]``,
the engine's numerics are ``engine.numerics``, the seed is ``SEED_KEY``, and so on.
``--json PATH`` and ``--quick`` are the only plain flags. ``tidal bench NAME --help`` lists the
benchmark's fields with their docstrings and defaults, and the run-config keys it reads.

A benchmark module adopts this by exposing (``cli/bench.py`` then dispatches it here; a module
with the old ``add_arguments``/``run_from_args`` keeps its argparse flags until it moves)::

    class BenchSection(Section):
        \"\"\"What the benchmark fixes itself (e.g. greedy sampling), shown by --help.\"\"\"
        runs: int = Field(3, ge=1)
        \"\"\"Timed runs per side; the median is reported.\"\"\"     # every field documented

    READS = ("model", "engine.numerics", SEED_KEY)   # run-config sections or keys it uses: listed
                                                     # by --help, recorded in its JSON, and a
                                                     # --KEY outside them is noted as unused
    QUICK = {"bench.runs": 1}                        # optional: what --quick sets (dotted keys,
                                                     # beneath those given on the command line)
    DEFAULTS = {"engine.numerics": "fast"}           # optional: the benchmark's own defaults of
                                                     # run-config keys, beneath the recipe and
                                                     # the command line (listed by --help)

    def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int: ...

and, to run as ``python -m``: ``raise SystemExit(main(sys.modules[__name__], "NAME"))``.
In ``run``: ``with_preset(cfg, name)`` where the benchmark offers named model sizes, and
``config_record(bench, cfg, READS)`` into its JSON (the resolved bench section and the run-config
sections it used); ``with_keys(cfg, {"engine.max_seq_len": 384})`` where it derives run-config
keys from its own fields (validated again, as the loader does). List fields take ``1,16,64`` or
a TOML list (``IntList``, ``StrList``).

Precedence, lowest first: the run config's own defaults, ``DEFAULTS``, the recipe, ``QUICK``
(with --quick), the command line. So a benchmark that measures with other settings than a
training run's (fast numerics, a synchronous loop) says so in ``DEFAULTS``, its JSON records
what ran, and every key stays the user's to change.

Moving a benchmark from argparse: each flag of its own becomes a documented ``BenchSection``
field; each flag that restates a run-config field (threads, numerics, seed, temperature, sizes)
is dropped and read from ``cfg`` and listed in ``READS`` (a default of its own that differs from
tidal's goes in ``DEFAULTS``); ``--quick`` becomes ``QUICK``;
``add_arguments``/``run_from_args`` become ``run``. The seed and the engine's threads are read
through ``SEED_KEY``/``THREADS_KEY`` (``run_seed``, ``torch_threads``), so when the run config
gains a section of its own for them, only those two names change.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import textwrap
from types import ModuleType, UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BeforeValidator, ValidationError

from tidal.config.loader import ConfigError, load_config, parse_overrides
from tidal.errors import UserError
from tidal.config_section import Section

if TYPE_CHECKING:
    from tidal.config import TidalConfig

SEED_KEY = "run.seed"
"""The run's seed (model init, prompts), the one `tidal train` starts from."""
THREADS_KEY = "run.worker_threads"
"""torch threads the engine runs with, as in a rollout worker (0 = torch's default)."""


def _comma_list(value: Any) -> Any:
    """``"1,16,64"`` -> ``["1", "16", "64"]`` (pydantic then checks each item); one value -> [it]."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, (int, float)):
        return [value]
    return value


IntList = Annotated[list[int], BeforeValidator(_comma_list)]
"""A list of ints: ``--bench.KEY 1,16,64`` or ``--bench.KEY [1,16,64]``."""
StrList = Annotated[list[str], BeforeValidator(_comma_list)]
"""A list of strings: ``--bench.KEY fast,deterministic``."""


def is_configured(module: ModuleType) -> bool:
    """Whether ``module`` is configured this way (else it has the old argparse flags)."""
    return hasattr(module, "BenchSection") and hasattr(module, "run")


def run_bench(module: ModuleType, name: str, argv: list[str], prog: str | None = None) -> int:
    """Parse ``argv`` for benchmark ``name`` and run it."""
    bench, cfg, json_path = parse(module, name, argv, prog)
    return module.run(bench, cfg, json_path)


def main(module: ModuleType, name: str, argv: list[str] | None = None) -> int:
    """``python -m tidal.bench.X``: as ``tidal bench NAME``, a UserError printed as one line."""
    prog = f"python -m {module.__spec__.name if module.__spec__ else module.__name__}"
    try:
        return run_bench(module, name, sys.argv[1:] if argv is None else argv, prog)
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


def parse(module: ModuleType, name: str, argv: list[str],
          prog: str | None = None) -> tuple[Section, TidalConfig, str | None]:
    """``argv`` -> (the benchmark's section, the run config, the --json path); ``--help``
    prints the generated help and exits; a wrong flag or key is a ConfigError naming it."""
    from tidal.config.loader import split_overrides

    plain, dotted = split_overrides(list(argv))
    parser = build_parser(module, name, prog)
    args, unknown = parser.parse_known_args(plain)
    if unknown:
        raise ConfigError(
            f"unknown flag {' '.join(unknown)} for benchmark {name!r}: its own settings are "
            f"--bench.KEY VALUE ({', '.join(module.BenchSection.model_fields)}), the run config's "
            f"--SECTION.KEY VALUE; see tidal bench {name} --help")
    quick = dict(getattr(module, "QUICK", {})) if getattr(args, "quick", False) else {}
    overrides = {**quick, **parse_overrides(dotted)}
    own = {k.removeprefix("bench."): v for k, v in overrides.items() if k.startswith("bench.")}
    rest = {k: v for k, v in overrides.items() if not k.startswith("bench.")}
    bench = bench_section(module.BenchSection, name, own)
    cfg = load_config(args.recipe, rest, defaults=getattr(module, "DEFAULTS", None))
    _note_unread(name, rest, getattr(module, "READS", ()))
    return bench, cfg, args.json


def bench_section(cls: type[Section], name: str, values: dict[str, Any]) -> Section:
    """The benchmark's section from its ``--bench.*`` values, or one ConfigError naming each bad key."""
    try:
        return cls.model_validate(values)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            where = "bench." + ".".join(str(p) for p in e["loc"])
            if e["type"] == "extra_forbidden":
                lines.append(f"unknown key '{where}' of benchmark {name!r}: remove it or check its "
                             f"spelling (its fields: {', '.join(cls.model_fields)})")
            else:
                lines.append(f"{where}: {e['msg']}")
        raise ConfigError(f"invalid settings of benchmark {name!r}:\n  " + "\n  ".join(lines)) from None


def _note_unread(name: str, overrides: dict[str, Any], reads: tuple[str, ...]) -> None:
    """Say so on stderr when a run-config override given is one the benchmark never reads."""
    for key in overrides:
        if not any(key == r or key.startswith(r + ".") or r.startswith(key + ".") for r in reads):
            print(f"tidal bench {name}: note: --{key} is not read by this benchmark "
                  f"(it reads: {', '.join(reads) or 'nothing of the run config'})", file=sys.stderr)


def build_parser(module: ModuleType, name: str, prog: str | None = None) -> argparse.ArgumentParser:
    """The plain flags (RECIPE.toml, --json, --quick where the benchmark has QUICK) and the
    help generated from the benchmark's section."""
    quick = getattr(module, "QUICK", None)
    usage = (f"{prog or 'tidal bench ' + name} [RECIPE.toml] [--json PATH]{' [--quick]' if quick else ''}"
             " [--bench.KEY VALUE ...] [--SECTION.KEY VALUE ...]")
    from tidal.bench import BENCHMARKS

    summary = BENCHMARKS[name][1] if name in BENCHMARKS else ""
    doc = inspect.cleandoc(module.BenchSection.__doc__ or "")
    parser = argparse.ArgumentParser(prog=prog or f"tidal bench {name}", usage=usage,
                                     description=f"{summary}\n\n{doc}".strip(),
                                     epilog=help_epilog(module.BenchSection, getattr(module, "READS", ()),
                                                        getattr(module, "DEFAULTS", None)),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", nargs="?", metavar="RECIPE.toml",
                        help="run config to start from (default: the default recipe)")
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    if quick:
        parser.add_argument("--quick", action="store_true",
                            help="smaller settings: " + " ".join(f"--{k} {v}" for k, v in quick.items()))
    return parser


def help_epilog(cls: type[Section], reads: tuple[str, ...], defaults: dict[str, Any] | None = None) -> str:
    """The benchmark's fields (type, default, docstring), the run-config keys it reads and the
    defaults it gives them."""
    lines = ["its own settings (--bench.KEY VALUE):"]
    for field, info in cls.model_fields.items():
        default = _shown(info.get_default(call_default_factory=True))
        lines.append(f"  --bench.{field}  {_type_name(info.annotation)}, default {default}")
        lines += textwrap.wrap(" ".join((info.description or "").split()), 88,
                               initial_indent="      ", subsequent_indent="      ")
    lines += ["", *textwrap.wrap(
        "the run config: RECIPE.toml (default: the default recipe) with any --SECTION.KEY VALUE "
        "override of it, as tidal train takes them (tidal train --dry-run prints every key). "
        f"This benchmark reads: {', '.join(reads) or 'nothing of it'}.", 92)]
    if defaults:
        lines += ["", *textwrap.wrap(
            "its defaults of run-config keys (beneath the recipe and the command line): "
            + " ".join(f"--{k} {_shown(v)}" for k, v in defaults.items()), 92)]
    return "\n".join(lines)


def _type_name(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return "|".join(str(a) for a in args)
    if origin in (Union, UnionType):
        names = " or ".join(_type_name(a) for a in args if a is not type(None))
        return names + (" (or unset)" if type(None) in args else "")
    if isinstance(annotation, type) and not get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _shown(default: Any) -> str:
    return "(unset)" if default is None else json.dumps(default)


def with_preset(cfg: TidalConfig, preset_name: str) -> TidalConfig:
    """``cfg`` whose ``[model]`` is the named preset (tidal.model.presets), with every model key
    the recipe or the command line set on top (so ``--model.num_hidden_layers 2`` still applies).
    Only the model section is checked again: a benchmark builds its own engine and trainer."""
    from tidal.config.dump import recipe_tree
    from tidal.model.config import ModelConfig
    from tidal.model.presets import preset

    given = recipe_tree(cfg.model)
    tree = {**recipe_tree(preset(preset_name)), **{k: given[k] for k in cfg.model.model_fields_set}}
    try:
        model = ModelConfig.model_validate(tree)
    except ValidationError as err:
        why = "; ".join(f"model.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"model preset {preset_name!r} with the [model] keys given: {why}") from None
    return cfg.model_copy(update={"model": model})


def with_keys(cfg: TidalConfig, keys: dict[str, Any]) -> TidalConfig:
    """``cfg`` with these dotted keys set (a value may be a whole section's dict), validated
    again as a whole: one ConfigError naming each key that does not fit. The dtypes "auto"
    chose resolve afresh (``recipe_tree``)."""
    from tidal.config.dump import recipe_tree
    from tidal.config.loader import config_from_tree

    return config_from_tree(recipe_tree(cfg), keys)


def config_record(bench: Section, cfg: TidalConfig, reads: tuple[str, ...]) -> dict[str, Any]:
    """What a benchmark's JSON records of its configuration: ``{"bench": its section,
    "model": {...}, "run.seed": 0, ...}`` (each read section or key, resolved)."""
    out: dict[str, Any] = {"bench": bench.model_dump(mode="json")}
    for dotted in reads:
        value = lookup(cfg, dotted)
        out[dotted] = value.model_dump(mode="json") if isinstance(value, Section) else value
    return out


def lookup(cfg: Section, dotted: str) -> Any:
    """``lookup(cfg, "engine.numerics")`` -> ``cfg.engine.numerics``."""
    value: Any = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def torch_threads(cfg: TidalConfig) -> int | None:
    """The engine's torch threads (``THREADS_KEY``); None = leave torch's own setting."""
    return lookup(cfg, THREADS_KEY) or None


def run_seed(cfg: TidalConfig) -> int:
    """The run's seed (``SEED_KEY``): model init and the benchmark's prompts."""
    return lookup(cfg, SEED_KEY)
