"""`attempt.diagnosis`: why a failed attempt ended, diagnosed by the loop as it ended — category,
the evidence line with its line number, a one-line summary and the recommended action — so
`jobs`, `show` and `why` can say it without reading the log again. Null for attempts that did not
fail and for every attempt before this revision.

Revision ID: 0012_attempt_diagnosis
Revises: 0011_approval_approvers
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_attempt_diagnosis"
down_revision = "0011_approval_approvers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.add_column(sa.Column("diagnosis", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.drop_column("diagnosis")
