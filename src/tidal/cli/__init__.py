"""`tidal` command line. Each command group lives in its own module here and adds its parsers.

Config overrides are dotted flags after the known ones: ``tidal train --trainer.lr 1e-6``.
Errors a user can fix (``tidal.errors.UserError``: a bad config, a missing or corrupt checkpoint)
print one clear line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from tidal.cli import bench, doctor, integrity, run, sandbox, serve, simulate, sync, versions, worker  # noqa: E402
from tidal.errors import UserError  # noqa: E402

COMMAND_GROUPS = (run, bench, sandbox, sync, doctor, serve, versions, integrity, simulate, worker)
"""Modules that each contribute subcommands through ``add_parsers(subparsers)``."""

ALONE_ON_THE_MACHINE = {"pretrain"}
"""Commands whose torch threads have the cores to themselves (no rollout workers, no sandboxes):
their idle OpenMP threads may spin (OpenMP's default), see ``set_openmp_wait_policy``."""


def set_openmp_wait_policy(command: str) -> bool:
    """Before torch loads (OpenMP reads its wait policy once per process): PASSIVE for commands
    that share the cores with rollout workers and sandboxes, so idle OpenMP threads sleep instead
    of spinning on a core someone else needs; OpenMP's default (spin a while, then sleep) for
    commands alone on the machine. A policy the user set is kept. Returns whether PASSIVE is
    tidal's default here (``tidal train`` then mid-trains in a child process without it).

    Why: spinning threads steal cores that rollout workers and sandboxes need, while alone on
    the machine waking a sleeping thread at every parallel region makes a mid-training step
    slower (docs/results/notes-midtraining.md)."""
    if "OMP_WAIT_POLICY" in os.environ:
        return False
    if command in ALONE_ON_THE_MACHINE:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


PASSIVE_BY_DEFAULT = False
"""Set by ``main``: whether this process runs with tidal's default OMP_WAIT_POLICY=PASSIVE."""


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
    global PASSIVE_BY_DEFAULT
    PASSIVE_BY_DEFAULT = set_openmp_wait_policy(args.command)
    try:
        return args.fn(args, rest)
    except UserError as e:
        print(f"tidal {args.command}: error: {e}", file=sys.stderr)
        return 2
