"""The starvation guard through a quarantine (`quarantine_back_s`): a job promoted after waiting
`promote_after_h` that needs a GPU now quarantined (not known to be coming back) keeps the GPUs
it needs, as if that GPU were back at the soonest its healthy checks allow; before, it waited as
impossible and longer jobs took every GPU (Philly seed 1: a 128-GPU job on 128 GPUs waited
208 hours while quarantines came and went)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from test_gang_placement import RecordingRay, _two_hosts
from test_placement_srpt import NOW, pending

from nightshift.runtime import engine as engine_module
from nightshift.runtime.config import Settings
from nightshift.runtime.engine import Engine
from nightshift.runtime.scheduling.placement import GpuSlot, Snapshot, place

HOUR = 3600.0


def two_hosts(quarantined: tuple[int, ...] = (7,)) -> list[GpuSlot]:
    """Two 4-GPU hosts; the GPUs in `quarantined` failed their checks (not expected back)."""
    return [
        GpuSlot(
            index=i,
            host=f"h{i // 4}",
            memory_total_mib=81920,
            memory_used_mib=0,
            verdict="CRITICAL" if i in quarantined else "OK",
        )
        for i in range(8)
    ]


def snap(pend, gpus, back_s: float | None = 1800.0) -> Snapshot:
    return Snapshot(
        now=NOW,
        order="srpt",
        aging_per_hour=0.0,
        promote_after_h=24.0,
        host_fit="best",
        pending=list(pend),
        gpus=gpus,
        quarantine_back_s=back_s,
    )


def queue(waited_h: float, width: int = 8) -> list:
    """A wide job that has waited `waited_h` hours, a 10-hour and a 10-minute one-GPU job."""
    return [pending(1, width, 2.0, waited_h), pending(2, 1, 10.0), pending(3, 1, 10 / 60)]


def test_a_promoted_job_keeps_the_gpus_it_needs_while_one_is_quarantined():
    """The 8-GPU job has waited 30 hours (promoted); GPU 7 is quarantined. It takes the
    reservation on all eight GPUs from 30 minutes on: the 10-minute job backfills, the 10-hour
    job would run past it and waits."""
    d = place(snap(queue(30.0), two_hosts()))
    assert d.reservation is not None
    assert d.reservation.job_id == 1 and d.reservation.gpus == list(range(8))
    assert d.reservation.at == NOW + timedelta(seconds=1800)
    assert [s.job_id for s in d.starts] == [3]
    assert "needs 8 GPU(s); 7 healthy" in d.holds[1]
    assert "if the quarantined GPUs are back by then" in d.holds[1]
    assert "would run past that" in d.holds[2]


def test_without_the_setting_the_promoted_job_waits_as_impossible_and_others_run():
    """As before (and as every baseline in the simulator): nothing is reserved and the long job
    takes a GPU the wide one will need."""
    d = place(snap(queue(30.0), two_hosts(), back_s=None))
    assert d.reservation is None
    assert sorted(s.job_id for s in d.starts) == [2, 3]
    assert d.holds[1].startswith("needs 8 GPU(s); 7 healthy across 2 hosts (1 quarantined)")


@pytest.mark.parametrize(
    ("waited_h", "width", "why"),
    [
        (1.0, 8, "not promoted: the guard has made it no promise yet"),
        (30.0, 9, "wider than every GPU, quarantined ones included: no return helps"),
    ],
)
def test_no_reservation_for_a_job_the_guard_has_not_promoted_or_no_return_would_help(
    waited_h, width, why
):
    d = place(snap(queue(waited_h, width), two_hosts()))
    assert d.reservation is None, why
    assert sorted(s.job_id for s in d.starts) == [2, 3], why


def test_a_gpu_passing_its_checks_is_reckoned_by_its_own_return():
    """A quarantined GPU known to be coming back (`back_by`, its remaining healthy checks) is
    busy until then, as before: the setting is only for GPUs nobody knows the return of."""
    gpus = two_hosts()
    gpus[7] = gpus[7].model_copy(update={"back_by": NOW + timedelta(minutes=10)})
    for back_s in (1800.0, None):
        d = place(snap(queue(30.0), gpus, back_s=back_s))
        assert d.reservation is not None
        assert d.reservation.at == NOW + timedelta(minutes=10)


def test_the_daemon_reckons_a_failing_gpu_back_after_its_healthy_checks(tmp_path, monkeypatch):
    """The engine passes the soonest a quarantined GPU can be back: `health.recover_after_checks`
    checks at the health check's interval (3 at 10 minutes by default; here 4 at 15)."""
    seen: list[Snapshot] = []

    def recording_place(s: Snapshot, **kw):
        seen.append(s)
        return place(s, **kw)

    monkeypatch.setattr(engine_module, "place", recording_place)
    store = _two_hosts(tmp_path, ("ray:10.0.0.5", "ray:10.0.0.6"), 1)
    settings = Settings(
        home=str(tmp_path),
        executor={"kind": "ray"},
        health={"recover_after_checks": 4},
        loop={"health_interval_min": 15},
    )
    Engine(store, RecordingRay(tmp_path / "runs"), settings, clock=lambda: NOW).place_queued(NOW)
    assert seen and seen[-1].quarantine_back_s == 4 * 15 * 60
