"""Jobs mirrored to a real MLflow server (tracking.mlflow.uri): what a run shows after a job ran
to the end through `nightshift run`, a daemon killed with -9 and restarted (no second run, no
point twice), a failing job, a program's own `mlflow.log_metric` in the job's run, an MLflow
that is down (the job still succeeds; the mirror catches up later), and PostgreSQL as MLflow's
backend store."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import yaml

from nightshift.runtime.training.mlflow_rest import MlflowClient

from conftest import REPO, nightshift, reproduce_goal, store_row, write_spec

if TYPE_CHECKING:
    from mlflow_service import MlflowServer

pytest_plugins = ["postgres_service", "mlflow_service"]
pytestmark = [pytest.mark.service, pytest.mark.slow]

SLOW_PROGRAM = """
import json, sys, time
path, steps = sys.argv[1], int(sys.argv[2])
for step in range(1, steps + 1):
    with open(path, "a") as f:
        f.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n")
    time.sleep(0.05)
"""

OWN_LOGGING = """
import os, sys
print("run", os.environ.get("MLFLOW_RUN_ID"), flush=True)  # mlflow takes it out of os.environ
import mlflow
mlflow.log_metric("own_metric", 1.5, step=3)
sys.exit(1)
"""


def _env(server: MlflowServer | str, experiment: str) -> dict[str, str]:
    url = server if isinstance(server, str) else server.url
    return {
        "NIGHTSHIFT_TRACKING__MLFLOW__URI": url,
        "NIGHTSHIFT_TRACKING__MLFLOW__EXPERIMENT": experiment,
        "NIGHTSHIFT_TRACKING__MLFLOW__INTERVAL_S": "0.3",
        "NIGHTSHIFT_GPU__PROBE": "none",
        "NIGHTSHIFT_EXECUTOR__RUN_AS": "daemon",
    }


def _goal(tmp_path: Path, spec: Path) -> Path:
    goal = tmp_path / "goal.yaml"
    goal.write_text(yaml.safe_dump({"name": "mirrored", "goal": "train", "spec": str(spec)}))
    return goal


def _spec(tmp_path: Path, name: str, command: list[str], *, retries: int = 0) -> Path:
    spec = {
        "name": name,
        "code": {"path": str(tmp_path)},
        "command": command,
        "parameters": {"steps": 120, "lr": 0.1},
        "resources": {"gpus": 0},
        "metrics": {"file": "metrics.jsonl", "name": "loss", "mode": "min"},
        "seed": 1,
        "retries": retries,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _runs(client: MlflowClient, experiment: str, job_id: int) -> list[dict]:
    return client.find_runs(client.experiment_id(experiment), "nightshift.job_id", str(job_id))


def _tags(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags") or []}


def _params(run: dict) -> dict[str, str]:
    return {p["key"]: p["value"] for p in run["data"].get("params") or []}


def _store_points(db: Path, job_id: int, name: str = "loss") -> list[tuple[int, float]]:
    rows = sqlite3.connect(db).execute(
        "select step, value from metricpoint where job_id=? and name=? order by id", (job_id, name)
    )
    return [(int(s), float(v)) for s, v in rows]


def _store_timed(db: Path, job_id: int, name: str = "loss") -> list[tuple[int, float, int]]:
    """The store's points with the time the mirror sends for each: its own, else (a point from
    before 0019) its attempt's start, in MLflow's milliseconds."""
    rows = sqlite3.connect(db).execute(
        "select p.step, p.value, coalesce(p.wall_time, a.started_at) from metricpoint p "
        "join attempt a on a.id = p.attempt_id where p.job_id=? and p.name=? order by p.id",
        (job_id, name),
    )
    return [(int(s), float(v), _ms(t)) for s, v, t in rows]


def _ms(stored: str) -> int:
    return int(datetime.fromisoformat(stored).replace(tzinfo=UTC).timestamp() * 1000)


def _expected(db: Path, job_id: int, name: str = "loss") -> Counter:
    """The store's points as MLflow keeps them: each (step, value, time) once — a point logged
    twice, identical, and read in one tick is one point there (the quickstart logs its last step
    again), while the overlapping steps of two attempts, read at other times, are both kept."""
    return Counter((s, v) for s, v, _ in set(_store_timed(db, job_id, name)))


def _artifact(url: str, run: dict, path: str) -> bytes:
    """An artifact's bytes, as MLflow's own artifact proxy serves them."""
    root = run["info"]["artifact_uri"].removeprefix("mlflow-artifacts:").lstrip("/")
    r = httpx.get(f"{url}/api/2.0/mlflow-artifacts/artifacts/{root}/{path}", trust_env=False)
    assert r.status_code == 200, r.text
    return r.content


def _history(client: MlflowClient, run_id: str, key: str = "loss") -> list[tuple[int, float]]:
    return [(s, v) for s, v, _ in _timed_history(client, run_id, key)]


def _timed_history(
    client: MlflowClient, run_id: str, key: str = "loss"
) -> list[tuple[int, float, int]]:
    return [
        (int(m["step"]), float(m["value"]), int(m["timestamp"]))
        for m in client.metric_history(run_id, key)
    ]


def test_a_job_run_to_the_end_is_an_mlflow_run(home, tmp_path, mlflow_server):
    """The quickstart (a crash at step 140, a resume from step 125, the end at 300) through
    `nightshift run`: one MLflow run with the job's parameters, every loss point of both
    attempts by step, the job's tags and provenance, both logs and the metrics file as
    artifacts, FINISHED."""
    env = _env(mlflow_server, "quickstart")
    res = nightshift("run", "examples/goals/quickstart.yaml", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    client = MlflowClient(mlflow_server.url)
    (run,) = _runs(client, "quickstart", 1)
    assert run["info"]["status"] == "FINISHED"
    assert run["info"]["end_time"] >= run["info"]["start_time"]
    params = _params(run)
    assert params["lr"] == "0.01" and params["steps"] == "300" and params["seed"] == "0"
    tags = _tags(run)
    assert tags["nightshift.job_id"] == "1" and tags["nightshift.job_name"] == "quickstart"
    assert tags["nightshift.owner"] == tags["mlflow.user"] != ""
    assert tags["nightshift.attempt"] == "2"
    assert tags["nightshift.provenance.seed"] == "0"
    assert tags["nightshift.provenance.host"]
    assert len(tags["nightshift.provenance.commit"]) == 40  # examples/ is in this git tree
    assert tags["mlflow.source.git.commit"] == tags["nightshift.provenance.commit"]
    assert tags["nightshift.provenance.dirty_tree"] in ("True", "False")
    # Every point the store holds, once, in the order recorded (two attempts overlap 126..139).
    stored = _store_points(home / "nightshift.db", 1)
    assert len(stored) > 300 and len({step for step, _ in stored}) == 300
    assert Counter(_history(client, run["info"]["run_id"])) == _expected(home / "nightshift.db", 1)
    logs = {f["path"] for f in client.list_artifacts(run["info"]["run_id"], "logs")}
    assert logs == {"logs/attempt-1.log", "logs/attempt-2.log"}
    metrics = {f["path"] for f in client.list_artifacts(run["info"]["run_id"], "metrics")}
    assert metrics == {"metrics/metrics.jsonl"}
    # the program draws nothing; the mirror's own plot of the curves is there, a real PNG
    plots = {f["path"] for f in client.list_artifacts(run["info"]["run_id"], "plots")}
    assert plots == {"plots/nightshift-curves.png"}
    png = _artifact(mlflow_server.url, run, "plots/nightshift-curves.png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    audit = nightshift("audit", "verify")
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_a_programs_own_mlflow_logging_lands_in_its_jobs_run_and_a_failed_job_is_failed(
    home, tmp_path, mlflow_server
):
    """The job's program gets MLFLOW_TRACKING_URI and MLFLOW_RUN_ID: `mlflow.log_metric` (the
    MLflow client, from the server's venv) writes into the job's run; the program exits 1 with
    no retries, and the run ends FAILED."""
    (tmp_path / "own.py").write_text(OWN_LOGGING)
    spec = _spec(tmp_path, "own", [str(mlflow_server.python), "own.py"])
    res = nightshift("run", str(_goal(tmp_path, spec)), env=_env(mlflow_server, "own"))
    assert res.returncode != 0
    db = sqlite3.connect(home / "nightshift.db")
    assert db.execute("select state from job").fetchone() == ("failed",)
    client = MlflowClient(mlflow_server.url)
    (run,) = _runs(client, "own", 1)
    run_id = run["info"]["run_id"]
    log = (home / "runs" / "job-1" / "attempt-1.log").read_text()
    assert f"run {run_id}" in log, log
    assert _history(client, run_id, "own_metric") == [(3, 1.5)]
    assert run["info"]["status"] == "FAILED"
    assert {f["path"] for f in client.list_artifacts(run_id, "logs")} == {"logs/attempt-1.log"}


def _daemon(env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "nightshift.agent.doors.entry", "daemon"],
            cwd=REPO,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_a_daemon_killed_and_restarted_neither_makes_a_second_run_nor_sends_a_point_twice(
    home, tmp_path, mlflow_server
):
    """kill -9 mid-job, after the first points reached MLflow; then the mirror's row is lost as
    a kill between MLflow's answer and the store's commit would lose it (no run id, cursor 0).
    The restarted daemon finds the run by its tag, and the points sent again are kept once."""
    (tmp_path / "slow.py").write_text(SLOW_PROGRAM)
    spec = _spec(tmp_path, "slow", ["{python}", "slow.py", "{metrics_file}", "{steps}"])
    env = _env(mlflow_server, "restarts")
    db = home / "nightshift.db"
    log = tmp_path / "daemon.log"
    first = _daemon(env, log)
    try:
        res = nightshift("submit", str(spec), env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        store_row(db, "select run_id from mlflow_run where metric_cursor > 20", proc=None)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    before = sqlite3.connect(db)
    (run_id,) = before.execute("select run_id from mlflow_run").fetchone()
    before.execute("delete from mlflow_run")
    before.commit()
    second = _daemon(env, log)
    try:
        store_row(
            db,
            "select 1 from mlflow_run r join job j on j.id = r.job_id "
            "where j.state = 'succeeded' and r.synced_update is not null",
            timeout=120,
        )
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    client = MlflowClient(mlflow_server.url)
    (run,) = _runs(client, "restarts", 1)
    assert run["info"]["run_id"] == run_id
    assert run["info"]["status"] == "FINISHED"
    stored = _store_points(db, 1)
    assert [s for s, _ in stored] == list(range(1, 121))
    assert Counter(_history(client, run_id)) == Counter(stored) == _expected(db, 1)
    # Each point at the time the loop read it (not all at the attempt's start), the same time
    # when it was sent again after the restart: MLflow kept it once.
    timed = _store_timed(db, 1)
    assert Counter(_timed_history(client, run_id)) == Counter(timed)
    assert len({t for *_, t in timed}) > 1
    assert [t for *_, t in timed] == sorted(t for *_, t in timed)


def test_an_unreachable_mlflow_fails_no_job_and_the_mirror_catches_up(
    home, tmp_path, monkeypatch, mlflow_served
):
    """MLflow down: the job runs and succeeds, the audit says MLflow was unreachable, and once a
    server answers at that address the next pass mirrors the whole job."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    spec = write_spec(tmp_path, steps=60)
    started = time.monotonic()
    res = nightshift("run", str(_goal(tmp_path, spec)), env=_env(url, "late"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert time.monotonic() - started < 90
    db = sqlite3.connect(home / "nightshift.db")
    assert db.execute("select state from job").fetchone() == ("succeeded",)
    actions = [a for (a,) in db.execute("select action from auditevent")]
    assert "mlflow.unreachable" in actions
    assert db.execute("select count(*) from mlflow_run").fetchone() == (0,)

    with mlflow_served(tmp_path / "mlflow", port=port) as server:
        for key, value in _env(server, "late").items():
            monkeypatch.setenv(key, value)
        from nightshift.agent.brain.wiring import Wiring

        w = Wiring.load()
        assert w.mirror is not None
        done = w.mirror.sync(final=True)
        assert done.errors == [] and done.runs_created == 1
        client = MlflowClient(server.url)
        (run,) = _runs(client, "late", 1)
        assert run["info"]["status"] == "FINISHED"
        assert Counter(_history(client, run["info"]["run_id"])) == _expected(
            home / "nightshift.db", 1
        )
        assert w.mirror.sync().jobs == 0  # mirrored whole: nothing left to do


def test_postgresql_as_mlflows_backend_store(home, tmp_path, postgres_server, mlflow_served):
    """The production shape: MLflow's server on a PostgreSQL database (the tests' own server)."""
    database = postgres_server.create_database()
    backend = f"postgresql+psycopg2://postgres@127.0.0.1:{postgres_server.port}/{database}"
    with mlflow_served(tmp_path / "mlflow", backend) as server:
        spec = write_spec(tmp_path, steps=40)
        res = nightshift("run", str(_goal(tmp_path, spec)), env=_env(server, "pg"))
        assert res.returncode == 0, res.stdout + res.stderr
        client = MlflowClient(server.url)
        (run,) = _runs(client, "pg", 1)
        assert run["info"]["status"] == "FINISHED"
        assert Counter(_history(client, run["info"]["run_id"])) == _expected(
            home / "nightshift.db", 1
        )


def _ended_job(w, *, params: dict, points: list[tuple[str, int, float]]) -> int:
    """An ended job written straight into the store, with its points (as the loop records
    them), and its log in its folder."""
    from nightshift.runtime.engine import job_paths
    from nightshift.runtime.store.db import Attempt, Job, MetricPoint, utcnow

    spec = {"name": "direct", "code": {"path": "."}, "command": ["true"]}
    with w.store.session() as s:
        job = Job(name="direct", spec=spec, params=params, owner="tester", state="succeeded")
        s.add(job)
        s.flush()
        att = Attempt(job_id=job.id, number=1, node=w.settings.node, state="exited")
        att.outcome, att.ended_at = "succeeded", utcnow()
        s.add(att)
        s.flush()
        s.add_all(
            MetricPoint(attempt_id=att.id, job_id=job.id, step=step, name=name, value=value)
            for name, step, value in points
        )
        job_id = int(job.id)
        folder = job_paths(w.settings, job)["workspace"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "attempt-1.log").write_text("done\n")
    (folder / "curve.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return job_id


def test_names_mlflow_refuses_are_mended_and_a_new_server_gets_a_run_of_its_own(
    home, tmp_path, monkeypatch, mlflow_server, mlflow_served
):
    """A parameter `a:b` and a metric `acc@1` (characters MLflow refuses in a name) arrive as
    `a_b` and `acc_1`, with a plot as an artifact; when `tracking.mlflow.uri` names another
    server, the job is mirrored there afresh instead of writing to a run id that server lacks."""
    from nightshift.agent.brain.wiring import Wiring

    for k, v in _env(mlflow_server, "names").items():
        monkeypatch.setenv(k, v)
    w = Wiring.load()
    job_id = _ended_job(w, params={"a:b": 1}, points=[("acc@1", 1, 0.5), ("acc@1", 2, 0.75)])
    assert w.mirror is not None
    assert w.mirror.sync(final=True).errors == []
    client = MlflowClient(mlflow_server.url)
    (run,) = _runs(client, "names", job_id)
    assert _params(run)["a_b"] == "1"
    assert _history(client, run["info"]["run_id"], "acc_1") == [(1, 0.5), (2, 0.75)]
    # points with no time of their own (recorded before 0019) are sent at their attempt's start
    started = sqlite3.connect(home / "nightshift.db").execute(
        "select started_at from attempt where job_id = ?", (job_id,)
    )
    assert {t for *_, t in _timed_history(client, run["info"]["run_id"], "acc_1")} == {
        _ms(started.fetchone()[0])
    }
    plots = {f["path"] for f in client.list_artifacts(run["info"]["run_id"], "plots")}
    assert plots == {"plots/curve.png", "plots/nightshift-curves.png"}

    with mlflow_served(tmp_path / "other") as other:
        monkeypatch.setenv("NIGHTSHIFT_TRACKING__MLFLOW__URI", other.url)
        moved = Wiring.load()
        assert moved.mirror is not None
        assert moved.mirror.env_for(job_id)["MLFLOW_TRACKING_URI"] == other.url
        assert moved.mirror.sync(final=True).errors == []
        (again,) = _runs(MlflowClient(other.url), "names", job_id)
        assert again["info"]["status"] == "FINISHED"
        assert again["info"]["run_id"] != run["info"]["run_id"]


def test_the_cost_eval_mirrors_a_job_and_times_a_launch(tmp_path, mlflow_server, monkeypatch):
    """`nightshift eval mlflow --quick` against the module's server: one job of 1,000 points
    mirrored whole, a pass with nothing to do, a launch's wait with MLflow up and down."""
    import csv

    from nightshift.evals import mlflow_cost

    monkeypatch.delenv("NIGHTSHIFT_HOME", raising=False)
    out = tmp_path / "out"
    assert mlflow_cost.main(["--quick", "--url", mlflow_server.url, "--out", str(out)]) == 0
    with (out / "mlflow.csv").open() as f:
        rows = {(r["benchmark"], r["variant"]): r for r in csv.DictReader(f)}
    assert rows["mirror a job", "1,000 points"]["passes"] == "1"
    assert float(rows["mirror a job", "1,000 points"]["ms"]) > 0
    assert float(rows["launch env", "MLflow down (closed port)"]["ms"]) < 2500


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _rest(http: httpx.Client, method: str, name: str, **kw) -> dict:
    r = http.request(method, f"/api/2.0/mlflow/{name}", **kw)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_dirty_run_and_its_reproduction_are_two_runs_on_the_mlflow_server(
    home, tmp_path, mlflow_server
):
    """Done means (issue 30), the MLflow part: a job trained from a dirty git tree, then
    reproduce_job of it from a worktree of its commit with the kept diff applied, both to the
    end. MLflow's own REST API (asked directly, not through nightshift) shows two FINISHED runs,
    each with its loss history by step at the times the program wrote in its lines (its `time`
    field, not a metric), both tagged with the commit and the dirty tree, the reproduction with
    the job it reproduces."""
    from test_provenance import PROGRAM

    timed = PROGRAM.replace("import argparse,", "import time, argparse,").replace(
        '{"step": step, "loss": loss}', '{"step": step, "loss": loss, "time": time.time()}'
    )
    assert timed.count("time.time()") == 1 and "import time," in timed
    repo = tmp_path / "code"
    repo.mkdir()
    (repo / "train.py").write_text(timed)
    (repo / "data.txt").write_text("a b c\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "tiny")
    commit = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "train.py").write_text(timed.replace("SCALE = 1.0", "SCALE = 2.0"))  # uncommitted
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "code": {"path": str(repo)},
                "command": ["{python}", "train.py", "--seed", "{seed}", "--steps", "{steps}"]
                + ["--metrics-file", "{metrics_file}"],
                "parameters": {"seed": 7, "steps": 40},
                "resources": {"gpus": 0},
                "metrics": {"file": "metrics.jsonl", "name": "loss", "mode": "min"},
                "seed": 7,
                "retries": 0,
            }
        )
    )
    env = _env(mlflow_server, "reproduced")
    res = nightshift("run", str(_goal(tmp_path, spec)), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    _git(repo, "checkout", "--", "train.py")  # clean again: only the kept diff brings it back
    res = nightshift("run", str(reproduce_goal(tmp_path, 1)), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    db = sqlite3.connect(home / "nightshift.db")
    assert dict(db.execute("select id, state from job")) == {1: "succeeded", 2: "succeeded"}

    with httpx.Client(base_url=mlflow_server.url, trust_env=False, timeout=30) as http:
        got = _rest(
            http, "GET", "experiments/get-by-name", params={"experiment_name": "reproduced"}
        )
        found = _rest(
            http,
            "POST",
            "runs/search",
            json={"experiment_ids": [got["experiment"]["experiment_id"]], "max_results": 10},
        )
        runs = {_tags(r)["nightshift.job_id"]: r for r in found["runs"]}
        assert sorted(runs) == ["1", "2"] and len(found["runs"]) == 2
        histories = {}
        for job_id, run in runs.items():
            tags = _tags(run)
            assert run["info"]["status"] == "FINISHED"
            assert tags["nightshift.provenance.commit"] == commit
            assert tags["mlflow.source.git.commit"] == commit
            assert tags["nightshift.provenance.dirty_tree"] == "True"
            assert {m["key"] for m in run["data"]["metrics"]} == {"loss"}  # `time` is no metric
            history = _rest(
                http,
                "GET",
                "metrics/get-history",
                params={"run_id": run["info"]["run_id"], "metric_key": "loss"},
            )["metrics"]
            lines = [
                json.loads(line)
                for line in (home / "runs" / f"job-{job_id}" / "metrics.jsonl")
                .read_text()
                .splitlines()
            ]
            written = [
                (
                    x["step"],
                    x["loss"],
                    int(datetime.fromtimestamp(x["time"], UTC).timestamp() * 1000),
                )
                for x in lines
            ]
            assert sorted((m["step"], m["value"], int(m["timestamp"])) for m in history) == written
            histories[job_id] = written
        assert _tags(runs["2"])["nightshift.reproduces"] == "1"
        assert "nightshift.reproduces" not in _tags(runs["1"])
        assert (
            _tags(runs["2"])["nightshift.provenance.diff"]
            == _tags(runs["1"])["nightshift.provenance.diff"]
        )
        # the same curve (the program is deterministic under its seed), written at other times
        assert [(s, v) for s, v, _ in histories["2"]] == [(s, v) for s, v, _ in histories["1"]]
        assert histories["2"][0][2] > histories["1"][-1][2]
    audit = nightshift("audit", "verify")  # the new job row, `reproduces` and all, is bound
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_a_learning_rate_a_recovery_lowered_is_tagged_on_the_run(home, tmp_path, mlflow_server):
    """NaN at step 70 while lr > 0.006: the recovery resumes with a lower lr. MLflow's parameters
    never change, so the run keeps lr 0.01 as first logged, and its tags say what the newest
    attempt ran with (`nightshift.last_attempt.param.*`)."""
    spec = write_spec(
        tmp_path,
        steps=120,
        env={
            "NIGHTSHIFT_FAULT_NAN_AT_STEP": "70",
            "NIGHTSHIFT_FAULT_NAN_ABOVE_LR": "0.006",
            "NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S": "0.02",  # the mirror sees the first attempt run
        },
    )
    res = nightshift("run", str(_goal(tmp_path, spec)), env=_env(mlflow_server, "lowered"))
    assert res.returncode == 0, res.stdout + res.stderr
    db = sqlite3.connect(home / "nightshift.db")
    ran = [json.loads(p) for (p,) in db.execute("select params from attempt order by number")]
    assert len(ran) >= 2 and ran[0]["lr"] == 0.01 and ran[-1]["lr"] <= 0.006
    (run,) = _runs(MlflowClient(mlflow_server.url), "lowered", 1)
    assert run["info"]["status"] == "FINISHED"
    assert _params(run)["lr"] == "0.01"
    tags = _tags(run)
    assert tags["nightshift.last_attempt.param.lr"] == str(ran[-1]["lr"])
    assert {k for k in tags if k.startswith("nightshift.last_attempt.param.")} == {
        f"nightshift.last_attempt.param.{k}" for k in ran[-1]
    }
