"""Each served response remembers the API key it was served to (responses.key_id), so feedback
on it is taken from that key only. Rows of an older database keep NULL: served before keys,
they take anyone's feedback, as before.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("responses", sa.Column("key_id", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("responses", "key_id")  # SQLite >= 3.35 drops a column in place
