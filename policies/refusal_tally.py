"""Refusals cost a bounded amount of audit: per source and minute, the first few are written in
full and the rest are counted into one aggregate event.

Every refused request used to be its own signed event, so anyone who may connect could fill the
disk by sending junk (issue 27). Now a source (a uid on the daemon's socket, a remote address on
the callback endpoint) gets `in_full` refusals a wall-clock minute written as before, so a single
mistake is still explained in full; further ones in that minute are counted, and when the minute
closes (at the next refusal after it, at a periodic `flush`, at shutdown) one aggregate event
says how many there were, of which kinds, when, and a few of their reasons. At most
`max_sources` sources are tracked a minute; refusals from further ones share an `overflow`
bucket that is only counted. The audit therefore grows by at most
`max_sources × (in_full + 1) + 1` events a minute, whatever arrives.

`RateLimits` is the other half of the same bound: per-source token buckets, so that what a
source sends past its rate is refused cheaply (and tallied here) before any work is done.

Nothing here reads a clock: callers pass `now` (or, to `RefusalLog`, their clock).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nightshift.policies.audit import AuditLog, iso_utc

OVERFLOW = "overflow"
SAMPLES = 3  # reasons kept per aggregate
SAMPLE_CHARS = 200  # each cut to this


def _minute(now: datetime) -> datetime:
    return now.replace(second=0, microsecond=0)


@dataclass
class _Bucket:
    """One source's refusals in the open minute."""

    actor: str
    about: dict[str, Any]
    first_at: datetime
    last_at: datetime
    count: int = 0
    in_full: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    reasons: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # the overflow bucket's first few


@dataclass(frozen=True)
class Aggregate:
    """A closed minute of one source whose refusals were not all written in full."""

    source: str
    actor: str
    minute: datetime
    payload: dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    in_full: bool  # write this refusal's own event, as before
    closed: list[Aggregate]  # minutes this refusal closed: one aggregate event each


class RefusalTally:
    """Thread-safe counts of refusals by (source, kind) in the current wall-clock minute."""

    def __init__(self, *, in_full: int = 10, max_sources: int = 1024):
        self.in_full = max(0, in_full)
        self.max_sources = max(1, max_sources)
        self._lock = threading.Lock()
        self._minute: datetime | None = None
        self._buckets: dict[str, _Bucket] = {}

    def note(
        self,
        source: str,
        kind: str,
        reason: str,
        now: datetime,
        *,
        actor: str = "system",
        about: dict[str, Any] | None = None,
    ) -> Verdict:
        """Count one refusal. A refusal stamped before the open minute (a thread that read the
        clock just before another closed it) counts in the open minute: one aggregate per
        source and minute, never two."""
        with self._lock:
            closed: list[Aggregate] = []
            minute = _minute(now)
            if self._minute is None or minute > self._minute:
                closed = self._close()
                self._minute = minute
            key = source
            if key not in self._buckets and len(self._buckets) >= self.max_sources:
                key = OVERFLOW
            b = self._buckets.get(key)
            if b is None:
                b = self._buckets[key] = _Bucket(
                    actor="system" if key == OVERFLOW else actor,
                    about={} if key == OVERFLOW else dict(about or {}),
                    first_at=now,
                    last_at=now,
                )
            b.count += 1
            b.kinds[kind] += 1
            b.first_at, b.last_at = min(b.first_at, now), max(b.last_at, now)
            if key == OVERFLOW and len(b.sources) < SAMPLES and source not in b.sources:
                b.sources.append(source[:SAMPLE_CHARS])
            full = key != OVERFLOW and b.in_full < self.in_full
            if full:
                b.in_full += 1
            elif len(b.reasons) < SAMPLES:
                cut = reason[:SAMPLE_CHARS]
                if cut not in b.reasons:
                    b.reasons.append(cut)
            return Verdict(full, closed)

    def flush(self, now: datetime | None = None) -> list[Aggregate]:
        """Close the open minute if `now` is past it (None: close it regardless, at shutdown)."""
        with self._lock:
            if self._minute is None or (now is not None and _minute(now) <= self._minute):
                return []
            closed = self._close()
            self._minute = None
            return closed

    def _close(self) -> list[Aggregate]:
        minute, buckets = self._minute, self._buckets
        self._buckets = {}
        if minute is None:
            return []
        out = []
        for source, b in buckets.items():
            if b.count <= b.in_full:
                continue  # every one was written in full: nothing to add
            payload: dict[str, Any] = {
                "source": source,
                **b.about,
                "minute": iso_utc(minute),
                "first_at": iso_utc(b.first_at),
                "last_at": iso_utc(b.last_at),
                "count": b.count,
                "in_full": b.in_full,
                "counted_only": b.count - b.in_full,
                "kinds": dict(sorted(b.kinds.items())),
                "reasons": list(b.reasons),
            }
            if source == OVERFLOW:
                payload["sources_sample"] = list(b.sources)
            out.append(Aggregate(source, b.actor, minute, payload))
        return out


class RefusalLog:
    """Refusals into the audit through a `RefusalTally`: `refused` writes the refusal's own
    event (`action`) while its source is within its minute's `in_full`, and one `aggregate`
    event for each minute closed. The server calls `flush` periodically and at shutdown.
    Audit errors propagate: the caller says them where its errors go."""

    def __init__(
        self,
        audit: AuditLog,
        clock: Callable[[], datetime],
        *,
        action: str,
        aggregate: str,
        in_full: int = 10,
        max_sources: int = 1024,
    ):
        self.audit, self.clock = audit, clock
        self.action, self.aggregate = action, aggregate
        self.tally = RefusalTally(in_full=in_full, max_sources=max_sources)

    def refused(
        self,
        source: str,
        kind: str,
        reason: str,
        *,
        actor: str,
        payload: dict[str, Any],
        about: dict[str, Any] | None = None,
        aggregate_actor: str | None = None,
    ) -> bool:
        """Tally one refusal and write what is due. True when it was written in full. The
        source's aggregate is `aggregate_actor`'s (default `actor`) from its first refusal."""
        verdict = self.tally.note(
            source, kind, reason, self.clock(), actor=aggregate_actor or actor, about=about
        )
        items = self._events(verdict.closed)
        if verdict.in_full:
            items.append({"actor": actor, "action": self.action, "payload": payload})
        if items:
            self.audit.append_many(items)
        return verdict.in_full

    def flush(self, *, final: bool = False) -> int:
        """Write the aggregates of a minute that has closed (every open one when `final`);
        how many were written."""
        items = self._events(self.tally.flush(None if final else self.clock()))
        if items:
            self.audit.append_many(items)
        return len(items)

    def _events(self, closed: list[Aggregate]) -> list[dict[str, Any]]:
        return [{"actor": a.actor, "action": self.aggregate, "payload": a.payload} for a in closed]


class RateLimits:
    """Token buckets, one per key: `rate` tokens a second up to `burst`. `take` spends one and
    returns 0, or returns the seconds until one is there (nothing spent). At most `max_keys`
    buckets: past that, the full ones (as good as none) are forgotten, then the least recently
    used."""

    def __init__(self, rate: float, burst: int, *, max_keys: int = 4096):
        self.rate, self.burst, self.max_keys = rate, float(max(1, burst)), max(1, max_keys)
        self._lock = threading.Lock()
        self._buckets: dict[Any, tuple[float, float]] = {}  # key → (tokens, at), oldest use first

    def take(self, key: Any, now: float) -> float:
        with self._lock:
            tokens, at = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + max(0.0, now - at) * self.rate)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / self.rate
            self._buckets[key] = (tokens, now)
            if len(self._buckets) > self.max_keys:
                self._forget(now)
            return wait

    def _forget(self, now: float) -> None:
        full = [
            k
            for k, (tokens, at) in self._buckets.items()
            if tokens + (now - at) * self.rate >= self.burst
        ]
        for k in full:
            del self._buckets[k]
        while len(self._buckets) > self.max_keys:
            del self._buckets[next(iter(self._buckets))]
