"""Expected durations learned from the store's history (runtime/scheduling/estimates.py): this
job's earlier runs first, then its owner's estimate corrected by how their estimates turned out,
then runs of its name; read by the daemon's snapshot from real store rows."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from nightshift.runtime.scheduling.estimates import (
    MIN_RATIOS,
    Estimator,
    PastRun,
    params_key,
    upper_ratio,
)
from nightshift.runtime.scheduling.snapshot import load_snapshot
from nightshift.runtime.store.db import Attempt, Job, Store

NOON = datetime(2026, 12, 6, 12, 0)
H = 3600.0


def run(owner="alice", name="bert", params=None, asked_h=None, took_h=1.0) -> PastRun:
    return PastRun(owner, name, params_key(params), asked_h and asked_h * H, took_h * H)


def test_this_jobs_own_runs_come_first():
    est = Estimator([run(took_h=5), run(took_h=7), run(took_h=6), run(name="other", took_h=1)])
    e = est.estimate("alice", "bert", params_key(None), asked_s=1 * H)
    assert e is not None and e.expected_s == 6 * H and e.source == "this job's earlier runs"
    assert 6 * H <= e.upper_s <= 7 * H


def test_an_owners_estimate_is_scaled_by_how_their_estimates_turned_out():
    """Alice's estimates were half the truth three times: her new 2 h reads as 4 h; Bob, with no
    such record, is taken at his word."""
    past = [run(name=f"j{i}", asked_h=1, took_h=2) for i in range(MIN_RATIOS)]
    est = Estimator(past)
    e = est.estimate("alice", "new", params_key({"lr": 0.1}), asked_s=2 * H)
    assert e is not None and e.expected_s == pytest.approx(4 * H)
    assert "turned out" in e.source
    bob = est.estimate("bob", "new", params_key(None), asked_s=2 * H)
    assert bob is not None and bob.expected_s == 2 * H
    assert bob.source.startswith("the owner's estimate")
    few = Estimator(past[: MIN_RATIOS - 1]).estimate("alice", "new", params_key(None), 2 * H)
    assert few is not None and few.expected_s == 2 * H  # too few to judge her by
    assert few.upper_s == 2 * H  # and too few of anyone's for a worst case


def test_a_newcomers_worst_case_comes_from_everyones_estimates():
    """Bob has no finished job: his 2 h is expected as asked (nobody's bias is his), but what
    a hold must leave room for is what everyone's estimates came to (Alice's ran to double);
    where everyone's ran under their estimates, his worst case is his estimate."""
    late = Estimator([run(name=f"j{i}", asked_h=1, took_h=2) for i in range(MIN_RATIOS)])
    bob = late.estimate("bob", "new", params_key(None), asked_s=2 * H)
    assert bob is not None and (bob.expected_s, bob.upper_s) == (2 * H, 4 * H)
    assert "everyone's" in bob.source
    early = Estimator([run(name=f"j{i}", asked_h=2, took_h=1) for i in range(MIN_RATIOS)])
    bob = early.estimate("bob", "new", params_key(None), asked_s=2 * H)
    assert bob is not None and (bob.expected_s, bob.upper_s) == (2 * H, 2 * H)


def test_other_parameters_then_other_owners_when_nothing_was_asked():
    est = Estimator([run(params={"lr": 1}, took_h=3), run(owner="bob", name="gpt", took_h=9)])
    mine = est.estimate("alice", "bert", params_key({"lr": 2}), asked_s=None)
    assert mine is not None and mine.expected_s == 3 * H
    assert mine.source == "the owner's runs of this name"
    theirs = est.estimate("alice", "gpt", params_key(None), asked_s=None)
    assert theirs is not None and theirs.expected_s == 9 * H
    assert est.estimate("alice", "never-seen", params_key(None), asked_s=None) is None


def test_parameters_are_one_key_whatever_their_order():
    assert params_key({"a": 1, "b": 2}) == params_key({"b": 2, "a": 1})


def _job(s, name, owner, *, state, asked_min=None, params=None, attempts=()):
    resources = {"gpus": 1} | ({"expected_duration_min": asked_min} if asked_min else {})
    job = Job(
        name=name,
        owner=owner,
        state=state,
        params=params or {},
        spec={"name": name, "command": ["true"], "resources": resources},
        created_at=NOON - timedelta(days=2),
        updated_at=NOON - timedelta(days=1),
    )
    s.add(job)
    s.flush()
    start = NOON - timedelta(days=2)
    for n, (hours, outcome) in enumerate(attempts, 1):
        s.add(
            Attempt(
                job_id=job.id,
                number=n,
                state="ended",
                outcome=outcome,
                gpus=[0],
                started_at=start,
                ended_at=start + timedelta(hours=hours),
            )
        )
        start += timedelta(hours=hours + 1)


def test_the_snapshot_expects_what_the_store_says_the_jobs_took(tmp_path):
    """From real rows: a job that needed two attempts took both (3 h + 2 h); alice's three
    earlier estimates were a third of the truth, so her new 1 h job is expected to take 3 h; a
    queued job of a name with history and no estimate gets that name's median."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    with store.session() as s:
        _job(s, "bert", "alice", state="succeeded", attempts=[(3, "failed"), (2, "succeeded")])
        for i in range(3):
            _job(
                s, f"old{i}", "alice", state="succeeded", asked_min=60, attempts=[(3, "succeeded")]
            )
        _job(s, "bert", "alice", state="queued")
        _job(s, "fresh", "alice", state="queued", asked_min=60)
        _job(s, "fresh", "bob", state="queued", asked_min=60)
        s.commit()
    sn = load_snapshot(store, NOON)
    got = {(p.name, p.id): p.expected_duration_s for p in sn.pending}
    bert = next(v for (n, _), v in got.items() if n == "bert")
    assert bert == pytest.approx(5 * H)
    fresh = sorted(v for (n, _), v in got.items() if n == "fresh")
    assert fresh == [pytest.approx(1 * H), pytest.approx(3 * H)]  # bob as asked, alice × 3
    # what a hold must leave room for: the worst her estimates came to (3 ×); bob has none of
    # his own, so everyone's (hers: 3 ×) sets his
    uppers = sorted(p.expected_upper_s for p in sn.pending if p.name == "fresh")
    assert uppers == [pytest.approx(3 * H), pytest.approx(3 * H)]


def test_a_running_job_carries_the_worst_its_owners_estimates_came_to(tmp_path):
    """Alice's last three 1 h estimates took 1, 1 and 4 h: her running 1 h job is expected at
    start + 1 h, and may end at worst at start + 1 h × upper_ratio of those (what a tariff pause
    must leave room for: placement's `upper_end`)."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    with store.session() as s:
        for i, took in enumerate((1, 1, 4)):
            _job(s, f"old{i}", "alice", state="succeeded", asked_min=60, attempts=[(took, "ok")])
        live = Job(
            name="live",
            owner="alice",
            state="running",
            params={},
            spec={"name": "live", "command": ["true"], "resources": {"expected_duration_min": 60}},
            created_at=NOON - timedelta(hours=1),
            updated_at=NOON,
        )
        s.add(live)
        s.flush()
        started = NOON - timedelta(minutes=30)
        s.add(Attempt(job_id=live.id, number=1, state="running", gpus=[0], started_at=started))
        s.commit()
    (r,) = [r for r in load_snapshot(store, NOON).running if r.name == "live"]
    worst = upper_ratio([1.0, 1.0, 4.0])
    assert worst is not None and worst > 1
    assert r.expected_end == started + timedelta(hours=1)
    assert r.upper_end == started + timedelta(hours=worst)


def test_no_worst_case_until_enough_estimates_were_checked():
    assert upper_ratio([2.0] * (MIN_RATIOS - 1)) is None
    assert upper_ratio([2.0] * MIN_RATIOS) == 2.0
    assert upper_ratio([1.0] * 9 + [10.0]) > 1.0  # one bad miss in ten moves the worst case


def _bobs_paused_job(
    s, state: str, asked_min: float, ran_h: float, ended_at: datetime, resumed: bool = True
) -> int:
    """Bob's job "long" (no history: his estimate as asked) whose first attempt ran `ran_h`
    hours until `ended_at` and was paused at a checkpoint; resumed from it unless told not."""
    job = Job(
        name="long",
        owner="bob",
        state=state,
        params={},
        spec={
            "name": "long",
            "command": ["true"],
            "resources": {"gpus": 1, "expected_duration_min": asked_min},
        },
        created_at=NOON - timedelta(days=1),
        updated_at=NOON,
        resume_from="/ckpt/long/step-100" if resumed else None,
    )
    s.add(job)
    s.flush()
    s.add(
        Attempt(
            job_id=job.id,
            number=1,
            state="ended",
            outcome="preempted",
            gpus=[0],
            started_at=ended_at - timedelta(hours=ran_h),
            ended_at=ended_at,
        )
    )
    assert job.id is not None
    return job.id


@pytest.mark.parametrize(
    ("asked_min", "ran_h", "expected_h"),
    [
        (600, 4.0, 6.0),  # 10 h asked, 4 h run: what remains
        (600, 9.99, 1 / 60),  # nearly done: a minute at least
        (1, 6.0, 6.0),  # a minute asked, six hours run: as long again, not a minute
    ],
)
def test_a_resumed_job_that_outran_its_estimate_expects_as_long_again(
    tmp_path, asked_min, ran_h, expected_h
):
    """A job paused at a checkpoint and queued again expects what remains of its estimate after
    its attempts; once those outran the estimate, as long again as they ran (bob has no
    history, so his estimate is as asked and its worst case the same). Read as a minute, a job
    whose estimate was a lie would go to the head of the srpt queue at every resume."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    with store.session() as s:
        _bobs_paused_job(s, "queued", asked_min, ran_h, NOON - timedelta(hours=1))
        s.commit()
    (p,) = load_snapshot(store, NOON).pending
    assert p.expected_duration_s == pytest.approx(expected_h * H)
    assert p.expected_upper_s is not None and p.expected_upper_s >= p.expected_duration_s


@pytest.mark.parametrize(("resumed", "left_h"), [(True, 6.0), (False, 10.0)])
def test_a_running_resumed_job_ends_by_what_its_earlier_attempts_left(tmp_path, resumed, left_h):
    """Bob asked 10 h; his first attempt ran 4 h and was paused at a checkpoint. Its second,
    running for half an hour, resumed from that checkpoint: it is expected to end 6 h after it
    started, not 10 (as the queue expected it, and as the simulator runs it). Restarted from
    scratch, the whole 10 h."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    second = NOON - timedelta(minutes=30)
    with store.session() as s:
        job_id = _bobs_paused_job(s, "running", 600, 4.0, NOON - timedelta(hours=2), resumed)
        s.add(Attempt(job_id=job_id, number=2, state="running", gpus=[0], started_at=second))
        s.commit()
    (r,) = load_snapshot(store, NOON).running
    assert r.expected_end == second + timedelta(hours=left_h)
    assert r.upper_end is not None and r.upper_end >= r.expected_end
