"""One daemon per SQLite store: the `store_lease` row "daemon" names the daemon that serves it.

The per-home lock (agent/doors/daemon.py DaemonLock) cannot see a daemon of another home opened on the
same file (`store.url`): two did, and 2 of 10 jobs ran as two processes while the store recorded
one attempt. A daemon takes the lease at start in one write transaction, refused while another
holder's heartbeat is fresh; it renews the heartbeat as it ticks and deletes the lease when it
stops. A holder killed with SIGKILL leaves a lease that goes stale after `loop.lease_timeout_s`,
or at once on its own node when its process is gone. A PostgreSQL store is shared by several
daemons (nodes) on purpose: no lease is taken there.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psutil
from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import OperationalError

from nightshift.runtime.errors import OperatorError, StoreError
from nightshift.runtime.store.db import Store, StoreLease, lock_for_write, utcnow

LEASE = "daemon"
_TABLE = StoreLease.__table__  # type: ignore[attr-defined]  # SQLModel's table


@dataclass(frozen=True)
class Holder:
    """Who holds the lease, as its row says."""

    node: str
    home: str
    pid: int
    token: str
    heartbeat_at: datetime

    def describe(self, now: datetime) -> str:
        age = (now - self.heartbeat_at).total_seconds()
        return f"pid {self.pid} on {self.node}, home {self.home} (heartbeat {age:.0f} s ago)"


def applies(store: Store) -> bool:
    """Whether a store takes one daemon only: SQLite (PostgreSQL serves several nodes)."""
    return store.engine.dialect.name == "sqlite"


def _read(conn: Connection) -> Holder | None:
    row = conn.execute(select(_TABLE).where(_TABLE.c.name == LEASE)).first()
    if row is None:
        return None
    m = row._mapping
    return Holder(m["node"], m["home"], m["pid"], m["token"], m["heartbeat_at"])


def _live(holder: Holder, node: str, now: datetime, timeout_s: float) -> bool:
    """A fresh heartbeat, and on this node a process that still exists."""
    if (now - holder.heartbeat_at).total_seconds() > timeout_s:
        return False
    return holder.node != node or psutil.pid_exists(holder.pid)


def serving(
    store: Store, *, node: str, timeout_s: float, now: datetime | None = None
) -> Holder | None:
    """The daemon that serves this SQLite store while its lease is live; else None (and always
    None on other stores)."""
    if not applies(store):
        return None
    now = now or utcnow()
    with store.engine.connect() as conn:
        try:
            holder = _read(conn)
        except OperationalError as exc:
            store.raise_if_busy(exc)
            raise
    return holder if holder is not None and _live(holder, node, now, timeout_s) else None


class DaemonLease:
    """This daemon's lease on its SQLite store (a no-op on other stores). The caller holds its
    home's DaemonLock, so a lease left by a daemon of the same home and node is taken at once."""

    def __init__(
        self,
        store: Store,
        *,
        node: str,
        home: str,
        heartbeat_s: float,
        timeout_s: float,
        clock: Callable[[], datetime] = utcnow,
    ):
        self.store, self.node, self.home = store, node, home
        self.heartbeat_s, self.timeout_s, self.clock = heartbeat_s, timeout_s, clock
        self.token = secrets.token_hex(16)
        self.held = False
        self._renew_at = float("-inf")

    def acquire(self) -> Holder | None:
        """Take the lease, or raise an OperatorError naming the live holder. Returns the stale
        holder taken over, if any."""
        if not applies(self.store):
            return None
        taken = self._take(lost=False)
        self.held = True
        self._renew_at = time.monotonic() + self.heartbeat_s
        return taken

    def renew(self) -> None:
        """Renew the heartbeat when one is due (one small write every heartbeat_s). A lease
        taken over meanwhile (this daemon's heartbeat was late past the timeout) raises an
        OperatorError: this daemon must stop, so that one daemon serves the store."""
        if not self.held or time.monotonic() < self._renew_at:
            return
        now = self.clock()
        stmt = (
            update(_TABLE)
            .where(_TABLE.c.name == LEASE, _TABLE.c.token == self.token)
            .values(heartbeat_at=now)
        )
        with self.store.engine.connect() as conn:
            try:
                renewed = conn.execute(stmt).rowcount
                conn.commit()
            except OperationalError as exc:
                self.store.raise_if_busy(exc)
                raise
        if not renewed:  # deleted by hand (take it again), or taken over (stop)
            try:
                self._take(lost=True)
            except OperatorError:
                self.held = False
                raise
        self._renew_at = time.monotonic() + self.heartbeat_s

    def release(self) -> bool:
        """Delete this daemon's lease (not another's); False if the store could not be written
        (the lease then goes stale after the timeout)."""
        if not self.held:
            return True
        self.held = False
        stmt = delete(_TABLE).where(_TABLE.c.name == LEASE, _TABLE.c.token == self.token)
        try:
            with self.store.engine.connect() as conn:
                conn.execute(stmt)
                conn.commit()
        except (OperationalError, StoreError):
            return False
        return True

    def _take(self, *, lost: bool) -> Holder | None:
        """In one write transaction: refuse a live holder, else replace its row with ours."""
        now = self.clock()
        with self.store.engine.connect() as conn:
            try:
                lock_for_write(conn, _TABLE.name)
                other = _read(conn)
                if other is not None and other.token != self.token:
                    same_home = (other.node, other.home) == (self.node, self.home)
                    if not same_home and _live(other, self.node, now, self.timeout_s):
                        raise self._refusal(other, now, lost)
                conn.execute(delete(_TABLE).where(_TABLE.c.name == LEASE))
                conn.execute(
                    insert(_TABLE).values(
                        name=LEASE,
                        node=self.node,
                        home=self.home,
                        pid=os.getpid(),
                        token=self.token,
                        acquired_at=now,
                        heartbeat_at=now,
                    )
                )
                conn.commit()
            except OperationalError as exc:
                self.store.raise_if_busy(exc)
                raise
        return other if other is not None and other.token != self.token else None

    def _refusal(self, other: Holder, now: datetime, lost: bool) -> OperatorError:
        where = self.store.url.removeprefix("sqlite:///")
        if lost:
            return OperatorError(
                f"this daemon's lease on the store {where} was taken over by another daemon: "
                f"{other.describe(now)}. Its own heartbeat was late by more than "
                f"loop.lease_timeout_s ({self.timeout_s:g} s), so it stops here, so that one "
                "daemon serves the store; stop one of the two homes' daemons, or give each home "
                "its own store"
            )
        return OperatorError(
            f"another nightshift daemon serves the store {where}: {other.describe(now)}. A "
            "SQLite store takes one daemon, whichever home it runs from: stop that daemon "
            "first, or give this home its own store (unset store.url / NIGHTSHIFT_STORE__URL); "
            "a team shares one store on PostgreSQL. A killed daemon's lease is taken over "
            f"after loop.lease_timeout_s ({self.timeout_s:g} s)"
        )
