"""The kill switch: `nightshift pause` stops every action but reads until `nightshift resume`.

It lives in the store's KeyValue table, so every process (CLI, daemon, chat) sees it at once.
"""

from __future__ import annotations

import json
from typing import Any

from nightshift.policies.audit import AuditLog
from nightshift.runtime.store import kill_switch_row
from nightshift.runtime.store.db import Store

KEY = kill_switch_row.KEY


def pause(store: Store, audit: AuditLog, by: str, reason: str) -> dict[str, Any]:
    """Turn the switch on (again: the newest reason wins); returns what is recorded."""
    info = {"by": by, "reason": reason, "at": audit.now_iso()}
    store.set_kv(KEY, json.dumps(info))
    audit.append(by, "kill_switch.pause", payload={"reason": reason}, ts=info["at"])
    return info


def resume(store: Store, audit: AuditLog, by: str) -> bool:
    """Turn the switch off; returns whether it was on. Audited either way."""
    was = pause_info(store)
    store.set_kv(KEY, None)
    audit.append(
        by,
        "kill_switch.resume",
        payload={"was_paused": was is not None, "paused_by": was["by"] if was else None},
    )
    return was is not None


def is_paused(store: Store) -> bool:
    return store.get_kv(KEY) is not None


def pause_info(store: Store) -> dict[str, Any] | None:
    """{by, reason, at} while paused, else None."""
    return kill_switch_row.pause_info(store.get_kv(KEY))
