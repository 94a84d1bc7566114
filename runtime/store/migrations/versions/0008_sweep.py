"""Sweeps: a search over a spec's search space whose trials are jobs (`nightshift sweep`).

One row per sweep; its trials are ordinary jobs of the group `name`, and its Optuna study lives
in a database of its own next to the store (runtime/scheduling/sweeps.py says why).

Revision ID: 0008_sweep
Revises: 0007_attempt_host
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_sweep"
down_revision = "0007_attempt_host"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweep",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("study", sa.String(), nullable=False),
        sa.Column("storage", sa.String(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("spec_path", sa.String(), nullable=True),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("budget", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("reason", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_sweep_name", "sweep", ["name"], unique=True)
    op.create_index("ix_sweep_state", "sweep", ["state"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_sweep_state", table_name="sweep")
    op.drop_index("ix_sweep_name", table_name="sweep")
    op.drop_table("sweep")
