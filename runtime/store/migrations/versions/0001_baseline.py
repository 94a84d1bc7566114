"""The schema of release 0.1.0 (store schema_version 2), the last one made by create_all.

Written out table by table as that release's create_all made it, so that a store it made and a
store made by this revision are the same. Stores from before Alembic are stamped with this
revision instead of running it.

Revision ID: 0001_baseline
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("spec_path", sa.String(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("resume_from", sa.String(), nullable=True),
        sa.Column("resume_step", sa.Integer(), nullable=True),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("group", sa.String(), nullable=True),
        sa.Column("hold_reason", sa.String(), nullable=True),
        sa.Column("submitted_by_call", sa.String(), nullable=True),
        sa.Column("reason", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("submitted_by_call"),
    )
    op.create_index(op.f("ix_job_name"), "job", ["name"], unique=False)
    op.create_index(op.f("ix_job_group"), "job", ["group"], unique=False)
    op.create_index(op.f("ix_job_state"), "job", ["state"], unique=False)

    op.create_table(
        "checkpoint",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(), nullable=False),
        sa.Column("valid", sa.Boolean(), nullable=False),
        sa.Column("seen_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_checkpoint_job_id"), "checkpoint", ["job_id"], unique=False)

    op.create_table(
        "gpusample",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(), nullable=True),
        sa.Column("verdict", sa.String(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("taken_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_gpusample_uuid"), "gpusample", ["uuid"], unique=False)

    op.create_table(
        "approval",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("call_id", sa.String(), nullable=False),
        sa.Column("skill", sa.String(), nullable=False),
        sa.Column("args", sa.JSON(), nullable=False),
        sa.Column("requester", sa.String(), nullable=False),
        sa.Column("rule", sa.String(), nullable=False),
        sa.Column("quorum", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("votes", sa.JSON(), nullable=False),
        sa.Column("thread_id", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("decided_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_approval_call_id"), "approval", ["call_id"], unique=True)
    op.create_index(op.f("ix_approval_state"), "approval", ["state"], unique=False)

    op.create_table(
        "auditevent",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.String(), nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("skill", sa.String(), nullable=True),
        sa.Column("call_id", sa.String(), nullable=True),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("prev_hash", sa.String(), nullable=False),
        sa.Column("hash", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("hash"),
    )
    op.create_index(op.f("ix_auditevent_job_id"), "auditevent", ["job_id"], unique=False)
    op.create_index(op.f("ix_auditevent_call_id"), "auditevent", ["call_id"], unique=False)

    op.create_table(
        "plannedcall",
        sa.Column("call_id", sa.String(), nullable=False),
        sa.Column("thread_id", sa.String(), nullable=True),
        sa.Column("skill", sa.String(), nullable=False),
        sa.Column("args", sa.JSON(), nullable=False),
        sa.Column("principal", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("call_id"),
    )
    op.create_index(op.f("ix_plannedcall_thread_id"), "plannedcall", ["thread_id"], unique=False)

    op.create_table(
        "keyvalue",
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("value", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )

    op.create_table(
        "attempt",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("executor", sa.String(), nullable=False),
        sa.Column("handle", sa.JSON(), nullable=False),
        sa.Column("argv", sa.JSON(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("log_path", sa.String(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("signal", sa.Integer(), nullable=True),
        sa.Column("start_step", sa.Integer(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=True),
        sa.Column("last_loss", sa.Float(), nullable=True),
        sa.Column("metrics_offset", sa.Integer(), nullable=False),
        sa.Column("metrics_cursor", sa.JSON(), nullable=False),
        sa.Column("evidence", sa.String(), nullable=True),
        sa.Column("first_bad_step", sa.Integer(), nullable=True),
        sa.Column("last_progress_at", sa.DateTime(), nullable=True),
        sa.Column("outcome", sa.String(), nullable=True),
        sa.Column("cause", sa.String(), nullable=True),
        sa.Column("energy_kwh", sa.Float(), nullable=True),
        sa.Column("energy_source", sa.String(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_attempt_job_id"), "attempt", ["job_id"], unique=False)
    op.create_index(op.f("ix_attempt_state"), "attempt", ["state"], unique=False)

    op.create_table(
        "metricpoint",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_metricpoint_job_id"), "metricpoint", ["job_id"], unique=False)
    op.create_index(op.f("ix_metricpoint_attempt_id"), "metricpoint", ["attempt_id"], unique=False)


def downgrade() -> None:
    for table in (
        "metricpoint",
        "attempt",
        "keyvalue",
        "plannedcall",
        "auditevent",
        "approval",
        "gpusample",
        "checkpoint",
        "job",
    ):
        op.drop_table(table)
