"""Attempts record the cluster host whose GPUs they run on, for executors that place on a cluster.

With `executor.kind: ray`, placement picks a Ray node (from the per-node GPU census) and the run
is pinned to it; the attempt keeps that host so the next snapshot counts its GPUs as taken on the
right node. "" (every existing attempt, and every local or Docker run) means the daemon's own node.

Revision ID: 0007_attempt_host
Revises: 0006_attempt_node
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_attempt_host"
down_revision = "0006_attempt_node"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.add_column(
            sa.Column("host", sa.String(), nullable=False, server_default=sa.text("''"))
        )


def downgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.drop_column("host")
