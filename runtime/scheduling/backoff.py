"""Retry backoff: exponential in the attempt number, capped, with jitter that is deterministic.

The jitter spreads retries of jobs that failed together (a GPU fell over under eight of them) so
they do not all come back in the same second, yet it is seeded from (job id, attempt) through a
hash, never from a global random source: the same failure always waits the same time, in the
daemon, in a test and in the simulator.
"""

from __future__ import annotations

import hashlib
import math
from datetime import datetime, timedelta

from pydantic import BaseModel, Field


class Backoff(BaseModel):
    """How long a failed job waits before its next attempt (a config section)."""

    base_s: float = Field(30.0, ge=0, description="Wait after the first failed attempt")
    factor: float = Field(2.0, ge=1, description="Each further failure multiplies the wait by this")
    cap_s: float = Field(3600.0, ge=0, description="No wait is longer than this")
    jitter_frac: float = Field(
        0.2, ge=0, le=1, description="Up to this fraction is taken off each wait, per job"
    )

    def delay_s(self, attempt: int, job_id: int) -> float:
        return backoff_delay_s(
            attempt, job_id, self.base_s, self.factor, self.cap_s, self.jitter_frac
        )

    def not_before(
        self, ended_at: datetime, attempt: int, job_id: int, base_s: float | None = None
    ) -> datetime:
        """`base_s`: a spec's own first wait (its `retry_wait_s`) instead of this section's."""
        return not_before(
            ended_at,
            attempt,
            job_id,
            self.base_s if base_s is None else base_s,
            self.factor,
            self.cap_s,
            self.jitter_frac,
        )


def unit_jitter(job_id: int, attempt: int) -> float:
    """A number in [0, 1) that depends only on (job_id, attempt)."""
    digest = hashlib.blake2b(f"{job_id}:{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def backoff_delay_s(
    attempt: int,
    job_id: int,
    base_s: float = 30.0,
    factor: float = 2.0,
    cap_s: float = 3600.0,
    jitter_frac: float = 0.2,
) -> float:
    """Seconds to wait after failed attempt number `attempt` (1 = the first attempt):
    min(cap, base × factor^(attempt − 1)), less up to `jitter_frac` of it. Jitter only shortens a
    wait, so the cap holds and jobs that all reached it still spread out."""
    if attempt < 1:
        raise ValueError(f"attempt is the number of the attempt that failed, from 1; got {attempt}")
    if base_s <= 0 or cap_s <= 0:
        return 0.0
    steps = attempt - 1
    if factor > 1 and steps > math.log(cap_s / base_s, factor):  # also keeps factor**steps finite
        raw = cap_s
    else:
        raw = min(cap_s, base_s * factor**steps)
    return raw * (1.0 - jitter_frac * unit_jitter(job_id, attempt))


def not_before(
    ended_at: datetime,
    attempt: int,
    job_id: int,
    base_s: float = 30.0,
    factor: float = 2.0,
    cap_s: float = 3600.0,
    jitter_frac: float = 0.2,
) -> datetime:
    """When a job whose attempt `attempt` failed at `ended_at` may start again."""
    return ended_at + timedelta(
        seconds=backoff_delay_s(attempt, job_id, base_s, factor, cap_s, jitter_frac)
    )
