"""The kill switch's row in the store's KeyValue table: its key, and what its value says. The
switch itself (pause, resume, audited) is policies/killswitch.py; this is what every reader of the
row shares, the ORM's and the read commands' (quick_read.py) alike."""

from __future__ import annotations

import json
from typing import Any

KEY = "kill_switch"


def pause_info(raw: str | None) -> dict[str, Any] | None:
    """{by, reason, at} while paused (the row's value), else None."""
    if raw is None:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        info = None
    if not isinstance(info, dict):  # written by hand or by an older version: still paused
        return {"by": "unknown", "reason": str(raw), "at": None}
    return info
