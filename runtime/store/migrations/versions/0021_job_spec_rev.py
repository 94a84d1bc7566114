"""`job.spec_rev`: a revision number the database itself gives a job's spec, fresh on every
insert and on every update of `spec`, by triggers (so a raw edit of the row gets one too). The
loop's snapshot reads the spec's placement fields again only for jobs whose revision moved
since its last load (runtime/scheduling/snapshot.py). Rows already stored get a revision each.

A later revision that rebuilds the job table (SQLite's batch mode copies it) drops the triggers
with it and must create them again (`create_triggers`): tests/test_spec_revision.py checks that
they exist at HEAD.

Revision ID: 0021_job_spec_rev
Revises: 0020_job_hold
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021_job_spec_rev"
down_revision = "0020_job_hold"
branch_labels = None
depends_on = None

SQLITE_TRIGGERS = {
    # a new revision: one past the newest anywhere in the table (by its index), so a job id used
    # again (a row deleted and inserted by hand) never meets the revision it had
    "job_spec_rev_insert": (
        "CREATE TRIGGER job_spec_rev_insert AFTER INSERT ON job BEGIN "
        "UPDATE job SET spec_rev = (SELECT max(spec_rev) FROM job) + 1 WHERE id = NEW.id; END"
    ),
    "job_spec_rev_update": (
        "CREATE TRIGGER job_spec_rev_update AFTER UPDATE OF spec ON job BEGIN "
        "UPDATE job SET spec_rev = (SELECT max(spec_rev) FROM job) + 1 WHERE id = NEW.id; END"
    ),
}
POSTGRES = (
    "CREATE SEQUENCE IF NOT EXISTS job_spec_rev_seq",
    "CREATE OR REPLACE FUNCTION job_spec_rev() RETURNS trigger AS $$ BEGIN "
    "NEW.spec_rev := nextval('job_spec_rev_seq'); RETURN NEW; END $$ LANGUAGE plpgsql",
    "CREATE TRIGGER job_spec_rev BEFORE INSERT OR UPDATE OF spec ON job "
    "FOR EACH ROW EXECUTE FUNCTION job_spec_rev()",
)


def create_triggers() -> None:
    """The triggers that give a spec its revision, on this dialect."""
    if op.get_context().dialect.name == "postgresql":
        for statement in POSTGRES:
            op.execute(statement)
    else:
        for statement in SQLITE_TRIGGERS.values():
            op.execute(statement)


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(
            sa.Column("spec_rev", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
        batch.create_index("ix_job_spec_rev", ["spec_rev"])
    op.execute("UPDATE job SET spec_rev = id")  # a revision each, all different
    create_triggers()
    if op.get_context().dialect.name == "postgresql":  # the sequence goes on past them
        op.execute(
            "SELECT setval('job_spec_rev_seq', (SELECT coalesce(max(spec_rev), 0) + 1 FROM job))"
        )


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS job_spec_rev ON job")
        op.execute("DROP FUNCTION IF EXISTS job_spec_rev()")
        op.execute("DROP SEQUENCE IF EXISTS job_spec_rev_seq")
    else:
        for name in SQLITE_TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    with op.batch_alter_table("job") as batch:
        batch.drop_index("ix_job_spec_rev")
        batch.drop_column("spec_rev")
