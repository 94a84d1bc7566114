"""`metricpoint.wall_time`: when a metric point was made — the source's own time where it has one
(a TensorBoard event's wall_time, a JSONL line's `time` or `timestamp`), else when the loop read
it — so the MLflow mirror sends each point at its time instead of its attempt's start. Null for
points recorded before this revision (the mirror falls back to the attempt's start for them).

`job.reproduces`: the job a `reproduce_job` call queued this one from (the MLflow mirror tags its
run `nightshift.reproduces`). Null for every other job and every job before this revision.

Revision ID: 0019_point_time_and_reproduces
Revises: 0018_mlflow_run
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019_point_time_and_reproduces"
down_revision = "0018_mlflow_run"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("metricpoint") as batch:
        batch.add_column(sa.Column("wall_time", sa.DateTime(), nullable=True))
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("reproduces", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("reproduces")
    with op.batch_alter_table("metricpoint") as batch:
        batch.drop_column("wall_time")
