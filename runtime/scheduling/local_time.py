"""Times people write — "07:00", "2026-12-05T06:00" — turned into the naive UTC the store and
placement use, in the zone they meant: the configured display zone, else this machine's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo


def local_zone(name: str | None) -> tzinfo:
    """The zone `until` and naive deadlines are read in: the setting's, else this machine's."""
    if name:
        return ZoneInfo(name)
    local = datetime.now().astimezone().tzinfo
    assert local is not None
    return local


def until_deadline(until: str, now_utc: datetime, tz: tzinfo) -> datetime:
    """The next local `HH:MM` after `now_utc` (naive UTC), as naive UTC."""
    hh, mm = (int(x) for x in until.split(":"))
    local = now_utc.replace(tzinfo=UTC).astimezone(tz)
    target = local.replace(hour=hh, minute=mm, second=0, microsecond=0)
    if target <= local:
        target = (local + timedelta(days=1)).replace(hour=hh, minute=mm, second=0, microsecond=0)
        target = target.replace(tzinfo=tz)  # the zone's offset on that day
    return target.astimezone(UTC).replace(tzinfo=None)


def deadline_of(text: str, submitted_utc: datetime, tz: tzinfo) -> datetime:
    """A spec's `deadline` as naive UTC: "HH:MM" is the next such local time after the job was
    submitted; an ISO date-time is read in `tz` unless it names its own offset. ValueError for
    anything else (the spec's validator refuses it first)."""
    text = text.strip()
    if len(text) <= 5 and ":" in text:
        return until_deadline(text, submitted_utc, tz)
    at = datetime.fromisoformat(text)
    at = at if at.tzinfo is not None else at.replace(tzinfo=tz)
    return at.astimezone(UTC).replace(tzinfo=None)
