"""The version registry: every policy version, its parent, gate and canary results, where it is
live, and the only legal ways to move traffic between versions.

    candidate ──start_canary──> canary ──promote──> live ──promote(another)──> retired
        │                          └──rollback──> rolled_back      └──rollback──> rolled_back
        └──(gate fails: update status="blocked")                     (parent / newest retired
                                                                      becomes live again)

Each transition is one transaction that first reads the rows it changes under the write lock
(SQLite ``BEGIN IMMEDIATE``; PostgreSQL ``LOCK TABLE versions``); an illegal one raises a
UserError naming what is wrong and changes nothing. At most one version is live (also a partial
unique index in the schema); shares: live 1 - canary share, canary its share, others 0.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import sqlalchemy as sa

from tidal.errors import UserError
from tidal.online.records import STATUSES, VersionRecord
from tidal.online.store.database import read_tx, write_tx
from tidal.online.store.schema import versions

GATE_OK = ("passed", "skipped")
"""``VersionRecord.gate["verdict"]`` values that let a candidate into canary."""

UPDATABLE = ("status", "share", "gate", "canary", "note")
"""Fields ``update`` may change (the rest of a record is fixed at registration)."""


def record_of(row) -> VersionRecord:
    m = row._mapping
    return VersionRecord(version=m["version"], parent=m["parent"], manifest_sha256=m["manifest_sha256"],
                         status=m["status"], created=m["created"], weights=m["weights"], share=m["share"],
                         gate=dict(m["gate"] or {}), canary=dict(m["canary"] or {}), note=m["note"])


def _check_fields(fields: dict) -> None:
    if "status" in fields and fields["status"] not in STATUSES:
        raise UserError(f"version status {fields['status']!r} is not one of {', '.join(STATUSES)}")
    if "share" in fields and not (isinstance(fields["share"], (int, float)) and 0 <= fields["share"] <= 1):
        raise UserError(f"a version's share must be in [0, 1], got {fields['share']!r}")
    for key in ("gate", "canary"):
        if key in fields and not isinstance(fields[key], dict):
            raise UserError(f"a version's {key} results must be a dict, got {type(fields[key]).__name__}")


class VersionRegistry:
    """The ``versions`` table of an OnlineStore, through checked transitions."""

    def __init__(self, store):
        self.engine = store.engine

    # ---- reads ----

    def get(self, v: int) -> VersionRecord | None:
        with read_tx(self.engine) as conn:
            row = conn.execute(sa.select(versions).where(versions.c.version == v)).first()
        return None if row is None else record_of(row)

    def all(self) -> list[VersionRecord]:
        with read_tx(self.engine) as conn:
            return [record_of(r) for r in conn.execute(sa.select(versions).order_by(versions.c.version))]

    def live_versions(self) -> list[VersionRecord]:
        """The live version and any canary: what the server serves now."""
        with read_tx(self.engine) as conn:
            rows = conn.execute(sa.select(versions).where(versions.c.status.in_(("live", "canary")))
                                .order_by(versions.c.version))
            return [record_of(r) for r in rows]

    def live(self) -> VersionRecord | None:
        return next((r for r in self.live_versions() if r.status == "live"), None)

    # ---- writes ----

    def register(self, rec: VersionRecord) -> None:
        """Add a new version (usually a "candidate"; the first one of a deployment "live")."""
        if not isinstance(rec.version, int) or rec.version < 0:
            raise UserError(f"a version number must be an int >= 0, got {rec.version!r}")
        if not rec.manifest_sha256:
            raise UserError(f"version {rec.version} has no manifest sha256")
        _check_fields({"status": rec.status, "share": rec.share, "gate": rec.gate, "canary": rec.canary})
        with self._tx() as (conn, rows):
            if rec.version in rows:
                raise UserError(f"version {rec.version} is already registered ({rows[rec.version].status})")
            if rec.parent is not None and rec.parent not in rows:
                raise UserError(f"version {rec.version}: its parent {rec.parent} is not registered")
            if rec.status == "live" and (live := _live(rows)) is not None:
                raise UserError(f"version {live.version} is already live: register {rec.version} as a "
                                "candidate and promote it")
            conn.execute(versions.insert().values(
                version=rec.version, parent=rec.parent, manifest_sha256=rec.manifest_sha256,
                status=rec.status, created=rec.created, weights=rec.weights, share=float(rec.share),
                gate=rec.gate, canary=rec.canary, note=rec.note))

    def update(self, v: int, **fields) -> VersionRecord:
        """Change some of status, share, gate, canary, note (checked: one live version at most)."""
        bad = sorted(set(fields) - set(UPDATABLE))
        if bad:
            raise UserError(f"cannot update {', '.join(bad)} of a version; only {', '.join(UPDATABLE)}")
        _check_fields(fields)
        with self._tx() as (conn, rows):
            rec = _need(rows, v)
            if fields.get("status") == "live" and (live := _live(rows)) is not None and live.version != v:
                raise UserError(f"version {live.version} is live: promote {v} instead of setting it live")
            _set(conn, v, **fields)
            return VersionRecord(**{**rec.__dict__, **fields})

    def start_canary(self, v: int, share: float) -> None:
        """Give candidate ``v`` (gate passed or skipped) ``share`` of traffic; live keeps 1 - share."""
        if not (isinstance(share, (int, float)) and 0 < share < 1):
            raise UserError(f"a canary share must be in (0, 1), got {share!r}")
        with self._tx() as (conn, rows):
            rec = _need(rows, v)
            if rec.status != "candidate":
                raise UserError(f"version {v} is {rec.status}: only a candidate can start a canary")
            verdict = rec.gate.get("verdict")
            if verdict not in GATE_OK:
                raise UserError(f"version {v}'s gate verdict is {verdict!r}: a canary needs one of {GATE_OK}")
            live = _live(rows)
            if live is None:
                raise UserError(f"no version is live: promote {v} (or another) first; a canary needs an incumbent")
            if (other := _canary(rows)) is not None:
                raise UserError(f"version {other.version} is already in canary: promote or roll it back first")
            _set(conn, v, status="canary", share=float(share))
            _set(conn, live.version, share=1.0 - share)

    def promote(self, v: int, force: bool = False, note: str | None = None) -> None:
        """Make ``v`` live with all traffic; the old live becomes "retired". From canary, a
        candidate whose gate passed, or a retired version (back to an older one by hand);
        a blocked, rolled-back or ungated candidate only with ``force``."""
        with self._tx() as (conn, rows):
            rec = _need(rows, v)
            if rec.status == "live":
                raise UserError(f"version {v} is already live")
            needs_force = rec.status in ("blocked", "rolled_back") or (
                rec.status == "candidate" and rec.gate.get("verdict") not in GATE_OK)
            if needs_force and not force:
                why = rec.status if rec.status != "candidate" else f"a candidate with gate verdict {rec.gate.get('verdict')!r}"
                raise UserError(f"version {v} is {why}: promoting it needs --force")
            if (other := _canary(rows)) is not None and other.version != v:
                raise UserError(f"version {other.version} is in canary: promote or roll it back first")
            if (live := _live(rows)) is not None:
                _set(conn, live.version, status="retired", share=0.0)
            _set(conn, v, status="live", share=1.0, **({} if note is None else {"note": note}))

    def rollback(self, v: int, note: str | None = None) -> int:
        """Take ``v`` off traffic ("rolled_back"): a canary (live gets all traffic back), or the
        live version (its parent, if retired, else the newest retired version, is live again).
        Returns the version live afterwards."""
        extra = {} if note is None else {"note": note}
        with self._tx() as (conn, rows):
            rec = _need(rows, v)
            if rec.status == "canary":
                live = _live(rows)
                if live is None:
                    raise UserError(f"version {v} is in canary but no version is live: the registry is "
                                    "inconsistent; promote a version by hand")
                _set(conn, v, status="rolled_back", share=0.0, **extra)
                _set(conn, live.version, share=1.0)
                return live.version
            if rec.status != "live":
                raise UserError(f"version {v} is {rec.status}: only a live or canary version can be rolled back")
            if (other := _canary(rows)) is not None:
                raise UserError(f"version {other.version} is in canary: roll it back first")
            back = _fallback(rows, rec)
            _set(conn, v, status="rolled_back", share=0.0, **extra)
            _set(conn, back, status="live", share=1.0)
            return back

    def _tx(self):
        return _locked(self.engine)


@contextmanager
def _locked(engine: sa.Engine) -> Iterator[tuple[sa.Connection, dict[int, VersionRecord]]]:
    """A write transaction with every version row read under the write lock."""
    with write_tx(engine) as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("LOCK TABLE versions IN EXCLUSIVE MODE")
        yield conn, {r.version: record_of(r) for r in conn.execute(sa.select(versions))}


def _need(rows: dict[int, VersionRecord], v: int) -> VersionRecord:
    if v not in rows:
        known = ", ".join(map(str, sorted(rows))) or "none"
        raise UserError(f"version {v} is not registered (registered: {known})")
    return rows[v]


def _live(rows: dict[int, VersionRecord]) -> VersionRecord | None:
    return next((r for r in rows.values() if r.status == "live"), None)


def _canary(rows: dict[int, VersionRecord]) -> VersionRecord | None:
    return next((r for r in rows.values() if r.status == "canary"), None)


def _fallback(rows: dict[int, VersionRecord], rec: VersionRecord) -> int:
    """The version a rolled-back live one hands traffic back to."""
    if rec.parent is not None and rows.get(rec.parent) and rows[rec.parent].status == "retired":
        return rec.parent
    retired = [r.version for r in rows.values() if r.status == "retired"]
    if not retired:
        raise UserError(f"version {rec.version} is live and no retired version exists to roll back to")
    return max(retired)


def _set(conn: sa.Connection, v: int, **fields) -> None:
    conn.execute(versions.update().where(versions.c.version == v).values(**fields))
