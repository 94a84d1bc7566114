"""The cluster `place()` keeps between calls (`placement._KeptCluster`) is the cluster a fresh
build gives, field for field, after any change a daemon's ticks bring: running jobs ending,
starting (alone, sharing, across hosts), moving their expected end, changed in place, the
running list reordered; GPUs' free memory moving, a GPU quarantined, expected back, released;
the clock moving past expected ends; and whatever the last call took or claimed put back.
Its decisions are the plain path's, call after call."""

from __future__ import annotations

import random
import sys
from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_placement_fast_path import _world

from nightshift.runtime.scheduling import placement
from nightshift.runtime.scheduling.placement import RunningJob, Snapshot, place

_GPU_FIELDS = ("idx", "host", "total", "free", "excl", "caps", "jobs", "last", "holders")


def _ends(s: Snapshot) -> dict:
    """`_Placer._setup`'s expected ends, overdue or not, as the cluster takes them."""
    default = timedelta(seconds=s.default_duration_s)
    return {r.id: r.expected_end or ((r.started_at or s.now) + default) for r in s.running}


def _state(c: placement._Cluster) -> dict:
    """Everything a call reads of a cluster, dict orders included."""
    return {
        "gpus": [(i, [getattr(g, f) for f in _GPU_FIELDS]) for i, g in c.gpus.items()],
        "free_excl": list(c.free_excl.items()),
        "sharing": list(c.sharing.items()),
        "open_hosts": c.open_hosts,
        "in_order": [g.idx for g in c.in_order],
        "same_objects": all(c.gpus[g.idx] is g for g in c.in_order),
        "pos": list(c.pos.items()),
        "rest": (c.hosts, c.rank, c.per_host, c.most_per_host, c.largest_mib, c.sizes),
        "call": (c.now, c.fast, c.best_fit, c.quarantined, c.version, c.log),
    }


def _change(rnd: random.Random, s: Snapshot) -> Snapshot:
    """The next tick's world: jobs end and start, ends move, GPUs change, time passes."""
    now = s.now + timedelta(minutes=rnd.choice([0, 1, 30, 600]))
    running = [r for r in s.running if rnd.random() > 0.15]  # some ended
    for r in running:
        roll = rnd.random()
        if roll < 0.1:
            r.expected_end = now + timedelta(minutes=rnd.randint(-60, 600))  # in place
        elif roll < 0.13:
            r.name = f"renamed{r.id}"
        elif roll < 0.16 and len(r.gpus) == 1:  # (a daemon's load would make a new object)
            r.share_gpu = not r.share_gpu
            r.gpu_memory_cap_gb = 8 if r.share_gpu else None
    busy = {i for r in running for i in r.gpus}
    free = [g.index for g in s.gpus if g.index not in busy]
    top = max((r.id for r in s.running), default=20_000) + 1
    for n in range(rnd.randint(0, 4)):
        if not free:
            break
        k = min(len(free), rnd.choice([1, 1, 2, 5]))
        ids = rnd.sample(free, k)
        share = k == 1 and rnd.random() < 0.3
        running.append(
            RunningJob(
                id=top + n,
                name=f"new{top + n}",
                gpus=ids,
                share_gpu=share,
                gpu_memory_cap_gb=rnd.choice([8, 16]) if share else None,
                started_at=now,
                expected_end=rnd.choice([None, now + timedelta(minutes=rnd.randint(1, 900))]),
            )
        )
        if not share:
            free = [i for i in free if i not in ids]
    if rnd.random() < 0.1:
        rnd.shuffle(running)  # another order: each GPU's jobs would come in another order
    gpus = [g.model_copy() for g in s.gpus]  # the daemon loads new objects every tick
    for g in gpus:
        roll = rnd.random()
        if roll < 0.1:
            g.memory_used_mib = rnd.choice([0.0, 2048.0, None])
        elif roll < 0.15 and g.back_by is not None:
            g.back_by = now + timedelta(minutes=rnd.randint(-30, 120))
    if rnd.random() < 0.15:  # a health check's new verdict: the cluster's shape changes
        rnd.choice(gpus).verdict = rnd.choice(["OK", "CRITICAL", "WARN"])
    return s.model_copy(update={"now": now, "running": running, "gpus": gpus})


def _use(rnd: random.Random, clusters: list[placement._Cluster]) -> None:
    """What a call does to a cluster: takes free or shared GPUs and claims some, alike on each
    (the kept one must put all of it back before the next call)."""
    c0 = clusters[0]
    for n in range(rnd.randint(0, 3)):
        pool = rnd.choice([c0.free_excl, c0.sharing])
        hosts = [h for h, ids in pool.items() if ids]
        if not hosts:
            continue
        ids = list(pool[rnd.choice(hosts)][:2])
        share = pool is c0.sharing
        req = placement._Request(len(ids), 1.0, share, 4.0 if share else None, False)
        end = c0.now + timedelta(hours=rnd.randint(1, 9))
        if rnd.random() < 0.7:
            for c in clusters:
                c.take(req, ids, end, (90_000 + n, "taken"))
        else:
            for c in clusters:
                c.claim(ids, (91_000 + n, "kept"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1), ticks=st.integers(1, 8))
def test_the_kept_cluster_is_a_fresh_build_after_every_change(seed: int, ticks: int) -> None:
    """Why: the kept cluster skips rebuilding what did not change; a GPU left stale would place
    a job on a busy GPU or hold one for a job that ended."""
    rnd = random.Random(seed)
    # most=1: never afresh for its size; busy=1: never resting
    kept = placement._KeptCluster(most=rnd.choice([0.25, 1.0]), busy=rnd.choice([0.05, 1.0]))
    s = _world(rnd)
    for _ in range(ticks):
        ends = _ends(s)
        got, want = kept.get(s, ends), placement._Cluster(s, ends)
        assert _state(got) == _state(want)
        _use(rnd, [got, want])
        assert _state(got) == _state(want)
        s = _change(rnd, s)
    ends = _ends(s)
    assert _state(kept.get(s, ends)) == _state(placement._Cluster(s, ends))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1), ticks=st.integers(1, 5))
def test_place_with_the_kept_cluster_decides_as_the_plain_path(seed: int, ticks: int) -> None:
    """Why: the decisions are what a user sees; each call also changes the kept cluster."""
    rnd = random.Random(seed)
    s = _world(rnd)
    was = placement._KEPT
    placement._KEPT = placement._KeptCluster(most=1.0, busy=1.0)  # small worlds: kept
    try:
        for _ in range(ticks):
            want = place(s, _fast=False).model_dump()
            assert place(s).model_dump() == want
            assert place(s).model_dump() == want  # the same world again: the last call undone
            s = _change(rnd, s)
        assert place(s).model_dump() == place(s, _fast=False).model_dump()
    finally:
        placement._KEPT = was


def test_a_tick_rebuilds_only_the_gpus_that_changed(monkeypatch) -> None:
    """Why: the point of keeping it; one job ending rebuilds its GPUs alone, however far the
    clock moved past other jobs' expected ends, and a GPU moved to another host builds the
    whole cluster afresh."""
    rnd = random.Random(3)
    while True:
        s = _world(rnd)
        gone = next((r for r in s.running if r.gpus), None)
        if gone and len(s.gpus) >= 16 and 4 * len(gone.gpus) <= len(s.gpus):
            break
    kept = placement._KeptCluster(busy=1.0)
    kept.get(s, _ends(s))
    built: list[int] = []
    real = placement._Gpu.__init__

    def counting(self, slot):  # type: ignore[no-untyped-def]
        built.append(slot.index)
        real(self, slot)

    later = s.model_copy(
        update={
            "running": [r for r in s.running if r is not gone],
            "now": s.now + timedelta(hours=20),  # every job overdue now
        }
    )
    monkeypatch.setattr(placement._Gpu, "__init__", counting)
    got = kept.get(later, _ends(later))
    monkeypatch.setattr(placement._Gpu, "__init__", real)
    assert _state(got) == _state(placement._Cluster(later, _ends(later)))
    assert set(built) == set(gone.gpus) & got.gpus.keys()
    assert len(built) < len(got.gpus)

    moved = [g.model_copy() for g in later.gpus]
    moved[0].host = "elsewhere"
    moved_world = later.model_copy(update={"gpus": moved})
    built.clear()
    monkeypatch.setattr(placement._Gpu, "__init__", counting)
    got = kept.get(moved_world, _ends(moved_world))
    monkeypatch.setattr(placement._Gpu, "__init__", real)
    assert _state(got) == _state(placement._Cluster(moved_world, _ends(moved_world)))
    assert len(built) == len(got.gpus)


def test_an_overdue_job_is_expected_to_run_on_not_to_end_now() -> None:
    """Why: a job that outran its estimate is not about to end (`outrun_end`): with no worst
    case known, its estimate grows until its end lies at least as far ahead as it has run.
    Read as free from now, the GPUs of a job overdue by minutes and of one overdue by a day
    would be alike, and a wide job's reservation would keep free GPUs idle beside either for as
    long as it overran. Every overdue job, alone or sharing, is read so: of two due an hour
    ago, the one that has run 2 h (estimate 1 h, grown by a quarter at a time to 4.77 h) is
    expected to end first, in 2.77 h, not the first host's, that has run 9 h (8 h grown to
    19.5 h: in 10.5 h). A GPU whose return from quarantine is overdue still reads as free from
    now."""
    from nightshift.runtime.scheduling.placement import GpuSlot, PendingJob

    now = datetime(2026, 12, 7, 12, 0)

    def slot(i: int, **kw: object) -> GpuSlot:
        return GpuSlot(index=i, host=f"h{i}", memory_total_mib=81920.0, memory_used_mib=0.0, **kw)

    def job(i: int, ran_h: float, share: bool) -> RunningJob:
        return RunningJob(
            id=10 + i,
            gpus=[i],
            share_gpu=share,
            gpu_memory_cap_gb=60 if share else None,
            started_at=now - timedelta(hours=ran_h),
            expected_end=now - timedelta(hours=1),
        )

    wants = PendingJob(id=2, gpus=1, gpu_memory_gb=40, share_gpu=True, submitted_at=now)
    first_end = now - timedelta(hours=2) + timedelta(hours=placement.OUTRUN_STEP**7)  # 4.77 h
    worlds = [
        ([slot(0), slot(1)], [job(0, 9, share), job(1, 2, share)], (first_end, [1]))
        for share in (False, True)
    ]
    worlds.append(
        (
            [slot(0), slot(1, verdict="CRITICAL", back_by=now - timedelta(hours=3))],
            [job(0, 9, False)],
            (now, [1]),
        )
    )
    for gpus, running, reserved in worlds:
        s = Snapshot(now=now, gpus=gpus, running=running, pending=[wants])
        for fast in (True, False):
            got = place(s, _fast=fast).reservation
            assert got is not None and (got.at, got.gpus) == reserved, (running, gpus)


@given(
    estimate_s=st.floats(0, 86_400.0),
    ran_s=st.floats(1.0, 30 * 86_400.0),
    before_s=st.floats(0, 86_400.0),
    later_s=st.floats(0, 30 * 86_400.0),
)
def test_an_overdue_jobs_end_is_as_far_ahead_as_it_ran_and_stays_put(
    estimate_s: float, ran_s: float, before_s: float, later_s: float
) -> None:
    """Why: an overdue job's end (`outrun_end`, no worst case known) lies at least as far ahead
    as the job has run in all (this attempt and `before_s` of earlier ones), and at most 1.5
    times that (a step of `OUTRUN_STEP`); and it does not move at the next call while the job has not outrun it again, so
    the cluster kept between calls keeps it (half of the jobs outrun a median estimate)."""
    now = datetime(2026, 12, 8, 12, 0)
    ran = ran_s + before_s
    started = now - timedelta(seconds=ran_s)
    estimate = min(estimate_s, ran - 1.0)
    expected = started - timedelta(seconds=before_s) + timedelta(seconds=estimate)
    end = placement.outrun_end(expected, None, now, started, before_s * 2, 2)
    ahead = (end - now).total_seconds()
    assert ran - 1e-3 <= ahead <= 1.5 * ran + 60.0 + 1e-3
    later = now + timedelta(seconds=later_s)
    if (end - later).total_seconds() >= ran + later_s + 1.0:  # not outrun yet, as read then
        assert placement.outrun_end(expected, None, later, started, before_s * 2, 2) == end


def test_after_a_busy_tick_it_builds_afresh_for_a_while_then_keeps_again() -> None:
    """Why: past a share of GPUs changed, a diff costs what it saves; the rest of a busy stretch
    is built afresh without keeping anything (each cluster the call's alone), and the diff is
    tried again after `rest` calls. Every cluster it hands out is still a fresh build's."""
    rnd = random.Random(5)
    s = _world(rnd)
    while sum(1 for r in s.running if r.gpus) < 7:
        s = _world(rnd)
    kept = placement._KeptCluster(most=1.0, busy=0.0, rest=2)  # any change is busy
    kinds = []
    for _ in range(7):
        got = kept.get(s, _ends(s))
        assert _state(got) == _state(placement._Cluster(s, _ends(s)))
        kinds.append("kept" if got.undo is not None else "alone")
        gone = next(r for r in s.running if r.gpus)
        s = s.model_copy(update={"running": [r for r in s.running if r is not gone]})
    assert kinds == ["kept", "kept", "alone", "alone", "kept", "kept", "alone"]


def test_calls_from_several_threads_decide_as_the_plain_path() -> None:
    """Why: the kept cluster is one per process; a call made while another thread's call holds
    it must build its own, and neither may see the other's takes."""
    from concurrent.futures import ThreadPoolExecutor

    rnd = random.Random(11)
    worlds = [_world(rnd) for _ in range(8)]
    want = [place(w, _fast=False).model_dump() for w in worlds]

    def run(k: int) -> bool:
        return all(place(worlds[(k + n) % 8]).model_dump() == want[(k + n) % 8] for n in range(40))

    was = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads switch often: calls overlap
    try:
        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(run, range(8)))
    finally:
        sys.setswitchinterval(was)
