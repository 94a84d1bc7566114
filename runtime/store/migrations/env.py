"""Alembic's environment: run the revisions on the connection the store hands over.

`Store` opens the connection, takes the migration lock and passes the connection in
`config.attributes["connection"]`; the revisions then run inside the store's transaction. Run from
the alembic command line (writing a new revision), it connects to `sqlalchemy.url` itself.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine
from sqlmodel import SQLModel

import nightshift.runtime.store.db  # noqa: F401 - defines the tables in SQLModel.metadata


def run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=SQLModel.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    run(connection)
else:
    with create_engine(context.config.get_main_option("sqlalchemy.url") or "").connect() as conn:
        run(conn)
