"""The initial schema: responses, feedback, versions, learner (schema.py as of revision 0001).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "responses",
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
        sa.UniqueConstraint("id", "index", name="uq_responses_id_index"),
    )
    op.create_index("ix_responses_version", "responses", ["version"])
    op.create_table(
        "feedback",
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
    op.create_table(
        "versions",
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
    )
    op.create_index("ix_versions_one_live", "versions", ["status"], unique=True,
                    sqlite_where=sa.text("status = 'live'"), postgresql_where=sa.text("status = 'live'"))
    learner = op.create_table(
        "learner",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("learned_through", sa.BigInteger, nullable=False),
        sa.Column("learner_version", sa.Integer, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
    )
    op.bulk_insert(learner, [{"id": 1, "learned_through": 0, "learner_version": 0, "updated": time.time()}])


def downgrade() -> None:
    for table in ("learner", "versions", "feedback", "responses"):
        op.drop_table(table)
