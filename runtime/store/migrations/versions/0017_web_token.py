"""`web_token`: who may sign in to the web dashboard. `nightshift web token` keeps the sha256 of
a 32-byte random secret with the OS user who made it; `--revoke` stamps `revoked_at`. A new
table only, so an older release can still open the store.

Revision ID: 0017_web_token
Revises: 0016_attempt_provenance
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_web_token"
down_revision = "0016_attempt_provenance"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_token",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("user", sa.String(), nullable=False),
        sa.Column("digest", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.UniqueConstraint("digest"),
    )
    op.create_index("ix_web_token_user", "web_token", ["user"])


def downgrade() -> None:
    op.drop_index("ix_web_token_user", table_name="web_token")
    op.drop_table("web_token")
