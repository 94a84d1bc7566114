"""`attempt.provenance`: what makes an attempt reproducible, read by the engine as it starts
(runtime/training/provenance.py): the code's commit, branch and dirty diff (the diff itself kept
once per sha256 under the home), the interpreter and its package list's hash, the image digest,
seed, argv, the named environment, data fingerprints, the GPUs as the health probe read them and
the host. Null for every attempt before this revision.

Revision ID: 0016_attempt_provenance
Revises: 0015_attempt_machine
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016_attempt_provenance"
down_revision = "0015_attempt_machine"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.add_column(sa.Column("provenance", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.drop_column("provenance")
