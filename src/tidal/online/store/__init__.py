"""The durable store of real-time RL: served responses, feedback, the learner's cursor and the
version registry, in one database (SQLite WAL by default, PostgreSQL from a URL).

    store.py     OnlineStore: open (migrates), durable writes, the learner's and gate's reads
    writer.py    GroupCommitter: the HTTP API's writes, many per transaction, acked after commit
    registry.py  VersionRegistry: register, canary, promote, rollback (every transition checked)
    schema.py    the tables; migrations/ their Alembic history (run at open)
    database.py  the engine (WAL + synchronous=FULL on SQLite); codec.py records <-> rows
"""

from tidal.online.store.registry import GATE_OK, VersionRegistry
from tidal.online.store.store import OnlineStore
from tidal.online.store.writer import GroupCommitter

__all__ = ["GATE_OK", "GroupCommitter", "OnlineStore", "VersionRegistry"]
