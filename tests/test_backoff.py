"""Retry backoff: exponential, capped, with jitter that depends only on (job, attempt)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest

from nightshift.runtime.scheduling.backoff import Backoff, backoff_delay_s, not_before


def test_grows_by_the_factor_until_the_cap():
    """Without jitter: base, base×factor, … and never past the cap."""
    got = [
        backoff_delay_s(n, 1, base_s=30, factor=2, cap_s=600, jitter_frac=0) for n in range(1, 8)
    ]
    assert got == [30, 60, 120, 240, 480, 600, 600]


def test_jitter_is_deterministic_and_only_shortens():
    """Same job and attempt, same wait, whatever the global random state; never above the raw
    exponential, never below (1 − jitter_frac) of it."""
    first = backoff_delay_s(3, 42, 30, 2, 3600, 0.2)
    random.seed(7)
    assert backoff_delay_s(3, 42, 30, 2, 3600, 0.2) == first
    for job in range(200):
        d = backoff_delay_s(3, job, 30, 2, 3600, 0.2)
        assert 0.8 * 120 <= d <= 120


def test_jitter_spreads_jobs_that_failed_together():
    """Fifty jobs failing at once do not all come back in the same second."""
    waits = {round(backoff_delay_s(2, job, 30, 2, 3600, 0.5)) for job in range(50)}
    assert len(waits) > 20


def test_jobs_at_the_cap_still_spread_out():
    """Jitter below the cap keeps jobs that all reached it apart."""
    waits = {backoff_delay_s(20, job, 30, 2, 600, 0.2) for job in range(20)}
    assert max(waits) <= 600 and len(waits) == 20


def test_huge_attempt_numbers_do_not_overflow():
    """factor ** attempt would overflow a float; the cap is reached first."""
    assert backoff_delay_s(10**6, 1, 30, 2, 3600, 0) == 3600


def test_attempt_numbers_start_at_one():
    """The attempt is the number of the one that failed; 0 is a usage error."""
    with pytest.raises(ValueError, match="from 1"):
        backoff_delay_s(0, 1)


def test_not_before_adds_the_delay_and_the_model_matches_the_functions():
    """not_before is the end of the failed attempt plus its delay; Backoff is the config form."""
    ended = datetime(2026, 12, 2, 3, 0)
    policy = Backoff(base_s=60, factor=3, cap_s=7200, jitter_frac=0.1)
    want = ended + timedelta(seconds=backoff_delay_s(2, 9, 60, 3, 7200, 0.1))
    assert not_before(ended, 2, 9, 60, 3, 7200, 0.1) == want
    assert policy.not_before(ended, 2, 9) == want
    assert policy.delay_s(2, 9) == pytest.approx(want.timestamp() - ended.timestamp())
