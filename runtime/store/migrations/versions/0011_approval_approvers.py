"""`approval.approvers`: who may vote on an approval (people by name, `role:<name>`), as its rule
resolved them at request — e.g. the owner of the job a call touches, or an admin. Empty: anyone
whose role may approve (every approval before this revision).

Revision ID: 0011_approval_approvers
Revises: 0010_attempt_ended_mono
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_approval_approvers"
down_revision = "0010_attempt_ended_mono"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("approval") as batch:
        batch.add_column(sa.Column("approvers", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("approval") as batch:
        batch.drop_column("approvers")
