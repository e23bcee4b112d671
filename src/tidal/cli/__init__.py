"""`tidal` command line. Each command group lives in its own module here and adds its parsers.

Config overrides are dotted flags after the known ones: ``tidal train --trainer.lr 1e-6``.
Errors a user can fix (``tidal.errors.UserError``: a bad config, a missing or corrupt checkpoint)
print one clear line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from tidal import openmp
from tidal.errors import UserError

COMMAND_GROUPS = ("run", "bench", "sandbox", "sync", "doctor", "serve", "versions", "integrity",
                  "simulate", "worker")
"""Modules of tidal.cli that each contribute subcommands through ``add_parsers(subparsers)``;
imported by ``build_parser``, after the OpenMP wait policy is set (they load torch)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidal", description="tidal: asynchronous RL of LLM coding agents")
    sub = p.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        importlib.import_module(f"tidal.cli.{group}").add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    openmp.set_wait_policy(next((a for a in argv if not a.startswith("-")), ""))
    from tidal.config.loader import split_overrides

    known, rest = split_overrides(argv)
    args = build_parser().parse_args(known)
    try:
        return args.fn(args, rest)
    except UserError as e:
        print(f"tidal {args.command}: error: {e}", file=sys.stderr)
        return 2
