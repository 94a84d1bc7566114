"""Durations on the monotonic clock: how long an attempt has run or been quiet, immune to a
wall-clock step (NTP, a hand-set clock), which moves only tariff windows and deadlines."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path


def boot_id() -> str:
    """This boot of the machine: the monotonic clock means something only within one boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return f"pid-start-{time.time() - time.monotonic():.0f}"


def elapsed_s(
    started_mono: float | None,
    boot: str | None,
    started_at: datetime,
    *,
    mono_now: float,
    this_boot: str,
    now: datetime,
) -> float:
    """Seconds since a recorded moment: on the monotonic clock when it was taken on this boot
    (a wall-clock step changes nothing), else by the wall clock (a record from before 0009)."""
    if started_mono is not None and boot == this_boot:
        return max(0.0, mono_now - started_mono)
    return max(0.0, (now - started_at).total_seconds())
