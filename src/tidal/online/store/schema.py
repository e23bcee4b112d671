"""The store's tables (SQLAlchemy Core): what the server served, what users said, the versions.

    responses  one row per choice served (ServedResponse); token lists packed little-endian
               (int32 ids, float64 logprobs: the exact values), expert ids as compact JSON;
               ``key_id``: the API key it was served to (NULL: served without keys)
    feedback   one row per stored FeedbackEvent; ``seq`` (autoincrement) is the learner's
               cursor; (response_id, index) unique: a second event on one choice is a duplicate
    versions   the version registry (VersionRecord); at most one row has status "live"
    learner    one row (id 1): the learner's cursor (learned_through) and its version

migrations/versions/ (0001_initial.py, then each later revision) create exactly these
(tests/test_online_store.py compares).
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

BigId = sa.BigInteger().with_variant(sa.Integer, "sqlite")
"""64-bit ids on PostgreSQL; INTEGER on SQLite, where only that type is the autoincrementing rowid."""

responses = sa.Table(
    "responses", metadata,
    sa.Column("rid", BigId, primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(128), nullable=False),
    sa.Column("index", sa.Integer, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("manifest_sha256", sa.String(64), nullable=False),
    sa.Column("endpoint", sa.String(16), nullable=False),
    sa.Column("prompt_ids", sa.LargeBinary, nullable=False),
    sa.Column("token_ids", sa.LargeBinary, nullable=False),
    sa.Column("logprobs", sa.LargeBinary, nullable=False),
    sa.Column("experts", sa.Text, nullable=True),
    sa.Column("prompt_experts", sa.Text, nullable=True),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("finish_reason", sa.String(32), nullable=False),
    sa.Column("temperature", sa.Float, nullable=False),
    sa.Column("latency_ms", sa.Float, nullable=False),
    sa.Column("behaviour", sa.String(32), nullable=False),
    sa.Column("key_id", sa.String(64), nullable=True),
    sa.UniqueConstraint("id", "index", name="uq_responses_id_index"),
    sa.Index("ix_responses_version", "version"),
)

feedback = sa.Table(
    "feedback", metadata,
    sa.Column("seq", BigId, primary_key=True, autoincrement=True),
    sa.Column("response_id", sa.String(128), nullable=False),
    sa.Column("index", sa.Integer, nullable=False),
    sa.Column("signal", sa.String(16), nullable=False),
    sa.Column("value", sa.Float, nullable=True),
    sa.Column("received", sa.Float, nullable=False),
    sa.UniqueConstraint("response_id", "index", name="uq_feedback_response"),
    sa.ForeignKeyConstraint(["response_id", "index"], ["responses.id", "responses.index"],
                            name="fk_feedback_response"),
)

versions = sa.Table(
    "versions", metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("parent", sa.Integer, nullable=True),
    sa.Column("manifest_sha256", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("weights", sa.Text, nullable=False),
    sa.Column("share", sa.Float, nullable=False),
    sa.Column("gate", sa.JSON, nullable=False),
    sa.Column("canary", sa.JSON, nullable=False),
    sa.Column("note", sa.Text, nullable=False),
    sa.Index("ix_versions_one_live", "status", unique=True,
             sqlite_where=sa.text("status = 'live'"), postgresql_where=sa.text("status = 'live'")),
)

learner = sa.Table(
    "learner", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("learned_through", sa.BigInteger, nullable=False),
    sa.Column("learner_version", sa.Integer, nullable=False),
    sa.Column("updated", sa.Float, nullable=False),
)
