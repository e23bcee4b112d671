"""`tidal versions`: the version registry of a deployment, and promote / rollback by hand.

    tidal versions [--run-dir DIR | --database-url URL] [--json]      list every version
    tidal versions promote V [--force] [--note TEXT] [same flags]     make V live
    tidal versions rollback V [--note TEXT] [same flags]              take V off traffic

The store is ``DIR/online.db`` (what ``tidal serve --run-dir DIR`` writes) or the database at
URL (``postgresql+psycopg://...``). ``--json`` prints the records as a JSON list instead of the
table (after an action: the registry as it is afterwards).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from tidal.errors import UserError

COLUMNS = ("version", "parent", "status", "share", "created", "sha256", "gate", "canary")


def _open(args):
    from tidal.online.store import OnlineStore

    if bool(args.run_dir) == bool(args.database_url):
        raise UserError("name the store with exactly one of --run-dir DIR or --database-url URL")
    run_dir = Path(args.run_dir) if args.run_dir else None
    if run_dir is not None and not run_dir.is_dir():
        raise UserError(f"--run-dir {run_dir} is not a directory")
    return OnlineStore.open(args.database_url or "", run_dir, create=False)


def _verdict(result: dict) -> str:
    return str(result.get("verdict", "-")) if result else "-"


def table_rows(records) -> list[tuple[str, ...]]:
    """One row of strings per VersionRecord, in COLUMNS order."""
    return [(str(r.version), "-" if r.parent is None else str(r.parent), r.status, f"{r.share:.2f}",
             datetime.fromtimestamp(r.created, timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
             r.manifest_sha256[:12], _verdict(r.gate), _verdict(r.canary)) for r in records]


def format_table(records) -> str:
    rows = [COLUMNS, *table_rows(records)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines) if records else "\n".join(lines + ["(no versions registered)"])


def _show(store, as_json: bool) -> None:
    records = store.registry.all()
    print(json.dumps([asdict(r) for r in records], indent=2) if as_json else format_table(records))


def _run(args, rest, action) -> int:
    if rest:
        raise UserError(f"tidal versions takes no config overrides: {' '.join(rest)}")
    store = _open(args)
    try:
        if action is not None:
            message = action(store.registry)
            if not args.json:
                print(message)
        _show(store, args.json)
    finally:
        store.close()
    return 0


def cmd_list(args, rest) -> int:
    return _run(args, rest, None)


def cmd_promote(args, rest) -> int:
    def act(reg):
        reg.promote(args.version, force=args.force, note=args.note)
        return f"version {args.version} is live"
    return _run(args, rest, act)


def cmd_rollback(args, rest) -> int:
    def act(reg):
        live = reg.rollback(args.version, note=args.note)
        return f"version {args.version} is rolled back; version {live} is live"
    return _run(args, rest, act)


def _store_flags(p: argparse.ArgumentParser, default) -> None:
    p.add_argument("--run-dir", default=default, help="run directory of `tidal serve` (its online.db)")
    p.add_argument("--database-url", default=default, help="the store's database URL instead")
    p.add_argument("--json", action="store_true", default=default,
                   help="print the records as JSON instead of a table")


def add_parsers(sub) -> None:
    v = sub.add_parser("versions", help="list the version registry; promote or roll back a version")
    _store_flags(v, None)
    v.set_defaults(fn=cmd_list, json=False)
    vs = v.add_subparsers(dest="action")
    p = vs.add_parser("promote", help="make version V live (the live one is retired)")
    p.add_argument("version", type=int)
    p.add_argument("--force", action="store_true", help="also a blocked, rolled-back or ungated version")
    p.add_argument("--note", default=None, help="why (kept with the version)")
    _store_flags(p, argparse.SUPPRESS)
    p.set_defaults(fn=cmd_promote)
    r = vs.add_parser("rollback", help="take version V off traffic (canary, or live: back to its parent)")
    r.add_argument("version", type=int)
    r.add_argument("--note", default=None, help="why (kept with the version)")
    _store_flags(r, argparse.SUPPRESS)
    r.set_defaults(fn=cmd_rollback)
