"""Identities that cannot collide, durations on the monotonic clock, one daemon per SQLite store.

- `attempt.key`: a globally unique key (a UUID) for run folders, intent and exit files and the
  executors' idempotence, instead of `attempt-<row id>`, which a recreated store hands out again.
  Existing attempts keep the key they were launched under (`attempt-<id>`), so a daemon upgraded
  while they run re-attaches to them.
- `attempt.boot_id`, `attempt.started_mono`, `attempt.progress_mono`: where and when (on the
  kernel's monotonic clock) the attempt started and last progressed, so timeouts and stalls are
  measured in elapsed time, not by a wall clock that can be stepped.
- keyvalue `audit.rows_after_job` / `audit.rows_after_attempt`: the newest job and attempt made
  before each transition's audit event bound a digest of its rows (0 in a fresh store).
- `store_lease`: the daemon that serves the store (node, home, pid, heartbeat); on SQLite a second
  daemon from any home is refused while the lease is fresh.

Revision ID: 0009_identity_and_time
Revises: 0008_sweep
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_identity_and_time"
down_revision = "0008_sweep"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.add_column(sa.Column("key", sa.String(), nullable=True))
        batch.add_column(sa.Column("boot_id", sa.String(), nullable=True))
        batch.add_column(sa.Column("started_mono", sa.Float(), nullable=True))
        batch.add_column(sa.Column("progress_mono", sa.Float(), nullable=True))
    op.execute("UPDATE attempt SET key = 'attempt-' || CAST(id AS VARCHAR) WHERE key IS NULL")
    with op.batch_alter_table("attempt") as batch:
        batch.alter_column("key", existing_type=sa.String(), nullable=False)
        batch.create_index("ix_attempt_key", ["key"], unique=True)
    # Rows made before rows were audited have no events binding them: verify and the engine's
    # launch check take the rows after these ids only.
    op.execute(
        "INSERT INTO keyvalue (key, value) SELECT 'audit.rows_after_job', "
        "CAST(COALESCE(MAX(id), 0) AS VARCHAR) FROM job"
    )
    op.execute(
        "INSERT INTO keyvalue (key, value) SELECT 'audit.rows_after_attempt', "
        "CAST(COALESCE(MAX(id), 0) AS VARCHAR) FROM attempt"
    )
    op.create_table(
        "store_lease",
        sa.Column("name", sa.String(), primary_key=True),
        sa.Column("node", sa.String(), nullable=False),
        sa.Column("home", sa.String(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("token", sa.String(), nullable=False),
        sa.Column("acquired_at", sa.DateTime(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.execute(
        "DELETE FROM keyvalue WHERE key IN ('audit.rows_after_job', 'audit.rows_after_attempt')"
    )
    op.drop_table("store_lease")
    with op.batch_alter_table("attempt") as batch:
        batch.drop_index("ix_attempt_key")
        batch.drop_column("progress_mono")
        batch.drop_column("started_mono")
        batch.drop_column("boot_id")
        batch.drop_column("key")
