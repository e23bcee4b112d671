"""`tidal bench NAME [FLAGS]`: dispatches to the module listed in ``tidal.bench.BENCHMARKS``.

The benchmark's own parser is built only once NAME is known, so the command line stays quick
to start for every other command (benchmark modules import torch).
"""

from __future__ import annotations

import argparse
import importlib

from tidal.bench import BENCHMARKS


def add_parsers(sub) -> None:
    listing = "\n".join(f"  {name:<10} {summary}" for name, (_, summary) in BENCHMARKS.items())
    b = sub.add_parser("bench", help="benchmarks against peers (print tables, write JSON)",
                       description=f"benchmarks:\n{listing}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("bench", choices=list(BENCHMARKS), metavar="NAME", help="which benchmark")
    b.add_argument("flags", nargs=argparse.REMAINDER, help="that benchmark's flags (NAME --help)")
    b.set_defaults(fn=run_benchmark)


def run_benchmark(args, rest) -> int:
    module_name, summary = BENCHMARKS[args.bench]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"tidal bench {args.bench}", description=summary)
    module.add_arguments(parser)
    return module.run_from_args(parser.parse_args(list(args.flags) + list(rest)))
