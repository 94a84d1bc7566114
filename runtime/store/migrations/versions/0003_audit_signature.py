"""Audit events carry a signature: the HMAC-SHA256 of their chain hash under a key only the
daemon's user can read, so rewriting the chain without the key is caught.

Events written before this revision keep a NULL signature; `audit verify` reports them as
unsigned (before signing). The column is nullable, so release 0.1.0 can still open and write an
upgraded store (its events are unsigned, and verify says so).

Revision ID: 0003_audit_signature
Revises: 0002_approval_lifecycle
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_audit_signature"
down_revision = "0002_approval_lifecycle"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("auditevent") as batch:
        batch.add_column(sa.Column("signature", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("auditevent") as batch:
        batch.drop_column("signature")
