"""`tidal sandbox exec [--timeout S] [--workspace DIR] -- CMD ...`: check the sandbox here.

Runs one command in the default sandbox (SandboxConfig's defaults, changed by dotted flags such
as ``--sandbox.backend subprocess``) and prints one JSON line: exit_code, stdout, stderr (each
capped at sandbox.max_output_bytes), wall_s, killed_reason, and the backend and guarantees in
force. Exits 0 whenever the sandbox ran the command (whatever the command did: that is in the
JSON), and 2 with one line saying what to fix when the sandbox cannot run on this host.
"""

from __future__ import annotations

import argparse
import json

EXEC_USAGE = "tidal sandbox exec [--timeout S] [--workspace DIR] [--sandbox.KEY VALUE] -- CMD ..."


def add_parsers(sub) -> None:
    s = sub.add_parser("sandbox", help="run a command in the sandbox (checks it on this machine)")
    commands = s.add_subparsers(dest="sandbox_command", required=True)
    e = commands.add_parser("exec", usage=EXEC_USAGE, help="run one command, print a JSON line",
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--timeout", type=float, metavar="S", help="wall-clock limit, seconds "
                   "(default: sandbox.timeout_s)")
    e.add_argument("--workspace", metavar="DIR", help="run in this existing directory, kept "
                   "afterwards (default: a fresh temp dir, deleted)")
    e.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    e.set_defaults(fn=cmd_exec)


def cmd_exec(args, rest) -> int:
    from tidal.config.loader import ConfigError
    from tidal.sandbox import Sandbox

    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not argv:
        raise ConfigError(f"no command given; usage: {EXEC_USAGE}")
    cfg = sandbox_config(rest, args.timeout)
    with Sandbox(cfg) as sandbox:
        result = sandbox.run(argv, workspace=args.workspace)
    print(json.dumps({
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "wall_s": round(result.wall_s, 6),
        "killed_reason": result.killed_reason,
        "backend": sandbox.backend,
        "guarantees": sorted(sandbox.guarantees),
    }))
    return 0


def sandbox_config(overrides: list[str], timeout_s: float | None):
    """SandboxConfig from ``--sandbox.KEY VALUE`` flags; no warm pool (one command only)."""
    from pydantic import ValidationError

    from tidal.config.loader import ConfigError, parse_overrides
    from tidal.sandbox import SandboxConfig

    values = {}
    for key, value in parse_overrides(overrides).items():
        section, _, name = key.partition(".")
        if section != "sandbox" or "." in name:
            raise ConfigError(f"--{key}: only --sandbox.KEY VALUE settings apply here")
        values[name] = value
    values.setdefault("warm_pool", 0)
    if timeout_s is not None:
        values["timeout_s"] = timeout_s
    try:
        return SandboxConfig(**values)
    except ValidationError as e:
        raise ConfigError(f"invalid sandbox settings: {e}") from None
