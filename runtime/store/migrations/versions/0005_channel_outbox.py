"""The channels' outbox and their replay receipts (Slack and WeChat Work approvals).

New tables only, so an older release can still open the store.

Revision ID: 0005_channel_outbox
Revises: 0004_goal_run
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_channel_outbox"
down_revision = "0004_goal_run"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "channel_message",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("channel", sa.String(), nullable=False),
        sa.Column("subject", sa.String(), nullable=False),
        sa.Column("notice", sa.JSON(), nullable=True),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("shown", sa.String(), nullable=True),
        sa.Column("ref", sa.JSON(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_try_at", sa.DateTime(), nullable=False),
        sa.Column("last_error", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("sent_at", sa.DateTime(), nullable=True),
        sa.UniqueConstraint("channel", "subject"),
    )
    op.create_index("ix_channel_message_state", "channel_message", ["state"])
    op.create_table(
        "channel_receipt",
        sa.Column("key", sa.String(), primary_key=True),
        sa.Column("channel", sa.String(), nullable=False),
        sa.Column("received_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("channel_receipt")
    op.drop_index("ix_channel_message_state", "channel_message")
    op.drop_table("channel_message")
