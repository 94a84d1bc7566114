"""`gpusample.source`: which probe configuration judged a GPU (`nvml`, `inventory:<file>`, `none`,
…; runtime/gpu/gpu.py `health_source`), so that placement reads the verdicts of its own source
only: a client whose GPU settings differ from the daemon's (another inventory, `probe: none`)
records its verdicts beside the daemon's, never over them. Samples before this revision have "",
read by every source until a newer verdict of its own replaces them.

Revision ID: 0013_gpu_sample_source
Revises: 0012_attempt_diagnosis
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_gpu_sample_source"
down_revision = "0012_attempt_diagnosis"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpusample") as batch:
        batch.add_column(sa.Column("source", sa.String(), nullable=False, server_default=""))
        batch.create_index("ix_gpusample_source", ["source"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("gpusample") as batch:
        batch.drop_index("ix_gpusample_source")
        batch.drop_column("source")
