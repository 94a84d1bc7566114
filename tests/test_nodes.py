"""Several daemons on one store: each is a node that starts any queued job but watches, places on
its GPUs and recovers only the attempts it started (a pid or a GPU index means something on its
own node only)."""

from __future__ import annotations

from datetime import timedelta

from nightshift.agent.brain.wiring import Wiring, local_now
from nightshift.runtime.scheduling.snapshot import load_snapshot
from nightshift.runtime.store.db import Attempt, Job

SPEC = {"name": "n", "command": ["python", "-c", "pass"], "resources": {"gpus": 1}}


def attempt_on(w: Wiring, node: str, *, state: str, job_state: str) -> int:
    with w.store.session() as s:
        job = Job(name="n", spec=SPEC, owner="me", state=job_state)
        s.add(job)
        s.flush()
        s.add(
            Attempt(
                job_id=job.id,
                number=1,
                state=state,
                node=node,
                gpus=[0],
                handle={
                    "kind": "local",
                    "key": f"{node}-gone",
                    "pid": 999_999,
                    "pgid": 999_999,
                    "start_time": 1,
                    "exit_file": str(w.settings.home_path / "no-such-exit-file"),
                    "log_path": str(w.settings.home_path / "no-such.log"),
                    "argv": ["python"],
                    "cwd": "/",
                },
                outcome=None if state == "running" else "failed",
                started_at=local_now() - timedelta(minutes=5),
                ended_at=None if state == "running" else local_now(),
            )
        )
        return job.id  # type: ignore[return-value]


def test_another_nodes_run_is_not_watched_counted_or_recovered(home, monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_LOOP__NODE", "a")
    w = Wiring.load()
    theirs = attempt_on(w, "b", state="running", job_state="running")
    w.engine.watch_running(local_now())  # its pid is nothing here: polling it would call it lost
    assert w.store.job(theirs).state == "running"
    assert load_snapshot(w.store, local_now(), node="a").running == []
    assert [r.id for r in load_snapshot(w.store, local_now(), node="b").running] == [theirs]
    failed_there = attempt_on(w, "b", state="exited", job_state="failed")
    failed_here = attempt_on(w, "a", state="exited", job_state="failed")
    assert [j for j, _ in w.loop._needing_recovery()] == [failed_here]
    assert failed_there != failed_here


def test_a_node_watches_its_own_runs(home, monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_LOOP__NODE", "a")
    w = Wiring.load()
    mine = attempt_on(w, "a", state="running", job_state="running")
    w.engine.watch_running(local_now())
    assert w.store.job(mine).state != "running"  # its process is gone: seen and ended
