"""`diagnosis_correction`: the right category of a failed attempt as a person gave it (`nightshift
diagnose JOB --correct CATEGORY`), who gave it and when, what the rules said then, and the bounded
end of the attempt's log with its exit status, so the rules can be measured on the operator's own
history (`nightshift eval diagnosis --local`). One row per attempt; a newer correction replaces it.

Revision ID: 0014_diagnosis_correction
Revises: 0013_gpu_sample_source
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_diagnosis_correction"
down_revision = "0013_gpu_sample_source"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "diagnosis_correction",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("job.id"), nullable=False),
        sa.Column("attempt_id", sa.Integer(), sa.ForeignKey("attempt.id"), nullable=False),
        sa.Column("attempt_number", sa.Integer(), nullable=False),
        sa.Column("category", sa.String(), nullable=False),
        sa.Column("rules_category", sa.String(), nullable=True),
        sa.Column("rules_confidence", sa.String(), nullable=True),
        sa.Column("note", sa.String(), nullable=True),
        sa.Column("corrected_by", sa.String(), nullable=False),
        sa.Column("corrected_at", sa.DateTime(), nullable=False),
        sa.Column("log_path", sa.String(), nullable=True),
        sa.Column("log_excerpt", sa.String(), nullable=False),
        sa.Column("first_line_no", sa.Integer(), nullable=False),
        sa.Column("log_note", sa.String(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("signal", sa.Integer(), nullable=True),
        sa.Column("monitor_says", sa.String(), nullable=True),
        sa.Column("monitor_detail", sa.String(), nullable=True),
    )
    op.create_index(
        "ix_diagnosis_correction_job_id", "diagnosis_correction", ["job_id"], unique=False
    )
    op.create_index(
        "ix_diagnosis_correction_attempt_id", "diagnosis_correction", ["attempt_id"], unique=True
    )
    op.create_index(
        "ix_diagnosis_correction_category", "diagnosis_correction", ["category"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_diagnosis_correction_category", table_name="diagnosis_correction")
    op.drop_index("ix_diagnosis_correction_attempt_id", table_name="diagnosis_correction")
    op.drop_index("ix_diagnosis_correction_job_id", table_name="diagnosis_correction")
    op.drop_table("diagnosis_correction")
