"""The store's one write path: a batch of operations in ONE transaction, checked per operation.

An operation is ("responses", [ServedResponse, ...]) or ("feedback", [FeedbackEvent, ...]). Each
gets its own result: None for responses, a FeedbackOutcome per event for feedback ("not_owner":
the response was served to another API key; checked before "duplicate"), or the
exception that rejected that operation alone (bad input, a response id already stored): the rest
of the batch is still written. Operations run in order, so feedback on a response recorded
earlier in the same batch finds it. The unknown / duplicate checks run inside the transaction,
which holds the write lock (SQLite ``BEGIN IMMEDIATE``; PostgreSQL ``LOCK TABLE ... EXCLUSIVE``,
which also keeps ``seq`` in commit order, so the learner's cursor never skips an event).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable

import sqlalchemy as sa

from tidal.errors import UserError
from tidal.online.records import SIGNALS, FeedbackEvent, ServedResponse
from tidal.online.store.codec import feedback_row, response_row
from tidal.online.store.schema import feedback, responses

IN_CHUNK = 500
"""Most keys in one ``IN (...)`` list (SQLite's bound-parameter limit is far above it)."""

Op = tuple[str, list]


def check_event(e: FeedbackEvent) -> None:
    """A FeedbackEvent as /v1/feedback validates it (the store refuses anything else)."""
    if not isinstance(e.response_id, str) or not e.response_id:
        raise UserError("feedback needs a response id (a non-empty string)")
    if not isinstance(e.index, int) or e.index < 0:
        raise UserError(f"feedback index must be an int >= 0, got {e.index!r}")
    if e.signal not in SIGNALS:
        raise UserError(f"feedback signal {e.signal!r} is not one of {', '.join(SIGNALS)}")
    if e.signal == "scalar":
        if not isinstance(e.value, (int, float)) or not math.isfinite(e.value) or not -1 <= e.value <= 1:
            raise UserError(f"a scalar feedback value must be a number in [-1, 1], got {e.value!r}")
    elif e.value is not None:
        raise UserError(f"feedback signal {e.signal!r} takes no value (got {e.value!r})")


def _chunks(xs: list, n: int = IN_CHUNK) -> Iterable[list]:
    for i in range(0, len(xs), n):
        yield xs[i:i + n]


def _keys(conn: sa.Connection, table: sa.Table, id_col: str, ids: set[str],
          value_col: str | None = None) -> dict[tuple[str, int], Any]:
    """(id, index) pairs present in table for these ids, each with its ``value_col`` (or None)."""
    out: dict[tuple[str, int], Any] = {}
    col = table.c[id_col]
    value = table.c[value_col] if value_col else sa.null()
    for part in _chunks(sorted(ids)):
        q = sa.select(col, table.c.index, value).where(col.in_(part))
        out.update(((r[0], r[1]), r[2]) for r in conn.execute(q))
    return out


def _write_responses(conn: sa.Connection, ops: list[list[ServedResponse]]) -> list[Any]:
    results: list[Any] = [None] * len(ops)
    rows_of: dict[int, list[dict]] = {}
    for i, rs in enumerate(ops):
        try:
            rows_of[i] = [response_row(r) for r in rs]
        except (ValueError, TypeError, AttributeError) as err:
            results[i] = ValueError(str(err))
    taken = set(_keys(conn, responses, "id", {row["id"] for rows in rows_of.values() for row in rows}))
    insert: list[dict] = []
    for i, rows in rows_of.items():
        keys = [(row["id"], row["index"]) for row in rows]
        clash = [k for k in keys if k in taken] or [k for k, n in Counter(keys).items() if n > 1]
        if clash:
            results[i] = ValueError(f"response {clash[0][0]}[{clash[0][1]}] is already stored")
            continue
        taken.update(keys)
        insert.extend(rows)
    if insert:
        conn.execute(responses.insert(), insert)
    return results


def _write_feedback(conn: sa.Connection, ops: list[list[FeedbackEvent]]) -> list[Any]:
    results: list[Any] = [None] * len(ops)
    for i, evs in enumerate(ops):
        try:
            for e in evs:
                check_event(e)
        except UserError as err:
            results[i] = err
    ids = {e.response_id for i, evs in enumerate(ops) if results[i] is None for e in evs}
    owner = _keys(conn, responses, "id", ids, "key_id")
    seen = set(_keys(conn, feedback, "response_id", ids))
    insert: list[dict] = []
    for i, evs in enumerate(ops):
        if results[i] is not None:
            continue
        outcomes = []
        for e in evs:
            key = (e.response_id, e.index)
            if key not in owner:
                outcomes.append("unknown_response")
            elif owner[key] is not None and owner[key] != e.key_id:
                outcomes.append("not_owner")
            elif key in seen:
                outcomes.append("duplicate")
            else:
                seen.add(key)
                insert.append(feedback_row(e))
                outcomes.append("stored")
        results[i] = outcomes
    if insert:
        conn.execute(feedback.insert(), insert)
    return results


WRITERS = {"responses": _write_responses, "feedback": _write_feedback}


def write_ops(conn: sa.Connection, ops: list[Op]) -> list[Any]:
    """Every operation in order, inside the caller's transaction; consecutive ones of a kind
    share their queries and one multi-row insert."""
    for kind, _ in ops:
        if kind not in WRITERS:
            raise ValueError(f"unknown store operation {kind!r}")
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("LOCK TABLE responses, feedback IN EXCLUSIVE MODE")
    results: list[Any] = []
    i = 0
    while i < len(ops):
        j = i
        while j < len(ops) and ops[j][0] == ops[i][0]:
            j += 1
        results.extend(WRITERS[ops[i][0]](conn, [payload for _, payload in ops[i:j]]))
        i = j
    return results
