"""OnlineStore: what the server served and what users said about it, durable before each ack.

Every write method commits before it returns (one transaction per call; GroupCommitter in
writer.py puts many callers' writes into one). The reads are what the learner, the gate and the
canary need; the version registry (registry.py) lives in the same database (``store.registry``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from tidal.errors import UserError
from tidal.online.records import FeedbackEvent, LearnEvent, ServedResponse
from tidal.online.store.codec import feedback_of, response_of, unpack_ids
from tidal.online.store.database import make_engine, read_tx, resolve_url, write_tx
from tidal.online.store.migrate import migrate
from tidal.online.store.schema import feedback, learner, responses, versions
from tidal.online.store.writes import Op, write_ops

PROMPT_PAGE = 256
"""Responses read per page while collecting distinct recent prompts."""

_JOIN = feedback.join(responses, sa.and_(feedback.c.response_id == responses.c.id,
                                         feedback.c.index == responses.c.index))


class OnlineStore:
    """The responses, feedback, learner cursor and version registry of one deployment."""

    def __init__(self, engine: sa.Engine, url: str):
        self.engine, self.url = engine, url

    @classmethod
    def open(cls, url: str = "", run_dir: Path | None = None, *, create: bool = True) -> "OnlineStore":
        """Open (and migrate) the store at ``url``; "" = SQLite ``run_dir/online.db``.
        ``create=False`` refuses a SQLite file that does not exist yet (listing commands)."""
        resolved = resolve_url(url, run_dir)
        u = sa.engine.make_url(resolved)
        if not create and u.get_backend_name() == "sqlite" and not Path(u.database or "").is_file():
            raise UserError(f"no online store at {u.database}: is this the run directory of `tidal serve`?")
        engine = make_engine(resolved)
        try:
            migrate(engine, u.render_as_string(hide_password=True))
        except sa.exc.OperationalError as e:
            engine.dispose()
            raise UserError(f"cannot open the online store at {u.render_as_string(hide_password=True)}: "
                            f"{e.orig}") from None
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, resolved)

    def close(self) -> None:
        self.engine.dispose()

    @property
    def registry(self):
        from tidal.online.store.registry import VersionRegistry

        return VersionRegistry(self)

    # ---- writes (durable on return) ----

    def write_batch(self, ops: list[Op]) -> list[Any]:
        """Many callers' operations in one transaction: one result each (writes.py)."""
        with write_tx(self.engine) as conn:
            return write_ops(conn, ops)

    def write_responses(self, rs: list[ServedResponse]) -> None:
        """Record served responses; all or none (one already stored, or bad, stores none)."""
        (result,) = self.write_batch([("responses", list(rs))])
        if isinstance(result, Exception):
            raise result

    def write_feedback(self, events: list[FeedbackEvent]) -> list[str]:
        """Store feedback; one FeedbackOutcome per event. Only "stored" stores anything; a bad
        event (UserError) stores none of the call's events."""
        (result,) = self.write_batch([("feedback", list(events))])
        if isinstance(result, Exception):
            raise result
        return result

    def set_learned_through(self, seq: int, learner_version: int) -> None:
        """Move the learner's cursor: events up to ``seq`` are learned from (never backwards)."""
        with write_tx(self.engine) as conn:
            current = conn.execute(sa.select(learner.c.learned_through).where(learner.c.id == 1)).scalar_one()
            last = conn.execute(sa.select(sa.func.max(feedback.c.seq))).scalar() or 0
            if not current <= seq <= last:
                raise ValueError(f"learned_through must move forward within the stored events: "
                                 f"{seq} is outside [{current}, {last}]")
            conn.execute(learner.update().where(learner.c.id == 1).values(
                learned_through=seq, learner_version=learner_version, updated=time.time()))

    # ---- reads ----

    def learned_through(self) -> int:
        with read_tx(self.engine) as conn:
            return conn.execute(sa.select(learner.c.learned_through).where(learner.c.id == 1)).scalar_one()

    def learner_version(self) -> int:
        with read_tx(self.engine) as conn:
            return conn.execute(sa.select(learner.c.learner_version).where(learner.c.id == 1)).scalar_one()

    def backlog(self) -> int:
        """Stored feedback events after the learner's cursor."""
        cursor = sa.select(learner.c.learned_through).where(learner.c.id == 1).scalar_subquery()
        with read_tx(self.engine) as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(feedback)
                                .where(feedback.c.seq > cursor)).scalar_one()

    def max_feedback_seq(self) -> int:
        """The newest stored feedback event's seq (0 when none): where a canary's comparison
        starts, so both sides are counted over the same stretch of traffic."""
        with read_tx(self.engine) as conn:
            return conn.execute(sa.select(sa.func.coalesce(sa.func.max(feedback.c.seq), 0))).scalar_one()

    def learn_events_after(self, seq: int, limit: int) -> list[LearnEvent]:
        """Up to ``limit`` feedback events with seq > ``seq``, each joined to its response."""
        q = (sa.select(feedback.c.seq, feedback.c.response_id, feedback.c.signal, feedback.c.value,
                       feedback.c.received, *responses.c)
             .select_from(_JOIN).where(feedback.c.seq > seq).order_by(feedback.c.seq).limit(limit))
        with read_tx(self.engine) as conn:
            rows = conn.execute(q).all()
        return [LearnEvent(seq=r.seq, feedback=feedback_of(r._mapping), response=response_of(r)) for r in rows]

    def outcomes(self, version: int, since_seq: int = 0) -> list[tuple[str, float | None, str]]:
        """(signal, value, behaviour) of every feedback event after ``since_seq`` on responses
        of ``version``, in seq order (the canary's evidence)."""
        q = (sa.select(feedback.c.signal, feedback.c.value, responses.c.behaviour).select_from(_JOIN)
             .where(responses.c.version == version, feedback.c.seq > since_seq).order_by(feedback.c.seq))
        with read_tx(self.engine) as conn:
            return [tuple(r) for r in conn.execute(q)]

    def recent_prompts(self, n: int) -> list[list[int]]:
        """Prompt token ids of the ``n`` newest distinct served prompts, newest first."""
        out: list[list[int]] = []
        seen: set[bytes] = set()
        before = None
        with read_tx(self.engine) as conn:
            while len(out) < n:
                q = sa.select(responses.c.rid, responses.c.prompt_ids).order_by(responses.c.rid.desc())
                if before is not None:
                    q = q.where(responses.c.rid < before)
                page = conn.execute(q.limit(PROMPT_PAGE)).all()
                for rid, packed in page:
                    if packed not in seen and len(out) < n:
                        seen.add(packed)
                        out.append(unpack_ids(packed))
                if len(page) < PROMPT_PAGE:
                    break
                before = page[-1][0]
        return out

    def response(self, id: str, index: int = 0) -> ServedResponse | None:
        with read_tx(self.engine) as conn:
            row = conn.execute(sa.select(responses).where(responses.c.id == id, responses.c.index == index)).first()
        return None if row is None else response_of(row)

    def counts(self) -> dict[str, int]:
        """Rows per table: responses, feedback, versions."""
        with read_tx(self.engine) as conn:
            return {t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                    for t in (responses, feedback, versions)}
