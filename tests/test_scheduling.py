"""The daemon's scheduling with real processes: cost-sensitive work held for off-peak hours
while urgent work runs, and a high-priority job preempting a low-priority one that resumes
from its checkpoint afterwards. GPUs come from a declared inventory (no GPU here)."""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from conftest import nightshift, write_spec

pytestmark = pytest.mark.slow


def configure(home, **sections) -> None:
    (home / "config.yaml").write_text(yaml.safe_dump(sections))


def jobs(home) -> dict[int, dict]:
    return {j["id"]: j for j in json.loads(nightshift("jobs", "--json").stdout)}


def test_cost_sensitive_waits_for_off_peak_while_urgent_runs(home, tmp_path):
    """Outside the cheap window a cost-sensitive job waits with the window's start as its
    reason; an urgent job runs at once."""
    h = datetime.now(UTC).hour
    cheap = (f"{(h + 2) % 24:02d}:00", f"{(h + 3) % 24:02d}:00")
    configure(
        home,
        tariff={
            "timezone": "UTC",
            "currency": "EUR",
            "windows": [
                {
                    "name": "valley",
                    "days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
                    "start": cheap[0],
                    "end": cheap[1],
                    "price_per_kwh": 0.10,
                },
                {
                    "name": "peak",
                    "days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
                    "start": cheap[1],
                    "end": cheap[0],
                    "price_per_kwh": 0.40,
                },
            ],
        },
    )
    spec = write_spec(
        tmp_path, steps=40, resources={"gpus": 0, "expected_duration_min": 1, "power_w": 300}
    )
    assert nightshift("submit", str(spec), "--cost", "cost_sensitive").returncode == 0
    assert nightshift("submit", str(spec), "--cost", "urgent").returncode == 0
    assert nightshift("daemon", "--max-ticks", "40").returncode == 0
    held, urgent = jobs(home)[1], jobs(home)[2]
    # a window that opens tomorrow (the test run at 22:00 or later) is named with its day
    opens = cheap[0] if h + 2 < 24 else f"{datetime.now(UTC) + timedelta(days=1):%a} {cheap[0]}"
    assert held["state"] == "queued" and held["why"] == f"held for off-peak until {opens}"
    assert urgent["state"] == "succeeded"
    report = json.loads(nightshift("report", "--json").stdout)
    assert report["energy_kwh"] > 0 and report["energy_cost"] > 0 and report["currency"] == "EUR"


def test_high_priority_preempts_low_which_resumes_from_its_checkpoint(home, tmp_path):
    """One GPU: the urgent job pauses the running low-priority one (through the gate), runs, and
    the paused job comes back from its newest checkpoint and finishes."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {
                        "name": "NVIDIA H100 80GB HBM3",
                        "uuid": "GPU-inv-0",
                        "memory_total_mib": 81559,
                        "memory_used_mib": 0,
                        "temperature_c": 40,
                        "utilization_pct": 0,
                    }
                ]
            }
        )
    )
    configure(
        home,
        gpu={"probe": "inventory", "inventory": str(inventory)},
        scheduler={"preempt_margin": 5},
    )
    low = write_spec(
        tmp_path,
        steps=300,
        file="low.yaml",
        name="low",
        env={"NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S": "0.03"},
        resources={"gpus": 1},
    )
    high = write_spec(tmp_path, steps=50, file="high.yaml", name="high", resources={"gpus": 1})
    import subprocess
    import sys

    from conftest import REPO

    daemon = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "daemon"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert nightshift("submit", str(low), "--priority", "low").returncode == 0
        db = home / "nightshift.db"
        end = time.monotonic() + 60
        while time.monotonic() < end:
            row = (
                sqlite3.connect(db)
                .execute("select last_step from attempt where job_id=1")
                .fetchone()
            )
            if row and row[0] and row[0] > 60:
                break
            time.sleep(0.1)
        assert nightshift("submit", str(high), "--priority", "high").returncode == 0
        end = time.monotonic() + 120
        while time.monotonic() < end:
            states = {j["id"]: j["state"] for j in jobs(home).values()}
            if states == {1: "succeeded", 2: "succeeded"}:
                break
            time.sleep(0.5)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    assert states == {1: "succeeded", 2: "succeeded"}
    con = sqlite3.connect(home / "nightshift.db")
    low_atts = con.execute(
        "select outcome, start_step, last_step, started_at, ended_at "
        "from attempt where job_id=1 order by number"
    ).fetchall()
    high_att = con.execute("select started_at, ended_at from attempt where job_id=2").fetchone()
    assert [a[0] for a in low_atts] == ["preempted", "succeeded"]
    assert low_atts[1][1] > 0 and low_atts[0][2] - low_atts[1][1] <= 25  # resumed from a checkpoint
    assert low_atts[0][4] <= high_att[0] <= high_att[1] <= low_atts[1][3]  # never both on the GPU
    paused = [
        json.loads(p)
        for (p,) in con.execute(
            "select payload from auditevent where action='skill.result' and skill='pause_job'"
        )
    ]
    assert paused and paused[0]["result"]["after"] == "paused"
