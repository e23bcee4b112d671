"""`tidal bench NAME [RECIPE.toml] [--json PATH] [--bench.KEY VALUE ...] [--SECTION.KEY VALUE ...]`.

Dispatches to the module listed in ``tidal.bench.BENCHMARKS``. A module configured through
``tidal.bench.config`` (it has ``BenchSection`` and ``run``) gets its own section from
``--bench.*`` and the run config from the rest; a module with the older ``add_arguments`` /
``run_from_args`` still gets its own argparse flags. The module is imported only once NAME is
known, so the command line stays quick to start for every other command (benchmarks import torch).
"""

from __future__ import annotations

import argparse
import importlib

from tidal.bench import BENCHMARKS


def add_parsers(sub) -> None:
    listing = "\n".join(f"  {name:<12} {summary}" for name, (_, summary) in BENCHMARKS.items())
    b = sub.add_parser("bench", help="benchmarks against peers (print tables, write JSON)",
                       description=f"benchmarks (`tidal bench NAME --help`: its settings):\n{listing}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("bench", choices=list(BENCHMARKS), metavar="NAME", help="which benchmark")
    b.add_argument("flags", nargs=argparse.REMAINDER,
                   help="[RECIPE.toml] [--json PATH] [--bench.KEY VALUE ...] [--SECTION.KEY VALUE ...]")
    b.set_defaults(fn=run_benchmark)


def run_benchmark(args, rest) -> int:
    module_name, summary = BENCHMARKS[args.bench]
    module = importlib.import_module(module_name)
    argv = list(args.flags) + list(rest)
    from tidal.bench.config import is_configured, run_bench

    if is_configured(module):
        return run_bench(module, args.bench, argv)
    parser = argparse.ArgumentParser(prog=f"tidal bench {args.bench}", description=summary)
    module.add_arguments(parser)
    return module.run_from_args(parser.parse_args(argv))
