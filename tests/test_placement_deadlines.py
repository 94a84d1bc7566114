"""Placement, issue 14: holds and pauses that keep deadlines, price bands, and the queue orders
and host fit that the simulation measured (docs/benchmarks.md)."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from nightshift.evals.simulate import tariff as simulated_tariff
from nightshift.runtime.scheduling.placement import GpuSlot, PendingJob, RunningJob, Snapshot, place
from nightshift.runtime.scheduling.tariff import Tariff

NOON = datetime(2026, 12, 2, 12, 0)  # naive UTC; the tariff below is in UTC too
H = timedelta(hours=1)


def three_band() -> Tariff:
    """valley 23-07 (0.10), shoulder (0.20), peak 17-21 (0.35), shoulder 21-23: the simulator's."""
    return simulated_tariff()


def gpus(n: int, host: str = "a") -> list[GpuSlot]:
    return [GpuSlot(index=i, memory_total_mib=80 * 1024, host=host) for i in range(n)]


def cs_job(id: int = 1, hours: float = 2.0, deadline: datetime | None = None, **kw) -> PendingJob:
    kw.setdefault("submitted_at", NOON)
    return PendingJob(
        id=id,
        gpus=1,
        cost_class="cost_sensitive",
        expected_duration_s=hours * 3600,
        deadline=deadline,
        **kw,
    )


def snap(pending, now: datetime = NOON, running=(), n_gpus: int = 2, **kw) -> Snapshot:
    kw.setdefault("tariff", three_band())
    return Snapshot(now=now, pending=list(pending), running=list(running), gpus=gpus(n_gpus), **kw)


# ------------------------------------------------------------------------------ holds
def test_hold_only_while_the_deadline_can_still_be_met():
    """At noon a 2 h job waits for 23:00 when its deadline allows (and the reason says so); with
    a deadline the valley cannot meet it starts now, and the start says why."""
    roomy = place(snap([cs_job(deadline=NOON + 20 * H)]))
    assert roomy.starts == []
    assert roomy.holds[1].startswith("held for off-peak until 23:00")
    assert "deadline" in roomy.holds[1] and "still met" in roomy.holds[1]

    tight = place(snap([cs_job(deadline=NOON + 10 * H)]))  # 23:00 + 2 h + 1 h slack > 22:00
    assert [s.job_id for s in tight.starts] == [1]
    assert "would miss its deadline" in tight.starts[0].note


def test_a_hold_leaves_room_for_what_such_estimates_came_to():
    """The same 2 h job due in 20 h waits for 23:00 on its estimate; when its estimates have run
    to 9 h at worst (expected_upper_s, from the store's history), 23:00 + 9 h + the slack misses
    08:00, and it starts now instead."""
    assert place(snap([cs_job(deadline=NOON + 20 * H)])).holds
    risky = place(snap([cs_job(deadline=NOON + 20 * H, expected_upper_s=9 * 3600)]))
    assert [s.job_id for s in risky.starts] == [1]
    assert place(snap([cs_job(deadline=NOON + 20 * H, expected_upper_s=3 * 3600)])).holds


def test_hold_slack_is_kept():
    """The cheap period must open `hold_slack_s` before the latest start that keeps the deadline."""
    deadline = NOON + 13 * H  # 01:00: 23:00 + 2 h leaves no slack
    assert place(snap([cs_job(deadline=deadline)], hold_slack_s=0)).holds
    assert place(snap([cs_job(deadline=deadline)], hold_slack_s=600)).starts


def test_long_job_waits_for_the_next_cheap_period_only_when_the_deadline_allows():
    """A 12 h job outlasts every 8 h valley: with room it waits for 23:00 and runs past 07:00;
    a job without a deadline keeps the old rule (start as a cheap period opens)."""
    d = place(snap([cs_job(hours=12, deadline=NOON + 40 * H), cs_job(2, hours=12)]))
    assert d.starts == []
    assert "outlasts it" in d.holds[1] and "longer than every cheap period" in d.holds[2]
    assert place(snap([cs_job(hours=12, deadline=NOON + 20 * H)])).starts


AFTER_VALLEY = datetime(2026, 12, 3, 7, 30)  # the valley closed at 07:00


def valley_job(deadline: datetime, upper_end: datetime | None = None) -> RunningJob:
    """A cost-sensitive job started in the valley, 4 h left by its estimate at 07:30."""
    return RunningJob(
        id=5,
        gpus=[0],
        pausable=True,
        cost_class="cost_sensitive",
        started_at=AFTER_VALLEY - 3 * H,
        expected_end=AFTER_VALLEY + 4 * H,
        upper_end=upper_end,
        deadline=deadline,
    )


def test_pause_only_when_it_can_resume_and_still_meet_the_deadline():
    """At 07:30 a job started in the valley with 4 h left pauses when 23:00 + 4 h meets its
    deadline, and runs through when it does not."""
    now = AFTER_VALLEY
    running = valley_job

    paused = place(snap([], now=now, running=[running(now + 30 * H)]))
    assert [p.job_id for p in paused.pauses] == [5]
    assert paused.pauses[0].resume_at == datetime(2026, 12, 3, 23, 0)
    assert place(snap([], now=now, running=[running(now + 18 * H)])).pauses == []


def test_a_job_started_off_peak_for_its_deadline_is_not_paused():
    """Started in the shoulder because waiting would miss: no pause at the next call."""
    r = RunningJob(
        id=5,
        gpus=[0],
        pausable=True,
        cost_class="cost_sensitive",
        started_at=NOON - 600 * 1e-3 * H,
        expected_end=NOON + 20 * H,
        deadline=NOON + 60 * H,
    )
    assert place(snap([], running=[r])).pauses == []


def test_cost_threshold_can_name_a_band():
    """'not_peak' runs cost-sensitive work in the shoulder and holds it at peak; 'cheapest'
    (the default) holds it until the valley."""
    job = cs_job()
    assert place(snap([job], cost_threshold="not_peak")).starts
    assert place(snap([job], cost_threshold="cheapest")).holds
    peak = datetime(2026, 12, 2, 18, 0)
    held = place(snap([cs_job(submitted_at=peak)], now=peak, cost_threshold="not_peak"))
    assert held.holds[1].startswith("held for off-peak until 21:00")


@settings(max_examples=60, deadline=None)
@given(
    hour=st.integers(0, 23),
    jobs=st.lists(
        st.tuples(st.floats(0.1, 30), st.floats(0, 40), st.booleans()), min_size=1, max_size=6
    ),
    slack_min=st.sampled_from([0, 60]),
)
def test_holds_and_pauses_never_plan_past_a_deadline(hour, jobs, slack_min):
    """Property: a held job could still start when the next cheap period opens and finish by
    its deadline on its estimate, with the slack; a pause's resume does too."""
    tariff = three_band()
    now = datetime(2026, 12, 2, hour, 0)
    slack = slack_min * 60.0
    pending = [
        cs_job(i, hours=h, deadline=now + d * H if has else None, submitted_at=now)
        for i, (h, d, has) in enumerate(jobs, 1)
    ]
    running = [
        RunningJob(
            id=100 + i,
            gpus=[i],
            pausable=True,
            cost_class="cost_sensitive",
            started_at=now - timedelta(hours=0.5 + i % 3) - 8 * H * (i % 2),
            expected_end=now + h * H,
            deadline=now + d * H if has else None,
        )
        for i, (h, d, has) in enumerate(jobs)
    ]
    dec = place(
        Snapshot(
            now=now,
            pending=pending,
            running=running,
            gpus=gpus(len(jobs) + 2),
            tariff=tariff,
            hold_slack_s=slack,
        )
    )
    nxt = tariff.next_cheap_start(now + timedelta(seconds=1), tariff.cheapest_price())
    assert nxt is not None
    for j in pending:
        if j.deadline is not None and dec.holds.get(j.id, "").startswith("held for off-peak"):
            left = (j.deadline - nxt).total_seconds() - (j.expected_duration_s or 0)
            assert left >= slack - 1e-6
    ends = {r.id: r for r in running}
    for p in dec.pauses:
        r = ends[p.job_id]
        if r.deadline is not None:
            assert p.resume_at is not None and r.expected_end is not None
            rest = (r.expected_end - now).total_seconds()
            assert (r.deadline - p.resume_at).total_seconds() - rest >= slack - 1e-6


# ------------------------------------------------------------------------------ order and fit
def test_sjf_aging_starts_the_shortest_estimate_first_until_aging_catches_up():
    """One GPU, a 16 h job submitted first and a 1 h one just after: sjf_aging starts the short
    one; priority order starts the older. Waiting 4 h (4 doublings) lets the long one first."""
    long = PendingJob(id=1, gpus=1, expected_duration_s=16 * 3600, submitted_at=NOON - 60 * H / 60)
    short = PendingJob(id=2, gpus=1, expected_duration_s=3600, submitted_at=NOON)
    kw = {"tariff": None, "n_gpus": 1}
    assert [s.job_id for s in place(snap([long, short], order="sjf_aging", **kw)).starts] == [2]
    assert [s.job_id for s in place(snap([long, short], order="priority", **kw)).starts] == [1]
    aged = long.model_copy(update={"submitted_at": NOON - 5 * H})
    assert [s.job_id for s in place(snap([aged, short], order="sjf_aging", **kw)).starts] == [1]


def test_las_ranks_least_attained_service_first_and_preempts_at_checkpoints():
    """A resumed job with 20 GPU-h attained waits behind a fresh one; with a margin, a fresh job
    preempts a running pausable one that has run past the thresholds."""
    old = PendingJob(id=1, gpus=1, attained_gpu_s=20 * 3600, submitted_at=NOON - 60 * H / 60)
    fresh = PendingJob(id=2, gpus=1, submitted_at=NOON)
    kw = {"tariff": None, "n_gpus": 1, "order": "las"}
    assert [s.job_id for s in place(snap([old, fresh], **kw)).starts] == [2]
    hog = RunningJob(
        id=9,
        gpus=[0],
        pausable=True,
        started_at=NOON - 2 * H,
        submitted_at=NOON - 2 * H,
        attained_gpu_s=9 * 3600,
    )
    d = place(snap([fresh], running=[hog], preempt_margin=4, **kw))
    assert [(p.victim_job_id, p.for_job_id) for p in d.preemptions] == [(9, 2)]


def test_best_fit_packs_the_fullest_host_and_keeps_whole_hosts_free():
    """Host a has 4 free GPUs, host b 1: a 1-GPU job goes to b with best fit (a to first fit),
    so a 4-GPU job that comes next still finds a whole host."""
    slots = [GpuSlot(index=i, memory_total_mib=80 * 1024, host="a") for i in range(4)] + [
        GpuSlot(index=4 + i, memory_total_mib=80 * 1024, host="b") for i in range(4)
    ]
    busy = RunningJob(id=50, gpus=[4, 5, 6], started_at=NOON)
    small = PendingJob(id=1, gpus=1, submitted_at=NOON - H)
    wide = PendingJob(id=2, gpus=4, submitted_at=NOON)

    def go(fit: str) -> dict[int, list[int]]:
        d = place(
            Snapshot(now=NOON, pending=[small, wide], running=[busy], gpus=slots, host_fit=fit)
        )
        return {s.job_id: s.gpus for s in d.starts}

    assert go("best") == {1: [7], 2: [0, 1, 2, 3]}
    assert go("first") == {1: [0]}


def test_hold_min_gpu_h_lets_small_cost_sensitive_jobs_through():
    """With a 4 GPU-hour floor a 2 GPU-hour job starts at noon and a 12 GPU-hour one waits."""
    d = place(snap([cs_job(1, hours=2), cs_job(2, hours=12)], hold_min_gpu_h=4))
    assert [s.job_id for s in d.starts] == [1] and 2 in d.holds


def test_a_job_a_hold_could_have_delayed_goes_first_once_its_slack_is_gone():
    """One GPU at 23:00: the cost-sensitive job released from its hold with under an hour to
    spare starts before an older, higher-priority urgent job; with slack left it waits its turn."""
    night = datetime(2026, 12, 2, 23, 0)
    urgent = PendingJob(id=1, gpus=1, priority=5, expected_duration_s=3600, submitted_at=NOON)
    tight = cs_job(2, hours=2, deadline=night + 2.5 * H, submitted_at=NOON)
    roomy = cs_job(3, hours=2, deadline=night + 9 * H, submitted_at=NOON)
    first = place(snap([urgent, tight], now=night, n_gpus=1, order="sjf_aging"))
    assert [s.job_id for s in first.starts] == [2]
    later = place(snap([urgent, roomy], now=night, n_gpus=1, order="sjf_aging"))
    assert [s.job_id for s in later.starts] == [1]


# ------------------------------------------------------------------- from the spec, in the daemon
def test_a_specs_deadline_reaches_placement_through_the_store(tmp_path):
    """The daemon's snapshot reads `deadline` from the stored spec ("HH:MM": the next such time
    in the display zone after submission; ISO: as written): of two cost-sensitive 2 h jobs
    submitted at noon, the one due at 13:30 starts now, the one due at 07:00 waits for 23:00."""
    from zoneinfo import ZoneInfo

    from nightshift.runtime.scheduling.snapshot import load_snapshot
    from nightshift.runtime.store.db import Job, Store

    store = Store(f"sqlite:///{tmp_path}/s.db")
    paris = ZoneInfo("Europe/Paris")  # noon UTC is 13:00 in Paris in December
    with store.session() as s:
        for name, deadline in (("soon", "14:30"), ("tomorrow", "2026-12-03T08:00")):
            spec = {
                "name": name,
                "command": ["true"],
                "cost_class": "cost_sensitive",
                "deadline": deadline,
                "resources": {"gpus": 1, "expected_duration_min": 120},
            }
            s.add(Job(name=name, spec=spec, created_at=NOON, updated_at=NOON))
    sn = load_snapshot(store, NOON, tariff=three_band(), tz=paris)
    due = {p.name: p.deadline for p in sn.pending}
    assert due == {"soon": NOON + 1.5 * H, "tomorrow": datetime(2026, 12, 3, 7, 0)}
    decision = place(sn.model_copy(update={"gpus": gpus(2)}))
    assert [s.job_id for s in decision.starts] == [1]
    assert "deadline" in decision.starts[0].note
    assert decision.holds[2].startswith("held for off-peak until 23:00")


def test_a_deadline_that_is_not_a_time_is_refused_naming_the_field():
    import pytest

    from nightshift.runtime.errors import SpecError
    from nightshift.runtime.spec import ExperimentSpec
    from nightshift.runtime.yamlfile import validate

    spec = {"name": "x", "command": ["true"], "deadline": "tomorrow morning"}
    with pytest.raises(SpecError, match="deadline.*HH:MM"):
        validate(ExperimentSpec, spec, path="spec.yaml")
    for ok in ("07:00", "2026-12-05T07:00", "2026-12-05T07:00+01:00"):
        assert validate(ExperimentSpec, {**spec, "deadline": ok}, path="spec.yaml").deadline == ok


def test_a_pause_leaves_room_for_what_such_estimates_came_to():
    """The same 07:30 job, 4 h left by its estimate and due in 30 h, pauses until 23:00; when its
    owner's estimates have run to 15 h left at worst (`upper_end`), 23:00 + 15 h misses the
    deadline (13:30), and it runs through."""
    now = AFTER_VALLEY

    def running(upper_end: datetime | None) -> RunningJob:
        return valley_job(now + 30 * H, upper_end)

    assert [p.job_id for p in place(snap([], now=now, running=[running(None)])).pauses] == [5]
    assert place(snap([], now=now, running=[running(now + 15 * H)])).pauses == []
    assert place(snap([], now=now, running=[running(now + 5 * H)])).pauses


# ------------------------------------------------------------------------------ hold_max_wait_s
def test_a_hold_is_kept_only_while_the_wait_in_all_stays_within_the_limit():
    """At noon the valley opens at 23:00, 11 h away. A job submitted at noon is held under a
    12 h limit, not under a 10 h one; one that has already waited 3 h (submitted at 09:00) is
    not held under 12 h either (3 + 11 > 12) and starts now. With a deadline the same: the
    limit binds where the deadline would allow the hold."""
    roomy = NOON + 40 * H
    for deadline in (None, roomy):
        assert place(snap([cs_job(deadline=deadline)], hold_max_wait_s=12 * 3600)).holds
        cut = place(snap([cs_job(deadline=deadline)], hold_max_wait_s=10 * 3600))
        assert [s.job_id for s in cut.starts] == [1] and not cut.holds
        late = cs_job(deadline=deadline, submitted_at=NOON - 3 * H)
        assert [s.job_id for s in place(snap([late], hold_max_wait_s=12 * 3600)).starts] == [1]
    # time run before counts as not waited: 2 GPU-hours run of 5 h since submission
    ran = cs_job(submitted_at=NOON - 5 * H, attained_gpu_s=2 * 3600)
    assert place(snap([ran], hold_max_wait_s=14 * 3600)).holds  # 3 + 11 <= 14
    assert place(snap([ran], hold_max_wait_s=13.9 * 3600)).starts  # 3 + 11 > 13.9


def test_no_limit_is_the_old_rule():
    """Without hold_max_wait_s a job that has waited two days is still held for 23:00."""
    old = cs_job(submitted_at=NOON - 48 * H)
    assert place(snap([old])).holds and place(snap([old], hold_max_wait_s=None)).holds


def test_a_pause_is_proposed_only_while_the_wait_in_all_stays_within_the_limit():
    """At 07:30 the valley job (started 04:30, submitted then too) would pause until 23:00:
    15.5 h of waiting. Under a 16 h limit it pauses; under 15 h it runs through; had it waited
    1 h before it started (submitted 03:30), 16 h is too little as well."""
    now = AFTER_VALLEY
    job = valley_job(now + 40 * H)
    job.submitted_at = job.started_at
    assert [
        p.job_id for p in place(snap([], now=now, running=[job], hold_max_wait_s=16 * 3600)).pauses
    ] == [5]
    assert place(snap([], now=now, running=[job], hold_max_wait_s=15 * 3600)).pauses == []
    earlier = valley_job(now + 40 * H)
    earlier.submitted_at = earlier.started_at - H
    assert place(snap([], now=now, running=[earlier], hold_max_wait_s=16 * 3600)).pauses == []
    assert place(snap([], now=now, running=[earlier], hold_max_wait_s=17 * 3600)).pauses


def test_the_daemon_setting_reaches_placement_in_seconds():
    from nightshift.runtime.config import SchedulerSettings

    assert SchedulerSettings().snapshot_fields()["hold_max_wait_s"] is None
    assert SchedulerSettings(hold_max_wait_h=8).snapshot_fields()["hold_max_wait_s"] == 8 * 3600


def test_a_job_the_limit_lets_through_says_why_and_is_not_paused_later():
    """Released by the limit at noon, the job starts at the shoulder price and its start says
    why. Four hours into its run (16:00, 4 h waited before it started, 7 h to 23:00: 11 h
    within a 12 h limit) it is not paused: it started off-peak on purpose."""
    job = cs_job(hours=30, submitted_at=NOON - 4 * H)
    d = place(snap([job], hold_max_wait_s=12 * 3600))
    assert [s.job_id for s in d.starts] == [1]
    assert "would take its wait past 12 h" in d.starts[0].note
    # with a deadline that allowed the hold, the note names the limit, not the deadline
    due = cs_job(hours=30, submitted_at=NOON - 4 * H, deadline=NOON + 200 * H)
    (start,) = place(snap([due], hold_max_wait_s=12 * 3600)).starts
    assert "past 12 h" in start.note and "deadline" not in start.note
    running = RunningJob(
        id=1,
        gpus=[0],
        pausable=True,
        cost_class="cost_sensitive",
        submitted_at=NOON - 4 * H,
        started_at=NOON,
        expected_end=NOON + 30 * H,
    )
    later = place(snap([], now=NOON + 4 * H, running=[running], hold_max_wait_s=12 * 3600))
    assert later.pauses == []
    # a job too small for the tariff to gate says nothing of holds
    small = place(snap([cs_job(hours=1)], hold_max_wait_s=3600, hold_min_gpu_h=4))
    assert small.starts and small.starts[0].note == ""
