"""GPU health and placement on a Ray cluster: the census reads each GPU node's nvidia-smi through a
Ray job, the verdicts are recorded per node (`ray:<IP>`), placement numbers the GPUs across nodes
and quarantines a node with a bad GPU whole, and a run is pinned to the node placement chose.

The unit tests drive the census with a stand-in for the Ray job (the driver's per-node output);
the last test runs it on the real Ray head of tests/ray_service.py, whose two logical GPUs are
read through a stand-in nvidia-smi answering from a real H100 capture."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from sqlmodel import select

from nightshift.runtime.config import Settings
from nightshift.runtime.errors import OperatorError
from nightshift.runtime.executors.executor import LaunchRequest
from nightshift.runtime.executors.ray_executor import RayExecutor
from nightshift.runtime.gpu.ray_census import DRIVER, MARK, RayGpuCensus, parse_output
from nightshift.runtime.scheduling.placement import place
from nightshift.runtime.scheduling.snapshot import load_snapshot, on_host
from nightshift.runtime.store.db import Attempt, GpuSample, Job, Store
from nightshift.skills.base import SkillContext
from nightshift.skills.gpu_health import gpu_health_check

from conftest import REPO, run_skill, write_spec

sys.path.insert(0, str(Path(__file__).parent))
from fake_nvidia_smi import main as fake_smi  # noqa: E402

pytest_plugins = ["ray_service"]
pytestmark = pytest.mark.xdist_group("ray")  # the Ray head starts once (pytest-xdist, loadgroup)
NOW = datetime(2026, 12, 4, 2, 0)


class FakeCluster:
    """Stands in for the census job: runs each node's commands through the fake nvidia-smi with
    that node's state, and prints the driver's marked lines (plus some of Ray's own)."""

    def __init__(self, tmp_path: Path, nodes: dict[str, str]):
        self.tmp_path, self.nodes = tmp_path, nodes
        self.jobs: list[list[list[str]]] = []
        self.refuse: set[str] = set()  # fields an older driver does not know

    def __call__(self, argv: list[str], wait_s: float) -> str:
        assert argv[1:3] == ["-c", DRIVER] and wait_s > 0
        args = json.loads(argv[3])
        self.jobs.append(args["argvs"])
        lines = ["2026-12-04 02:00:00,000 INFO worker.py -- Connecting to existing Ray cluster"]
        for ip, state in self.nodes.items():
            results = [self._run(a, state) for a in args["argvs"]]
            lines.append(MARK + json.dumps({"ip": ip, "results": results}))
        return "\n".join(lines) + "\n"

    def _run(self, argv: list[str], state: str) -> list:
        query = argv[1] if len(argv) > 1 else ""  # none: the default table
        for f in self.refuse:
            if query.startswith("--query-gpu=") and f in query.split("=", 1)[1].split(","):
                return [2, f'Field "{f}" is not a valid field to query.\n', ""]
        path = self.tmp_path / f"state-{state}"
        path.write_text(state)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = fake_smi([str(path), *argv[1:]])
        return [code, out.getvalue(), ""]


def ctx_for(tmp_path: Path, census: RayGpuCensus, now: datetime = NOW) -> SkillContext:
    return SkillContext(
        store=Store(f"sqlite:///{tmp_path}/s.db"),
        settings=Settings(home=str(tmp_path), executor={"kind": "ray"}),
        now=now,
        probe=census,
    )


def test_driver_lines_are_read_and_others_ignored():
    log = (
        "Ray says hello\n"
        f"{MARK}{json.dumps({'ip': '10.0.0.5', 'results': [[0, 'x', '']]})}\n"
        f"{MARK}not json\n"
        f"{MARK}{json.dumps({'ip': '10.0.0.6', 'error': 'GetTimeoutError: node died'})}\n"
    )
    a, b = parse_output(log)
    assert (a.ip, a.results, b.ip, b.results, b.error) == (
        "10.0.0.5",
        [(0, "x", "")],
        "10.0.0.6",
        None,
        "GetTimeoutError: node died",
    )


def test_census_records_each_node_and_quarantines_the_lost_one(tmp_path):
    """Two nodes read in one job; later one GPU falls off the bus: its node's GPU is CRITICAL,
    recorded under that node, the other node's stays OK."""
    cluster = FakeCluster(tmp_path, {"10.0.0.5": "ok", "10.0.0.6": "ok"})
    first = run_skill(gpu_health_check, ctx_for(tmp_path, RayGpuCensus(cluster)), {})
    assert first.overall == "OK" and first.backend == "ray-census"
    assert sorted((v.host, v.index, v.verdict) for v in first.gpus) == [
        ("ray:10.0.0.5", 0, "OK"),
        ("ray:10.0.0.6", 0, "OK"),
    ]
    assert len(cluster.jobs) == 1  # the GPU query, the processes and the table, in one job
    assert [(a[1:] or [""])[0].split("=")[0] for a in cluster.jobs[0]] == [
        "--query-gpu",
        "--query-compute-apps",
        "",
    ]
    assert {v.reading.cuda_version for v in first.gpus if v.reading} == {"13.1"}

    cluster.nodes["10.0.0.6"] = "lost"
    ctx = ctx_for(tmp_path, RayGpuCensus(cluster))
    second = run_skill(gpu_health_check, ctx, {})
    assert second.overall == "CRITICAL"
    got = {(v.host, v.index): v for v in second.gpus}
    assert got[("ray:10.0.0.5", 0)].verdict == "OK"
    bad = got[("ray:10.0.0.6", 0)]
    assert bad.verdict == "CRITICAL" and "lost" in bad.summary
    assert bad.summary.startswith("ray:10.0.0.6 GPU 0")
    with ctx.store.session() as s:
        latest = {
            (g.host, g.gpu_index): g.verdict
            for g in s.exec(select(GpuSample).order_by(GpuSample.id))
        }
    assert latest == {("ray:10.0.0.5", 0): "OK", ("ray:10.0.0.6", 0): "CRITICAL"}


def test_an_older_driver_is_asked_again_in_a_second_round(tmp_path):
    """A field the node's driver refuses: the probe's fallback command runs in a second job."""
    cluster = FakeCluster(tmp_path, {"10.0.0.5": "ok"})
    cluster.refuse = {"clocks_event_reasons.active"}
    result = RayGpuCensus(cluster).read_hosts()["ray:10.0.0.5"]
    assert result.error is None and len(result.gpus) == 1
    assert len(cluster.jobs) == 2 and len(cluster.jobs[1]) == 1
    assert "clocks_throttle_reasons.active" in cluster.jobs[1][0][1]


def test_a_node_that_left_the_cluster_is_critical_once(tmp_path):
    cluster = FakeCluster(tmp_path, {"10.0.0.5": "ok", "10.0.0.6": "ok"})
    run_skill(gpu_health_check, ctx_for(tmp_path, RayGpuCensus(cluster)), {})
    del cluster.nodes["10.0.0.6"]
    out = run_skill(gpu_health_check, ctx_for(tmp_path, RayGpuCensus(cluster)), {})
    (gone,) = [v for v in out.gpus if v.host == "ray:10.0.0.6"]
    assert gone.verdict == "CRITICAL" and "not in the Ray cluster" in gone.summary
    again = run_skill(gpu_health_check, ctx_for(tmp_path, RayGpuCensus(cluster)), {})
    assert [v.host for v in again.gpus] == ["ray:10.0.0.5"]  # recorded once, not every check


def _sample(s, host: str, index: int, verdict: str = "OK") -> None:
    data = {"memory_total_mib": 81559, "memory_used_mib": 0}
    s.add(GpuSample(host=host, gpu_index=index, verdict=verdict, data=data, taken_at=NOW))


def _job(s, name: str, gpus: int, state: str = "queued") -> Job:
    spec = {"resources": {"gpus": gpus}, "command": ["true"], "name": name}
    job = Job(name=name, spec=spec, state=state, created_at=NOW)
    s.add(job)
    s.flush()
    return job


def test_placement_numbers_gpus_across_nodes_and_quarantines_a_bad_node_whole(tmp_path):
    """Both nodes have GPUs 0 and 1. A's GPU 1 is CRITICAL, so all of A is out (Ray, not
    nightshift, picks the GPU on a node); B's GPU 0 is taken by a running attempt: a 2-GPU job
    waits for B (reserved), a 1-GPU job starts on B's GPU 1, mapped back to B's own index."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    with store.session() as s:
        for host in ("ray:10.0.0.5", "ray:10.0.0.6"):
            _sample(s, host, 0)
            _sample(s, host, 1, "CRITICAL" if host == "ray:10.0.0.5" else "OK")
        _sample(s, "daemon-node", 0)  # the daemon's own GPU: not the cluster's
        running = _job(s, "running", 1, state="running")
        s.add(Attempt(job_id=running.id, number=1, host="ray:10.0.0.6", gpus=[0], started_at=NOW))
        _job(s, "two", 2)
        _job(s, "one", 1)
    snap = load_snapshot(store, NOW, cluster="ray:", node="daemon-node")
    assert sorted((g.host, g.index, g.verdict) for g in snap.gpus) == [
        ("ray:10.0.0.5", 0, "CRITICAL"),
        ("ray:10.0.0.5", 1, "CRITICAL"),
        ("ray:10.0.0.6", 1000, "OK"),
        ("ray:10.0.0.6", 1001, "OK"),
    ]
    assert [r.gpus for r in snap.running] == [[1000]]
    decision = place(snap)
    (start,) = decision.starts
    assert on_host(snap, start.gpus) == ("ray:10.0.0.6", [1])
    assert decision.reservation is not None and decision.reservation.gpus == [1000, 1001]
    assert "no 2 healthy GPUs free on one host" in next(iter(decision.holds.values()))


def test_a_run_is_pinned_to_the_node_placement_chose(tmp_path):
    ex = RayExecutor(tmp_path / "runs", address="http://127.0.0.1:1")
    req = LaunchRequest(
        key="attempt-3", argv=["python3", "t.py"], cwd=str(tmp_path), log_path=str(tmp_path / "l")
    )
    pinned = req.model_copy(update={"host": "ray:10.0.0.6", "gpus": [1]})
    assert "entrypoint_resources" not in ex._submit_kwargs(req)
    kw = ex._submit_kwargs(pinned)
    assert kw["entrypoint_resources"] == {"node:10.0.0.6": 0.001} and kw["entrypoint_num_gpus"] == 1
    assert "on node 10.0.0.6" in ex.render(pinned)
    with pytest.raises(OperatorError, match="is not a Ray node"):
        ex._submit_kwargs(req.model_copy(update={"host": "ray:10.0.0.6; rm -rf /"}))


@pytest.mark.service
@pytest.mark.timeout(240)
def test_on_a_real_ray_head_the_census_places_pins_and_quarantines(home, tmp_path, ray_head):
    """`nightshift run` with executor.kind ray: the goal's health check is the census of the
    head's GPUs, the 1-GPU training job is pinned to the head's node and succeeds; then the GPU
    falls off the bus, `nightshift health` says CRITICAL for that node, and a GPU job waits."""
    from ray.job_submission import JobSubmissionClient

    write_spec(tmp_path, steps=40, env={}, resources={"gpus": 1, "expected_duration_min": 1})
    goal = tmp_path / "goal.yaml"
    goal.write_text("name: ray-gpu\ngoal: train\nspec: spec.yaml\n")
    env = {
        **os.environ,
        "COLUMNS": "200",
        "NIGHTSHIFT_EXECUTOR__KIND": "ray",
        "NIGHTSHIFT_EXECUTOR__RAY_ADDRESS": ray_head.address,
    }
    cli = [sys.executable, "-m", "nightshift.agent.doors.cli"]
    ray_head.smi_state.write_text("ok\n")
    done = subprocess.run(
        [*cli, "run", str(goal)], cwd=REPO, env=env, capture_output=True, text=True, timeout=200
    )
    assert done.returncode == 0, done.stdout + done.stderr
    db = sqlite3.connect(home / "nightshift.db")
    assert db.execute("select distinct host, gpu_index, verdict from gpusample").fetchall() == [
        ("ray:127.0.0.1", 0, "OK")
    ]
    host, gpus, outcome, handle = db.execute(
        "select host, gpus, outcome, handle from attempt"
    ).fetchone()
    assert (host, json.loads(gpus), outcome) == ("ray:127.0.0.1", [0], "succeeded")
    client = JobSubmissionClient(ray_head.address)
    ids = [j.submission_id or "" for j in client.list_jobs()]
    assert json.loads(handle)["submission_id"] in ids
    censuses = [i for i in ids if i.startswith("nightshift-census-")]
    assert 1 <= len(censuses) <= 2  # the goal's check and the loop's, at most

    # Ray honours the pin: a run pinned to a node the cluster does not have never starts.
    ex = RayExecutor(tmp_path / "runs", address=ray_head.address, stop_grace_s=1)
    req = LaunchRequest(
        key="pinned-elsewhere",
        argv=["true"],
        cwd=str(tmp_path),
        log_path=str(tmp_path / "pinned.log"),
        host="ray:10.255.255.1",
    )
    pinned = ex.start(req)
    time.sleep(3)
    assert str(client.get_job_status(pinned["submission_id"])) == "PENDING"
    ex.stop(pinned)

    ray_head.smi_state.write_text("lost\n")
    health = subprocess.run(
        [*cli, "health", "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    verdicts = json.loads(health.stdout)
    assert health.returncode != 0 and verdicts["overall"] == "CRITICAL", health.stderr
    assert [(g["host"], g["index"], g["verdict"]) for g in verdicts["gpus"]] == [
        ("ray:127.0.0.1", 0, "CRITICAL")
    ]
    left = {j.submission_id for j in client.list_jobs()}
    assert not left & set(censuses)  # the earlier censuses deleted by the next one
    store = Store(f"sqlite:///{home / 'nightshift.db'}")
    with store.session() as s:
        _job(s, "after", 1)
    decision = place(load_snapshot(store, datetime.now(), cluster="ray:"))
    assert not decision.starts and "quarantined" in next(iter(decision.holds.values()))
