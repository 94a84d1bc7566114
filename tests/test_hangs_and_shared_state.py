"""A researcher's first week (issue 28): a hang is caught without a `stall_min`, `jobs` names who
holds the slot a job waits for, a failed job keeps its place in priority order through its retry
backoff, and a command run with other GPU settings never quarantines the daemon's GPUs."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from nightshift.runtime.config import StallSettings
from nightshift.runtime.training.stall import stalled

from conftest import REPO, nightshift, write_spec

pytestmark = pytest.mark.slow


def start_daemon(env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "daemon"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


@pytest.fixture
def daemons():
    started: list[subprocess.Popen] = []

    def start(env: dict[str, str] | None = None) -> subprocess.Popen:
        started.append(start_daemon(env))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


def submit(spec: Path, *extra: str, env: dict[str, str] | None = None) -> int:
    res = nightshift("submit", str(spec), "--json", *extra, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    (job,) = json.loads(res.stdout)["job_ids"]
    return job


def rows(db: Path, query: str, *args) -> list[tuple]:
    try:
        return sqlite3.connect(db).execute(query, args).fetchall()
    except sqlite3.OperationalError:  # not created yet, or busy for a moment
        return []


def wait_for(what: str, probe, timeout: float = 90.0, proc: subprocess.Popen | None = None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = probe()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the daemon ended early:\n{proc.stdout.read()[-4000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def settled(db: Path, jobs: list[int]) -> bool:
    states = dict(rows(db, "select id, state from job"))
    return all(states.get(j) == "succeeded" for j in jobs)


# ------------------------------------------------------------------------------ hangs
def test_a_hang_without_stall_min_is_named_in_jobs_then_stopped_by_its_own_pace(
    home, tmp_path, daemons
):
    """The issue's hang: a run without stall_min hangs at step 90 on the only CPU slot. While it
    hangs, `jobs` says which job holds the slot the other one waits for; then the default rule
    (10× its own step interval, the floor set to 6 s here instead of 15 min) stops it as
    stalled, saying which rule fired with its numbers, and recovery resumes it to success."""
    hung = write_spec(
        tmp_path,
        steps=120,
        file="hung.yaml",
        name="hung",
        env={"NIGHTSHIFT_FAULT_HANG_AT_STEP": "90", "NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S": "0.01"},
    )
    waiting = write_spec(tmp_path, steps=30, file="waiting.yaml", name="waiting")
    assert "stall_min" not in yaml.safe_load(hung.read_text())
    first = submit(hung, "--priority", "high")
    second = submit(waiting)
    db = home / "nightshift.db"
    proc = daemons({"NIGHTSHIFT_STALL__FLOOR_MIN": "0.1"})

    def held_by() -> str | None:
        out = nightshift("jobs", "--json")
        why = {j["id"]: j["why"] for j in json.loads(out.stdout)}.get(second) or ""
        return why if f"held by job {first} (hung)" in why else None

    why = wait_for("jobs to name the hung job", held_by, proc=proc)
    assert why.startswith(f"all 1 CPU slot(s) busy: held by job {first} (hung)"), why

    wait_for("both jobs to succeed", lambda: settled(db, [first, second]), 120, proc)
    (outcome,) = rows(db, "select outcome from attempt where job_id=? and number=1", first)[0]
    assert outcome == "stalled"
    enforced = [
        json.loads(p)
        for (p,) in rows(db, "select payload from auditevent where action='limit.enforced'")
    ]
    (stop,) = [e for e in enforced if e["job_id"] == first]
    assert "10× its own step interval" in stop["why"] and "0.1-minute floor" in stop["why"]
    assert "no stall_min in the spec" in stop["why"]


def test_the_default_rule_judges_only_a_run_that_reported_steps():
    """No pace, no verdict: a program that reported fewer than min_reports times is never
    stalled by the default rule, however long it is quiet; one that did is, past the larger of
    the floor and the multiple of its median interval."""
    rule = StallSettings(multiple=10, floor_min=1, min_reports=3)
    assert stalled([], 10_000, rule) is None
    assert stalled([5.0, 6.0], 10_000, rule) is None
    assert stalled([5.0, 6.0], 10_000, StallSettings(floor_min=1)) is not None  # default: 2
    pace = [5.0, 15.0, 25.0, 30.0]  # intervals 10, 10, 5: median 10 s, so 100 s > the 60 s floor
    assert stalled(pace, 99, rule) is None
    why = stalled(pace, 101, rule)
    assert why is not None and "10× its own step interval (10.0 s" in why and "100 s" in why
    assert stalled([1.0, 1.5, 2.0], 59, rule) is None  # 5 s by pace, but the floor is 60 s
    assert stalled([1.0, 1.5, 2.0], 61, rule) is not None


def test_validate_warns_when_a_hang_would_hold_its_slot(home, tmp_path):
    """A spec with neither stall_min nor metrics that report steps gets a warning saying a hang
    would hold its slot until timeout_min; the quickstart (it writes {metrics_file}) does not."""
    plain = tmp_path / "plain.yaml"
    plain.write_text(
        yaml.safe_dump(
            {
                "name": "plain",
                "code": {"path": str(REPO / "examples")},
                "command": ["{python}", "-c", "print('hello')"],
                "resources": {"gpus": 0},
                "timeout_min": 90,
                "seed": 0,
            }
        )
    )
    out = nightshift("validate", str(plain))
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())
    assert "warning stall_min: no stall_min and no metrics that report steps" in text
    assert "a hang would hold its slot until timeout_min=90" in text
    quick = nightshift("validate", str(REPO / "examples/specs/quickstart.yaml"))
    assert quick.returncode == 0 and "stall_min" not in quick.stdout


# ------------------------------------------------------------------------------ priority order
def test_a_failed_job_keeps_its_cpu_slot_through_its_retry_wait(home, tmp_path, daemons):
    """The issue's inversion: one CPU slot, a high-priority quickstart crashes at step 140 and
    waits 3 s to retry (retry_wait_s: 3), a priority −10 job is queued behind it. The low job
    (expected to take a minute) no longer takes the slot during the wait: the high-priority
    job's second attempt starts first."""
    high = write_spec(
        tmp_path,
        steps=200,
        file="high.yaml",
        name="high",
        env={"NIGHTSHIFT_FAULT_CRASH_AT_STEP": "140"},
    )
    low = write_spec(tmp_path, steps=50, file="low.yaml", name="low")
    assert yaml.safe_load(high.read_text())["retry_wait_s"] == 3
    first = submit(high, "--priority", "high")
    second = submit(low, "--priority", "-10")
    db = home / "nightshift.db"
    proc = daemons()
    wait_for("both jobs to succeed", lambda: settled(db, [first, second]), 120, proc)
    started = {
        (job, n): t
        for job, n, t in rows(db, "select job_id, number, started_at from attempt order by id")
    }
    assert started[(first, 1)] < started[(first, 2)] < started[(second, 1)], started


# ------------------------------------------------------------------------------ shared health
INVENTORY = """\
gpus:
  - name: NVIDIA A100-SXM4-40GB
    uuid: GPU-a
    memory_total_mib: 40960
    temperature_c: {t}
  - name: NVIDIA A100-SXM4-40GB
    uuid: GPU-b
    memory_total_mib: 40960
    temperature_c: {t}
"""


@pytest.mark.parametrize(
    "client_env",
    [
        {"NIGHTSHIFT_GPU__INVENTORY": "hot.yaml"},  # another inventory: every GPU at 95 °C
        {"NIGHTSHIFT_GPU__PROBE": "none"},  # no GPUs at all: each one "disappeared"
    ],
    ids=["other-inventory", "probe-none"],
)
def test_a_client_with_other_gpu_settings_never_quarantines_the_daemons_gpus(
    home, tmp_path, daemons, client_env
):
    """The daemon judges its two GPUs healthy; then `nightshift health` from a shell with other
    GPU settings records every GPU CRITICAL. Its verdicts are its own source's: the daemon's
    placement still sees two healthy GPUs and runs a two-GPU job at once (before, it waited
    with "needs 2 GPU(s); 0 healthy (2 quarantined)" until the daemon's next check)."""
    (home / "good.yaml").write_text(INVENTORY.format(t=40))
    (home / "hot.yaml").write_text(INVENTORY.format(t=95))
    mine = {"NIGHTSHIFT_GPU__PROBE": "inventory", "NIGHTSHIFT_GPU__INVENTORY": "good.yaml"}
    db = home / "nightshift.db"
    proc = daemons(mine)
    wait_for(
        "the daemon's own health check",
        lambda: len(rows(db, "select id from gpusample where verdict='OK'")) == 2,
        proc=proc,
    )
    client = json.loads(nightshift("health", "--json", env=client_env).stdout)
    if "NIGHTSHIFT_GPU__INVENTORY" in client_env:  # its own GPUs, judged and recorded
        assert client["recorded"] == 2, client
        assert {g["verdict"] for g in client["gpus"]} == {"CRITICAL"}, client
    else:  # it sees none, and compares with its own history only: nothing "disappeared"
        assert client["overall"] == "NO_GPUS", client

    spec = write_spec(tmp_path, steps=30, name="two-gpus", resources={"gpus": 2})
    job = submit(spec, env=mine)
    wait_for("the two-GPU job to succeed", lambda: settled(db, [job]), 60, proc)
    (gpus,) = rows(db, "select gpus from attempt where job_id=?", job)[0]
    assert json.loads(gpus) == [0, 1]
