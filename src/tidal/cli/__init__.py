"""`tidal` command line. Each command group lives in its own module here and adds its parsers.

Config overrides are dotted flags after the known ones: ``tidal train --trainer.lr 1e-6``.
Errors a user can fix (``tidal.errors.UserError``: a bad config, a missing or corrupt checkpoint)
print one clear line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys

# Before torch loads: idle OpenMP threads must not spin on a small machine shared with sandboxes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tidal.cli import bench, doctor, run, sandbox, sync  # noqa: E402
from tidal.errors import UserError  # noqa: E402

COMMAND_GROUPS = (run, bench, sandbox, sync, doctor)
"""Modules that each contribute subcommands through ``add_parsers(subparsers)``."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidal", description="tidal: asynchronous RL of LLM coding agents")
    sub = p.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.add_parsers(sub)
    return p


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


def main(argv: list[str] | None = None) -> int:
    known, rest = split_overrides(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(known)
    try:
        return args.fn(args, rest)
    except UserError as e:
        print(f"tidal {args.command}: error: {e}", file=sys.stderr)
        return 2
