"""`mlflow_run`: each job's mirror in MLflow (runtime/training/mlflow_mirror.py) — the run
id, the experiment, the last metric point MLflow acknowledged, the status it was last told, the
attempt whose artifacts were uploaded, and the retry state of a mirror that failed.

Revision ID: 0018_mlflow_run
Revises: 0017_web_token
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_mlflow_run"
down_revision = "0017_web_token"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mlflow_run",
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("job.id"), primary_key=True),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("experiment_id", sa.String(), nullable=False),
        sa.Column("tracking_uri", sa.String(), nullable=False),
        sa.Column("metric_cursor", sa.Integer(), nullable=False),
        sa.Column("params_sent", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(), nullable=True),
        sa.Column("artifacts_attempt", sa.Integer(), nullable=True),
        sa.Column("synced_update", sa.DateTime(), nullable=True),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("next_try_at", sa.DateTime(), nullable=True),
        sa.Column("last_error", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_mlflow_run_run_id", "mlflow_run", ["run_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_mlflow_run_run_id", table_name="mlflow_run")
    op.drop_table("mlflow_run")
