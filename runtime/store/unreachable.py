"""Which database errors mean the store's server could not be reached, so that a restart of a
team's PostgreSQL is a fault the loop waits out and a command reports in one line (StoreUnavailable),
not a crash: the connection was refused, lost or terminated, or the server is starting up or
shutting down. A wrong password or database name is the operator's configuration: not this."""

from __future__ import annotations

import sqlite3

from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    OperationalError,
)

from nightshift.runtime.errors import StoreUnavailable

# SQLSTATE class 08 (connection exception), and admin_shutdown, crash_shutdown,
# cannot_connect_now (starting up, shutting down, in recovery), idle_session_timeout.
_AWAY_CLASS = "08"
_AWAY = {"57P01", "57P02", "57P03", "57P05"}
# A connection that failed for these reasons will fail the same way after any wait.
_CONFIGURATION = (
    "authentication failed",
    "password",
    "does not exist",
    "pg_hba.conf",
    "permission denied",
)


def is_unreachable(exc: BaseException) -> bool:
    """True for a lost, refused or terminated connection to a database server (never SQLite's
    errors: runtime/store.py reads those by their result codes)."""
    if isinstance(exc, StoreUnavailable | DisconnectionError):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    orig = exc.orig
    if isinstance(orig, sqlite3.Error):
        return False
    if exc.connection_invalidated or isinstance(exc, InterfaceError):
        return True
    if not (hasattr(orig, "sqlstate") or hasattr(orig, "pgcode")):
        return False  # another driver: SQLAlchemy's own disconnect test (above) decides
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if state:
        return str(state).startswith(_AWAY_CLASS) or state in _AWAY
    # No SQLSTATE from psycopg: the client itself failed to connect, or lost the socket.
    text = str(orig).lower()
    return isinstance(exc, OperationalError) and not any(w in text for w in _CONFIGURATION)


def store_unavailable(url: str) -> StoreUnavailable:
    """The error for a store whose server cannot be reached; its text is the same whatever the
    driver said (the driver's error is its cause), so a fault that changes its wording while the
    server restarts is still one fault."""
    return StoreUnavailable(
        f"the store at {_shown(url)} cannot be reached (its database server refused or closed "
        "the connection, or is starting up or shutting down): this read or write was not done. "
        "A running daemon waits and retries by itself; retry the command once the server "
        "answers again"
    )


def _shown(url: str) -> str:
    """The URL without its password."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(an unreadable store.url)"
