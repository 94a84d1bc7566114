"""A goal run records the goal that started a thread, before its first step.

The agent's graph keeps LangGraph checkpoints only where a run stops (an approval, the end, an
error); every call it plans is a PlannedCall row written before it acts. A run killed between
checkpoints is resumed by replaying this goal from the start: each call already planned answers
from its row, so nothing acts twice. A new table only, so release 0.1.0 can still open the store.

Revision ID: 0004_goal_run
Revises: 0003_audit_signature
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_goal_run"
down_revision = "0003_audit_signature"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "goalrun",
        sa.Column("thread_id", sa.String(), primary_key=True),
        sa.Column("goal", sa.JSON(), nullable=False),
        sa.Column("on_behalf_of", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("goalrun")
