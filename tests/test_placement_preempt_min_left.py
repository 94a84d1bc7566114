"""`preempt_min_left_s`: a running job expected to end soon is never paused for another, by
preemption or by migration; its GPUs free up soon anyway, and a pause would make it redo its
work since its checkpoint (on Tiresias' busy window, of sub-hour jobs, leaving such jobs alone
gave back up to 0.075 of useful utilisation on four seeds of five)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sim_setups import hand_setup
from test_gang_placement import RecordingRay, _two_hosts
from test_placement_migration import hosts
from test_placement_srpt import NOW, pending, running, srpt

from nightshift.evals import simulate as S
from nightshift.runtime import engine as engine_module
from nightshift.runtime.config import Settings
from nightshift.runtime.engine import Engine
from nightshift.runtime.scheduling.placement import Snapshot, place


@pytest.mark.parametrize(
    ("left_h", "min_left_s", "paused"),
    [
        (20 / 60, 1800.0, False),  # ends in 20 minutes: left to finish
        (20 / 60, 0.0, True),  # the rule off: paused as before
        (2.0, 1800.0, True),  # two hours left: paused, as before
    ],
)
def test_a_job_ending_soon_is_not_paused_for_a_shorter_one(left_h, min_left_s, paused):
    """One GPU, busy with a pausable job; a 5-minute job waits (its GPU time is far less than
    half the running one's, so srpt would pause it at margin 1)."""
    run = [running(1, [0], left_h)]
    d = place(
        srpt([pending(2, 1, 5 / 60)], 1, run, preempt_margin=1, preempt_min_left_s=min_left_s)
    )
    assert [p.victim_job_id for p in d.preemptions] == ([1] if paused else [])
    if not paused:
        assert d.reservation is not None and d.reservation.job_id == 2
        assert d.reservation.at == NOW + timedelta(hours=left_h)


def test_a_job_ending_soon_is_not_moved_for_a_wider_one():
    """Migration draws on the same jobs: two 4-GPU hosts, a one-GPU job on each, the one on h0
    ending in 20 minutes, the other in 10 hours; a 4-GPU job waits. With the rule (as the
    daemon's defaults: both 30 minutes) it waits 20 minutes for h0; without it, that job is
    paused and moved."""
    run = [running(1, [0], 20 / 60), running(2, [4], 10.0)]
    common = {
        "order": "srpt",
        "aging_per_hour": 0.0,
        "preempt_margin": 1,
        "host_fit": "best",
        "migrate_after_s": 600.0,
        "now": NOW,
        "pending": [pending(10, 4, 8.0)],
        "running": run,
        "gpus": hosts(2, 4),
    }
    moved = place(Snapshot(**common, preempt_min_left_s=0.0))
    assert [p.victim_job_id for p in moved.preemptions] == [1]
    kept = place(Snapshot(**common | {"migrate_after_s": 1800.0}, preempt_min_left_s=1800.0))
    assert kept.preemptions == []
    assert kept.reservation is not None and kept.reservation.at == NOW + timedelta(minutes=20)


def test_in_the_simulator_a_job_ten_minutes_from_its_end_is_left_to_finish():
    """One GPU: a 2-hour job starts at 0; at 1 h 50 min a 1-minute job arrives. The daemon's
    defaults let the first finish (the short one waits 10 minutes); `nightshift-anyleft` pauses
    it, and it redoes its last 300 s."""
    hour = 3600.0
    setup = hand_setup([(0.0, 2 * hour, 1), (110 * 60.0, 60.0, 1)], [1])
    kept = S.simulate(setup, S.NOTARIFF)
    paused = S.simulate(setup, "nightshift-anyleft")
    assert kept.metrics["preemptions"] == 0 and paused.metrics["preemptions"] == 1
    assert kept.first_start[2] == pytest.approx(2 * hour)
    assert paused.first_start[2] == pytest.approx(110 * 60.0)
    # both done at last: the paused one 300 s later than the 2 h 1 min of the other
    done = {r.policy: r.metrics["makespan_h"] * 3600.0 for r in (kept, paused)}
    assert done[S.NOTARIFF] == pytest.approx(2 * hour + 60.0)
    assert done["nightshift-anyleft"] == pytest.approx(2 * hour + 60.0 + 300.0)


@pytest.mark.parametrize("minutes", [30.0, 0.0])
def test_the_daemon_passes_its_setting_in_seconds(tmp_path, monkeypatch, minutes):
    seen: list[Snapshot] = []

    def recording_place(s: Snapshot, **kw):
        seen.append(s)
        return place(s, **kw)

    monkeypatch.setattr(engine_module, "place", recording_place)
    store = _two_hosts(tmp_path, ("ray:10.0.0.5", "ray:10.0.0.6"), 1)
    settings = Settings(
        home=str(tmp_path),
        executor={"kind": "ray"},
        scheduler={"preempt_min_left_min": minutes},
    )
    Engine(store, RecordingRay(tmp_path / "runs"), settings, clock=lambda: NOW).place_queued(NOW)
    assert seen and seen[-1].preempt_min_left_s == minutes * 60


@pytest.mark.parametrize(
    ("ran_h", "upper_left_h", "paused"),
    [
        (6.0, None, True),  # a 1-minute estimate, six hours in: as long again left, paused
        (0.25, None, False),  # 15 minutes in: read as 15 minutes left, left to finish
        (6.0, 0.2, False),  # its worst case by history ends in 12 minutes: left to finish
        (6.0, 3.0, True),  # its worst case is 3 hours off: paused
    ],
)
def test_a_job_that_outran_its_estimate_is_not_read_as_about_to_end(ran_h, upper_left_h, paused):
    """A pausable job whose estimate ran out (a minute asked, hours run: a bad guess, or a lie
    to jump the srpt queue) is taken to have left the rest of its worst case, else as long again
    as it has run, not nothing: read as about to end, `preempt_min_left_s` would never let a
    5-minute job pause it, however long it goes on."""
    started = NOW - timedelta(hours=ran_h)
    upper = NOW + timedelta(hours=upper_left_h) if upper_left_h is not None else None
    # a minute's estimate from its start: its expected end is that far past
    left_h = 1 / 60 - ran_h
    run = [running(1, [0], left_h, started_at=started, submitted_at=started, upper_end=upper)]
    d = place(srpt([pending(2, 1, 5 / 60)], 1, run, preempt_margin=1, preempt_min_left_s=1800.0))
    assert [p.victim_job_id for p in d.preemptions] == ([1] if paused else [])
