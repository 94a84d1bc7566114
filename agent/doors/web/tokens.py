"""Who is signed in to the web dashboard: per-user tokens made by `nightshift web token`.

A token is `nst_` and 32 random bytes (url-safe base64), shown once; the store keeps its sha256
only (a secret of 256 random bits needs no slow hash) with the OS user who made it. A request is
that user when it carries a token whose digest is on file and not revoked; nothing in a request
names a user. Revoking stamps the row, so the next request with it is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlmodel import col, select

from nightshift.runtime.store.db import Store, WebToken, utcnow

if TYPE_CHECKING:
    from nightshift.agent.brain.wiring import Wiring

PREFIX = "nst_"
MAX_LEN = 128  # anything longer is not one of ours: refused before hashing


@dataclass(frozen=True)
class Issued:
    """A token just made: `secret` is shown once and never stored."""

    id: int
    user: str
    secret: str


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def issue(store: Store, user: str) -> Issued:
    """A new token for `user` (the OS user running the command)."""
    secret = PREFIX + secrets.token_urlsafe(32)
    with store.session() as s:
        row = WebToken(user=user, digest=digest(secret))
        s.add(row)
        s.commit()
        s.refresh(row)
        assert row.id is not None
        return Issued(id=row.id, user=user, secret=secret)


def user_of(store: Store, secret: str | None) -> str | None:
    """The user a presented token signs in, or None (unknown, forged, revoked, malformed)."""
    if not secret or len(secret) > MAX_LEN or not secret.startswith(PREFIX):
        return None
    want = digest(secret)
    with store.session() as s:
        row = s.exec(select(WebToken).where(col(WebToken.digest) == want)).first()
    if row is None or row.revoked_at is not None or not hmac.compare_digest(row.digest, want):
        return None
    return row.user


def revoke(store: Store, user: str, token_id: int | None = None) -> list[int]:
    """Revoke `user`'s token `token_id`, or all their live tokens; the ids revoked. One user
    never revokes another's."""
    now = utcnow()
    with store.session() as s:
        q = select(WebToken).where(col(WebToken.user) == user, col(WebToken.revoked_at).is_(None))
        if token_id is not None:
            q = q.where(col(WebToken.id) == token_id)
        rows = list(s.exec(q))
        for row in rows:
            row.revoked_at = now
            s.add(row)
        s.commit()
        return [r.id for r in rows if r.id is not None]


def listed(store: Store, user: str) -> list[tuple[int, datetime, datetime | None]]:
    """`user`'s tokens: id, made, revoked."""
    with store.session() as s:
        rows = s.exec(select(WebToken).where(col(WebToken.user) == user).order_by(col(WebToken.id)))
        return [(r.id or 0, r.created_at, r.revoked_at) for r in rows]


def token_op(w: Wiring, user: str, action: str, token_id: int | None = None) -> dict[str, Any]:
    """One `nightshift web token` request for `user` (the OS user of the process, or the
    daemon socket's peer), audited as `web.token.<action>` (never the secret)."""
    if action == "issue":
        made = issue(w.store, user)
        w.audit.append(user, "web.token.issue", payload={"token_id": made.id})
        return {"id": made.id, "user": user, "token": made.secret}
    if action == "revoke":
        ids = revoke(w.store, user, token_id)
        w.audit.append(user, "web.token.revoke", payload={"token_ids": ids})
        return {"user": user, "revoked": ids}
    rows = listed(w.store, user)
    return {
        "user": user,
        "tokens": [
            {"id": i, "created_at": c.isoformat(), "revoked_at": r.isoformat() if r else None}
            for i, c, r in rows
        ],
    }
