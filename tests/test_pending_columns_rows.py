"""`PendingColumns.rows_of` finds each waiting job's row however the caller's list changed
between calls: jobs dropped anywhere, new ones added anywhere, the order shuffled, fields
assigned in place (a row then stale), and with or without the daemon's hint of where each job
sat. Every row it returns holds that very job with its current fields."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nightshift.runtime.scheduling import pending_columns
from nightshift.runtime.scheduling.pending_columns import PendingColumns, _aligned
from nightshift.runtime.scheduling.placement import PendingJob

NOW = datetime(2026, 12, 7, 12, 0)


def _job(jid: int) -> PendingJob:
    return PendingJob(
        id=jid, priority=jid % 7, gpus=jid % 3, submitted_at=NOW - timedelta(seconds=jid)
    )


def _check(cols: PendingColumns, pending: list[PendingJob], rows: np.ndarray) -> None:
    for job, row in zip(pending, rows.tolist(), strict=True):
        assert cols.job[row] is job
        assert (cols.jid[row], cols.prio[row]) == (job.id, job.priority)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), calls=st.integers(2, 6), hinted=st.booleans())
def test_every_row_holds_its_job_after_any_change(seed: int, calls: int, hinted: bool) -> None:
    """Why: a row found by position in the last call's list (the daemon's hint, or the walk in
    step when there is none) must be that job's and current; a stale one places a job as it
    was, or another job."""
    rnd = random.Random(seed)
    cols = PendingColumns((0,), "backoff")
    pending_columns._SHARED[-seed - 1] = cols  # so that `forget` reaches it
    try:
        pending = [_job(i) for i in range(rnd.randint(0, 400))]
        top = len(pending)
        rows = cols.rows_of(pending)
        while rows is None and pending:
            rows = cols.rows_of(pending)  # new objects: copied in when seen again
        for _ in range(calls):
            was = {id(j): k for k, j in enumerate(pending)}
            roll = rnd.random()
            nxt = [j for j in pending if rnd.random() > rnd.choice([0.0, 0.01, 0.3])]
            for _ in range(rnd.choice([0, 1, 5, 50])):  # new jobs anywhere, most at the end
                at = len(nxt) if rnd.random() < 0.7 else rnd.randint(0, len(nxt))
                nxt.insert(at, _job(top := top + 1))
            if roll < 0.1:
                rnd.shuffle(nxt)
            elif roll < 0.2 and len(nxt) > 2:
                a, b = sorted(rnd.sample(range(len(nxt)), 2))
                nxt[a], nxt[b] = nxt[b], nxt[a]
            for j in rnd.sample(nxt, min(len(nxt), rnd.choice([0, 1, 3, 30]))):
                j.priority += 1  # in place: its row is stale now
            if rnd.random() < 0.2 and nxt:  # the same job as a new object
                k = rnd.randrange(len(nxt))
                nxt[k] = nxt[k].model_copy()
            pending = nxt
            hint = (
                np.array([was.get(id(j), -1) for j in pending], dtype=np.int64) if hinted else None
            )
            rows = cols.rows_of(pending, hint)
            if rows is not None:
                _check(cols, pending, rows)
    finally:
        del pending_columns._SHARED[-seed - 1]


@given(st.lists(st.integers(0, 60), max_size=200, unique=True), st.integers(0, 2**32 - 1))
def test_the_walk_in_step_finds_only_true_places(then: list[int], seed: int) -> None:
    """Why: its guesses are checked one by one, but each miss costs a lookup: in a list that
    lost some jobs and gained some, the walk finds where each job of both lists was."""
    rnd = random.Random(seed)
    now = [i for i in then if rnd.random() > 0.2]
    for i in range(61, 61 + rnd.randint(0, 10)):
        now.insert(rnd.randint(0, len(now)), i)
    got = _aligned(np.array(now, dtype=np.int64), np.array(then, dtype=np.int64))
    if got is None:
        return
    for k, place in enumerate(got.tolist()):
        if place >= 0:
            assert then[place] == now[k]
    # order kept: every job of both is found
    assert sum(1 for p in got.tolist() if p >= 0) == len(set(now) & set(then))


def test_a_caller_whose_lists_never_walk_in_step_is_walked_less_and_less(monkeypatch) -> None:
    """Why: a walk that gives up costs ≈ 5 ms at 100,000 jobs before the dict lookup it falls
    back to; a caller that reorders its queue at every call would pay it every time."""
    cols = PendingColumns((0,), "backoff")
    pending = [_job(i) for i in range(300)]
    cols.rows_of(pending)
    cols.rows_of(pending)
    walks = []
    real = pending_columns._aligned

    def counting(ids, then):  # type: ignore[no-untyped-def]
        walks.append(len(ids))
        return real(ids, then)

    monkeypatch.setattr(pending_columns, "_aligned", counting)
    rnd = random.Random(0)
    for call in range(12):
        rnd.shuffle(pending)
        before = len(walks)
        rows = cols.rows_of(list(pending))
        assert rows is not None
        _check(cols, pending, rows)
        if call in (0, 2, 6):  # walked, gave up: then 1, then 3 calls not walked
            assert len(walks) == before + 1
        else:
            assert len(walks) == before
    for k in range(3):  # in step again (a job added at each call): walked when its turn comes
        pending.append(_job(1000 + k))
        cols.rows_of(list(pending))
    assert cols.unaligned == 0
    before = len(walks)
    pending.append(_job(2000))
    cols.rows_of(list(pending))
    assert len(walks) == before + 1  # and at every call from then on
