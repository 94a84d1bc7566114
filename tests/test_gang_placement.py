"""Gang placement (issue 31): a job wider than every host runs across hosts, all of its GPUs at
once or none, on the fewest hosts, with an EASY reservation over the GPUs it will take; a job
that fits one host is placed exactly as before."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlmodel import select

from nightshift.agent.doors.idle_gpu import IdleWatch
from nightshift.runtime.config import Settings
from nightshift.runtime.engine import Engine
from nightshift.runtime.executors.executor import HostGpus, LaunchRequest, gang_host
from nightshift.runtime.executors.ray_executor import RayExecutor
from nightshift.runtime.scheduling.placement import (
    QUARANTINED,
    Decision,
    GpuSlot,
    PendingJob,
    RunningJob,
    Snapshot,
    place,
)
from nightshift.runtime.scheduling.snapshot import load_snapshot
from nightshift.runtime.store.db import Attempt, GpuSample, Job, Store

from conftest import REPO

pytest_plugins = ["ray_service"]

NOW = datetime(2026, 12, 2, 3, 0)
BEFORE_GANGS = "667baa6"  # the last commit whose place() kept every job on one host


def hosts(*sizes: int, bad: tuple[int, ...] = ()) -> list[GpuSlot]:
    """Hosts h0, h1, … of these sizes; GPU ids numbered across them; `bad` ids quarantined."""
    out, gid = [], 0
    for h, n in enumerate(sizes):
        for _ in range(n):
            verdict = "CRITICAL" if gid in bad else "OK"
            out.append(GpuSlot(index=gid, host=f"h{h}", memory_total_mib=81920, verdict=verdict))
            gid += 1
    return out


def job(id: int, gpus: int, hours: float = 1.0, **kw) -> PendingJob:
    return PendingJob(
        id=id, gpus=gpus, submitted_at=NOW, expected_duration_s=hours * 3600, name=f"j{id}", **kw
    )


def busy(id: int, gpus: list[int], hours: float) -> RunningJob:
    return RunningJob(id=id, gpus=gpus, expected_end=NOW + timedelta(hours=hours))


def snap(pending, gpus, running=(), **kw) -> Snapshot:
    return Snapshot(now=NOW, pending=list(pending), gpus=gpus, running=list(running), **kw)


def started(d: Decision) -> dict[int, list[int]]:
    return {s.job_id: sorted(s.gpus) for s in d.starts}


def host_of(gpus: list[GpuSlot]) -> dict[int, str]:
    return {g.index: g.host for g in gpus}


def test_a_job_wider_than_every_host_starts_on_whole_hosts():
    """Tiresias' case: an 8-GPU job on 4-GPU hosts was dropped; it now takes two whole hosts."""
    gpus = hosts(4, 4, 4)
    d = place(snap([job(1, 8)], gpus))
    assert started(d) == {1: [0, 1, 2, 3, 4, 5, 6, 7]}


def test_the_fewest_hosts_then_the_remainder_where_it_strands_fewest():
    """12 GPUs on hosts of 8: one whole free host, and the other 4 on the host with exactly 4
    free (not on the whole free host h1, which stays whole for the next wide job, nor on h2,
    which would strand one)."""
    gpus = hosts(8, 8, 8, 8)
    running = [busy(90, list(range(16, 19)), 5), busy(91, list(range(24, 28)), 5)]
    d = place(snap([job(1, 12)], gpus, running))
    assert started(d) == {1: list(range(0, 8)) + list(range(28, 32))}
    assert {host_of(gpus)[i] for i in started(d)[1]} == {"h0", "h3"}


def test_a_gang_is_all_or_nothing_and_on_healthy_gpus_only():
    """7 healthy free GPUs for an 8-GPU gang: nothing starts, and the reason says why; a
    quarantined GPU is never part of a gang."""
    gpus = hosts(4, 4, bad=(5,))
    d = place(snap([job(1, 8)], gpus))
    assert d.starts == []
    assert d.holds[1] == "needs 8 GPU(s); 7 healthy across 2 hosts (1 quarantined)"
    gpus = hosts(4, 4, 4, bad=(5,))
    d = place(snap([job(1, 8)], gpus))
    assert started(d) == {1: [0, 1, 2, 3, 8, 9, 10, 11]}


def test_a_gang_keeps_a_reservation_through_a_quarantine_expected_to_end():
    """The same 8-GPU gang on 4 + 4 GPUs, GPU 5 quarantined but passing its healthy checks
    (back by 04:00): it reserves all 8 from then; a 10-h job may not take the healthy GPUs
    (it would delay the gang), a half-hour one may; GPU 5 itself is never placed on. A GPU
    not expected back leaves the gang impossible and the 10-h job runs, as before."""
    back = NOW + timedelta(hours=1)
    gpus = [g.model_copy(update={"back_by": back}) if g.index == 5 else g for g in hosts(4, 4)]
    gpus[5] = gpus[5].model_copy(update={"verdict": "UNKNOWN"})
    d = place(snap([job(1, 8), job(2, 1, hours=10), job(3, 1, hours=0.5)], gpus))
    assert d.reservation is not None and d.reservation.job_id == 1
    assert d.reservation.gpus == list(range(8)) and d.reservation.at == back
    assert 2 in d.holds and "reserved for job 1" in d.holds[2]
    assert 5 not in started(d).get(3, [])
    assert len(started(d)[3]) == 1
    failing = [g.model_copy(update={"back_by": None}) for g in gpus]
    d = place(snap([job(1, 8), job(2, 1, hours=10)], failing))
    assert d.holds[1] == "needs 8 GPU(s); 7 healthy across 2 hosts (1 quarantined)"
    assert 2 in started(d)


def test_a_blocked_gang_head_gets_a_reservation_that_backfill_never_delays():
    """The gang head cannot start (7 GPUs free); it reserves the GPUs it will take when enough
    are free (h0 whole and h2, at 04:00). A long job backfills only outside them; a short one
    may use them because it ends before (3 GPUs: only 2 are free outside); a long 4-GPU job finds no host outside them."""
    gpus = hosts(4, 4, 4)
    running = [busy(90, [0, 1, 2, 3], 1), busy(91, [4], 3)]
    pending = [
        job(1, 8),
        job(2, 1, hours=10),
        job(3, 4, hours=10),
        job(4, 3, hours=0.5),
    ]
    d = place(snap(pending, gpus, running))
    assert d.reservation is not None
    assert d.reservation.job_id == 1 and d.reservation.gpus == [0, 1, 2, 3, 8, 9, 10, 11]
    assert d.reservation.at == NOW + timedelta(hours=1)
    assert d.holds[1].startswith("no 8 healthy GPUs free across hosts")
    got = started(d)
    assert got[2] == [5]  # outside the reservation
    assert got[4] == [8, 9, 10]  # only 2 free outside it; inside it, as it ends before 04:00
    assert 3 in d.holds and "reserved for job 1" in d.holds[3]


def test_where_runs_cannot_span_hosts_a_gang_waits_and_says_why():
    """The daemon with an executor that cannot launch across hosts: no partial start, a reason
    naming the GPUs, the hosts and the executor; a job that may span but fits one host runs."""
    gpus = hosts(8, 8, 8)
    why = "executor local cannot span hosts"
    d = place(snap([job(1, 16), job(2, 4, span_hosts=True)], gpus, cannot_span=why))
    assert d.holds == {1: "needs 16 GPUs across 2 hosts; executor local cannot span hosts"}
    assert len(started(d)[2]) == 4


def test_a_job_that_may_span_hosts_spans_only_when_no_host_has_room():
    """span_hosts: 4 GPUs on one host when one has them free; else across hosts at once."""
    gpus = hosts(4, 4)
    d = place(snap([job(1, 4, span_hosts=True)], gpus))
    assert started(d) == {1: [0, 1, 2, 3]}
    running = [busy(90, [0, 1], 5), busy(91, [4, 5], 5)]
    d = place(snap([job(1, 4, span_hosts=True), job(2, 4)], gpus, running))
    assert started(d) == {1: [2, 3, 6, 7]}
    assert d.holds[2].startswith("no 4 healthy GPUs free on one host")


# ------------------------------------------------------------------------------ regression
@functools.cache
def _old_placement() -> ModuleType:
    """place() as it was before gangs, from git history, imported under its own name."""
    try:
        text = subprocess.run(
            ["git", "show", f"{BEFORE_GANGS}:runtime/scheduling/placement.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip(f"commit {BEFORE_GANGS} is not in this clone's history (a shallow clone)")
    spec = importlib.util.spec_from_loader("placement_before_gangs", loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    exec(compile(text, "placement_before_gangs.py", "exec"), mod.__dict__)
    return mod


@st.composite
def clusters(draw, wide: bool) -> Snapshot:
    """Random hosts (1–8 GPUs each), health, running jobs and queued jobs; `wide`: jobs up to
    twice the widest host, some allowed to span; else every job fits the widest healthy host."""
    sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=5))
    n = sum(sizes)
    bad = draw(st.sets(st.integers(0, n - 1), max_size=max(0, n // 3)))
    gpus = hosts(*sizes, bad=tuple(bad))
    healthy = [g.index for g in gpus if g.verdict not in QUARANTINED]
    per_host: dict[str, int] = {}
    for g in gpus:
        if g.verdict not in QUARANTINED:
            per_host[g.host] = per_host.get(g.host, 0) + 1
    widest = max(per_host.values(), default=0)
    assume(wide or widest > 0)  # with no healthy GPU no job fits any host
    taken = draw(st.lists(st.sampled_from(healthy), unique=True) if healthy else st.just([]))
    running, rest = [], list(taken)
    rid = 100
    while rest:
        k = draw(st.integers(1, len(rest)))
        running.append(busy(rid, rest[:k], draw(st.floats(0.1, 10))))
        rest, rid = rest[k:], rid + 1
    top = 2 * max(sizes) if wide else max(1, widest)
    pending = [
        PendingJob(
            id=i,
            gpus=draw(st.integers(1, top)),
            submitted_at=NOW - timedelta(minutes=draw(st.integers(0, 600))),
            expected_duration_s=draw(st.floats(60, 36000)),
            priority=draw(st.integers(0, 3)),
            span_hosts=wide and draw(st.booleans()),
        )
        for i in range(1, draw(st.integers(1, 8)) + 1)
    ]
    return Snapshot(
        now=NOW,
        pending=pending,
        running=running,
        gpus=gpus,
        host_fit=draw(st.sampled_from(["first", "best"])),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(wide=True))
def test_gangs_are_all_or_nothing_on_healthy_free_gpus_and_single_host_jobs_never_split(s):
    """Over random clusters: every start has all its GPUs, healthy, free, none given twice; a
    job that fits one host and may not span is on one host; every job starts or is told why."""
    d = place(s)
    host = host_of(s.gpus)
    healthy = {g.index for g in s.gpus if g.verdict not in QUARANTINED}
    in_use = {i for r in s.running for i in r.gpus}
    per_host: dict[str, int] = {}
    for i in healthy:
        per_host[host[i]] = per_host.get(host[i], 0) + 1
    widest = max(per_host.values(), default=0)
    asked = {j.id: j for j in s.pending}
    given_out: list[int] = []
    for start in d.starts:
        j = asked[start.job_id]
        assert len(start.gpus) == j.gpus  # all or nothing
        assert set(start.gpus) <= healthy
        assert not set(start.gpus) & in_use
        given_out += start.gpus
        if j.gpus <= widest and not j.span_hosts:
            assert len({host[i] for i in start.gpus}) == 1
    assert len(given_out) == len(set(given_out))
    assert set(started(d)) | set(d.holds) == set(asked)
    assert not set(started(d)) & set(d.holds)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(wide=False))
def test_jobs_that_fit_one_host_are_placed_exactly_as_before_gangs(s):
    """Regression: with no job wider than a host and none allowed to span, the decision is the
    one the pre-gang place() (git history) makes, field for field."""
    old = _old_placement()
    data = s.model_dump()
    data.pop("cannot_span")
    for p in data["pending"]:
        p.pop("span_hosts")
    new = place(s).model_dump()
    new.pop("shared_tails")  # named for the store since (stop 57); every reason is as before
    assert new == old.place(old.Snapshot.model_validate(data)).model_dump()


# ------------------------------------------------------------------------------ the daemon
def _two_hosts(tmp_path, hosts: tuple[str, str], gpus: int) -> Store:
    """A store whose latest health samples show two hosts of two GPUs, and a queued job."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    with store.session() as s:
        for host in hosts:
            for i in (0, 1):
                data = {"memory_total_mib": 81559, "memory_used_mib": 0}
                s.add(GpuSample(host=host, gpu_index=i, verdict="OK", data=data, taken_at=NOW))
        spec = {"name": "wide", "command": ["true"], "resources": {"gpus": gpus}}
        s.add(Job(name="wide", spec=spec, state="queued", created_at=NOW))
    return store


class RecordingRay(RayExecutor):
    """The Ray executor with the cluster's Jobs API replaced at its edge (`_request`): what it
    would submit is recorded, and every job is then RUNNING."""

    def __init__(self, runs_dir):
        super().__init__(runs_dir, address="http://127.0.0.1:1")
        self.submitted: list[dict] = []

    def _request(self, what, call):
        class Api:
            def submit_job(api, **kw):
                self.submitted.append(kw)
                return kw["submission_id"]

            def get_job_info(api, sid):
                raise RuntimeError("Request failed with status code 404")

        return call(Api())


def test_the_daemon_launches_a_gang_on_ray_as_one_worker_per_host(tmp_path):
    """On a Ray cluster of two 2-GPU nodes a 4-GPU job starts as a gang: one attempt that keeps
    both hosts (so the next snapshot sees all four GPUs taken), and one Ray job per node, pinned
    to it with its two GPUs and the rendezvous in its environment (rank 0's node as master)."""
    store = _two_hosts(tmp_path, ("ray:10.0.0.5", "ray:10.0.0.6"), 4)
    settings = Settings(home=str(tmp_path), executor={"kind": "ray"})
    ray = RecordingRay(tmp_path / "runs")
    engine = Engine(store, ray, settings, clock=lambda: NOW)
    assert engine.place_queued(NOW) == {}
    with store.session() as s:
        (att,) = s.exec(select(Attempt)).all()
        assert (att.host, att.gpus) == ("ray:10.0.0.5/2+ray:10.0.0.6/2", [0, 1, 0, 1])
        assert len(att.handle["ranks"]) == 1
    assert [kw["entrypoint_resources"] for kw in ray.submitted] == [
        {"node:10.0.0.5": 0.001},
        {"node:10.0.0.6": 0.001},
    ]
    assert [kw["entrypoint_num_gpus"] for kw in ray.submitted] == [2, 2]
    envs = [kw["runtime_env"]["env_vars"] for kw in ray.submitted]
    for rank, env in enumerate(envs):
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "10.0.0.5"
        assert env["MASTER_PORT"] == envs[0]["MASTER_PORT"] == env["PET_MASTER_PORT"]
        assert (env["WORLD_SIZE"], env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("2", "2", "2")
        assert env["NODE_RANK"] == env["PET_NODE_RANK"] == env["RANK"] == str(rank)
    assert ray.submitted[1]["submission_id"] == ray.submitted[0]["submission_id"] + "-rank1"
    snap = load_snapshot(store, NOW, cluster="ray:")
    assert [sorted(r.gpus) for r in snap.running] == [[0, 1, 1000, 1001]]


RENDEZVOUS = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK
x = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(x)
print("rank", dist.get_rank(), "of", dist.get_world_size(), "node rank", os.environ["NODE_RANK"],
      "nproc", os.environ["PET_NPROC_PER_NODE"], "sum", int(x.item()), flush=True)
dist.destroy_process_group()
"""


def _gang_request(tmp_path: Path, key: str, argv: list[str]) -> LaunchRequest:
    """A gang of two ranks with one GPU each on the test head's node (named twice: the test head
    is one node, and Ray joins no second node on loopback, where the tests must stay)."""
    ranks = [HostGpus(host="ray:127.0.0.1", gpus=[0]), HostGpus(host="ray:127.0.0.1", gpus=[1])]
    return LaunchRequest(
        key=key,
        argv=argv,
        cwd=str(tmp_path),
        log_path=str(tmp_path / f"{key}.log"),
        gpus=[0, 1],
        host=gang_host(ranks),
        ranks=ranks,
    )


def _wait(ex: RayExecutor, handle: dict, seconds: float = 200):
    deadline = time.monotonic() + seconds
    while (status := ex.poll(handle)).state == "running" and time.monotonic() < deadline:
        time.sleep(0.5)
    return status


@pytest.mark.service
@pytest.mark.xdist_group("ray")
@pytest.mark.timeout(300)
def test_on_a_real_ray_head_a_gang_meets_at_its_rendezvous_or_fails_whole(tmp_path, ray_head):
    """Two ranks run as two Ray jobs with the rendezvous nightshift set: they meet
    (torch.distributed, gloo) and all-reduce, so neither ran without the other, and the run
    succeeds with each rank's output. Then a gang whose rank 1 exits 3 while rank 0 waits for
    it: the run has failed with rank 1's code, and cleanup stops rank 0 (no rank runs on)."""
    from ray.job_submission import JobSubmissionClient

    script = tmp_path / "rendezvous.py"
    script.write_text(RENDEZVOUS)
    ex = RayExecutor(tmp_path / "runs", address=ray_head.address, num_cpus=0, stop_grace_s=1)
    req = _gang_request(tmp_path, "attempt-gang", [sys.executable, str(script)])
    handle = ex.start(req)
    assert ex.start(req) == handle  # idempotent: the same two Ray jobs
    status = _wait(ex, handle)
    logs = (
        (tmp_path / "attempt-gang.log").read_text(),
        (tmp_path / "attempt-gang.log.rank1").read_text(),
    )
    assert (status.state, status.exit_code) == ("exited", 0), (status, logs)
    assert "rank 0 of 2 node rank 0 nproc 1 sum 3" in logs[0]
    assert "rank 1 of 2 node rank 1 nproc 1 sum 3" in logs[1]

    one_fails = "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(3)\ntime.sleep(120)\n"
    req = _gang_request(tmp_path, "attempt-broken", [sys.executable, "-c", one_fails])
    handle = ex.start(req)
    status = _wait(ex, handle)
    assert (status.state, status.exit_code) == ("exited", 3)
    assert status.detail is not None and status.detail.startswith("rank 1 of 2")
    ex.cleanup(handle)
    client = JobSubmissionClient(ray_head.address)
    assert str(client.get_job_status(handle["submission_id"])) == "STOPPED"


def test_a_gangs_gpus_on_every_host_are_held_for_the_idle_gpu_watch(tmp_path):
    """The idle-GPU watch names the job holding each GPU: a gang's attempt keeps its hosts in one
    text ("ray:A/2+ray:B/2"), and all four GPUs, on both nodes, are seen held by it (not idle
    and unheld while jobs wait)."""
    store = _two_hosts(tmp_path, ("ray:10.0.0.5", "ray:10.0.0.6"), 4)
    with store.session() as s:
        (job,) = s.exec(select(Job)).all()
        s.add(
            Attempt(
                job_id=job.id,
                number=1,
                state="running",
                host="ray:10.0.0.5/2+ray:10.0.0.6/2",
                gpus=[0, 1, 0, 1],
                started_at=NOW,
            )
        )
    settings = Settings(home=str(tmp_path), executor={"kind": "ray"})
    gpus, _ = IdleWatch(store, None, settings).read()  # type: ignore[arg-type]  (no audit: read only)
    assert sorted((g.host, g.index, g.held_by) for g in gpus) == [
        ("ray:10.0.0.5", 0, (job.id,)),
        ("ray:10.0.0.5", 1, (job.id,)),
        ("ray:10.0.0.6", 0, (job.id,)),
        ("ray:10.0.0.6", 1, (job.id,)),
    ]


@pytest.mark.parametrize("span", [True, False])
def test_a_spec_that_may_span_hosts_runs_across_them_when_no_host_has_room(tmp_path, span):
    """resources.span_hosts in a stored spec reaches placement: with one GPU busy on each of two
    2-GPU Ray nodes, a 2-GPU job that may span starts on the free GPU of each; one that may not
    waits for a node with both free."""
    store = _two_hosts(tmp_path, ("ray:10.0.0.5", "ray:10.0.0.6"), 2)
    with store.session() as s:
        (job,) = s.exec(select(Job)).all()
        job.spec = {**job.spec, "resources": {"gpus": 2, "span_hosts": span}}
        s.add(job)
        for n, host in enumerate(("ray:10.0.0.5", "ray:10.0.0.6")):
            busy = Job(name=f"busy{n}", spec={"name": "b", "command": ["true"]}, state="running")
            s.add(busy)
            s.flush()
            s.add(Attempt(job_id=busy.id, number=1, host=host, gpus=[0], started_at=NOW))
    settings = Settings(home=str(tmp_path), executor={"kind": "ray"})
    engine = Engine(store, RecordingRay(tmp_path / "runs"), settings, clock=lambda: NOW)
    holds = engine.place_queued(NOW)
    with store.session() as s:
        atts = s.exec(select(Attempt).where(Attempt.job_id == job.id)).all()
    if span:
        assert holds == {}
        assert [(a.host, a.gpus) for a in atts] == [("ray:10.0.0.5/1+ray:10.0.0.6/1", [1, 1])]
    else:
        assert atts == [] and holds[job.id].startswith("no 2 healthy GPUs free on one host")


def test_a_running_gang_is_not_paused_for_a_shorter_job_but_a_one_host_job_is():
    """A gang across two 8-GPU hosts with 20 hours left is no victim for a 1-hour 8-GPU job
    (every rank would redo its work, and the gang would restart only to be paused again); the
    same job with 20 hours left on one host is."""
    gpus = hosts(8, 8)
    gang = RunningJob(
        id=9,
        gpus=list(range(16)),
        expected_end=NOW + timedelta(hours=20),
        pausable=True,
        submitted_at=NOW - timedelta(hours=1),
        started_at=NOW - timedelta(minutes=30),
    )
    d = place(snap([job(1, 8)], gpus, [gang], order="srpt", preempt_margin=1))
    assert d.preemptions == [] and d.starts == []
    one_host = gang.model_copy(update={"gpus": list(range(8))})
    d = place(snap([job(1, 8)], hosts(8), [one_host], order="srpt", preempt_margin=1))
    assert [p.victim_job_id for p in d.preemptions] == [9]


def test_a_victim_on_a_quarantined_gpu_is_weighed_without_error():
    """A running job whose first GPU has since been quarantined (CRITICAL) is still a victim on
    its host, and pausing it plans no lookup of the GPU placement no longer counts."""
    gpus = hosts(2, bad=(0,))
    r = RunningJob(
        id=9, gpus=[0, 1], expected_end=NOW + timedelta(hours=20), pausable=True, submitted_at=NOW
    )
    d = place(snap([job(1, 1)], gpus, [r], order="srpt", preempt_margin=1))
    assert [p.victim_job_id for p in d.preemptions] in ([9], [])
