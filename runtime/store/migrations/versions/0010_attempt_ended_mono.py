"""`attempt.ended_mono`: the kernel's monotonic clock when the attempt ended (on its `boot_id`),
so a failed job's retry backoff is measured in elapsed time, as timeouts and stalls are, and a
wall-clock step neither cuts a backoff short nor holds a job back for hours.

Revision ID: 0010_attempt_ended_mono
Revises: 0009_identity_and_time
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_attempt_ended_mono"
down_revision = "0009_identity_and_time"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.add_column(sa.Column("ended_mono", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.drop_column("ended_mono")
