"""Attempts record the daemon (node) that started them, for several daemons on one store.

A local pid, a container on one host's dockerd and a GPU index mean something on their own node
only: each daemon watches, recovers and places on its GPUs only its own node's attempts, while
any daemon may start a queued job. Existing attempts get "" (treated as every node's, as before).

Revision ID: 0006_attempt_node
Revises: 0005_channel_outbox
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_attempt_node"
down_revision = "0005_channel_outbox"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.add_column(
            sa.Column("node", sa.String(), nullable=False, server_default=sa.text("''"))
        )
        batch.create_index("ix_attempt_node", ["node"])


def downgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.drop_index("ix_attempt_node")
        batch.drop_column("node")
