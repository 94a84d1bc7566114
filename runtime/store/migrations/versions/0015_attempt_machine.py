"""`attempt.machine`: what the machine said as a failed attempt ended (the run's cgroup counters,
the kernel lines that may matter, the pids of its process tree, free space, non-finite metrics;
runtime/training/machine_evidence.py `MachineEvidence`), kept with the attempt so that a later
diagnosis of it (the agent's own diagnose_failure call) reads the same evidence as the loop's.
Null for attempts that did not fail and for every attempt before this revision.

Revision ID: 0015_attempt_machine
Revises: 0014_diagnosis_correction
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_attempt_machine"
down_revision = "0014_diagnosis_correction"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.add_column(sa.Column("machine", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.drop_column("machine")
