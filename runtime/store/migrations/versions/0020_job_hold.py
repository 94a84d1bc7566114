"""`job_hold`: why a queued job waits, as of the loop's last tick, moved off the job row into a
narrow table (runtime/store/job_holds.py): most reasons change every tick, and on the job row
each change rewrote the whole row, spec included. The reasons of queued jobs move with it.

Revision ID: 0020_job_hold
Revises: 0019_point_time_and_reproduces
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_job_hold"
down_revision = "0019_point_time_and_reproduces"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_hold",
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("job.id"), primary_key=True),
        sa.Column("reason", sa.String(), nullable=False),
    )
    op.execute(
        "INSERT INTO job_hold (job_id, reason) SELECT id, hold_reason FROM job"
        " WHERE state = 'queued' AND hold_reason IS NOT NULL"
    )
    with op.batch_alter_table("job") as batch:
        batch.drop_column("hold_reason")


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("hold_reason", sa.String(), nullable=True))
    op.execute(
        "UPDATE job SET hold_reason = (SELECT reason FROM job_hold WHERE job_hold.job_id = job.id)"
    )
    op.drop_table("job_hold")
