"""An approval carries its execution: approved → executing → executed | failed.

The executed call's result or error and when it ran, which process claimed it for execution and
when, the files it carries and where it was requested from. Every new column is nullable or has a
server default, so release 0.1.0 can still open and write an upgraded store.

Revision ID: 0002_approval_lifecycle
Revises: 0001_baseline
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_approval_lifecycle"
down_revision = "0001_baseline"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("approval") as batch:
        batch.add_column(sa.Column("result", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("error", sa.String(), nullable=True))
        batch.add_column(sa.Column("executed_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("claimed_by", sa.String(), nullable=True))
        batch.add_column(sa.Column("claimed_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("files", sa.JSON(), nullable=False, server_default="{}"))
        batch.add_column(
            sa.Column("requested_via", sa.String(), nullable=False, server_default="api")
        )


def downgrade() -> None:
    with op.batch_alter_table("approval") as batch:
        for name in (
            "requested_via",
            "files",
            "claimed_at",
            "claimed_by",
            "executed_at",
            "error",
            "result",
        ):
            batch.drop_column(name)
