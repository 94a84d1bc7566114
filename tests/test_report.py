"""`nightshift report`: the night's summary from the store, as JSON and as Markdown with a plot."""

from __future__ import annotations

import json

import pytest

from conftest import nightshift

pytestmark = pytest.mark.slow


def test_report_after_a_crash_and_a_recovery(home, tmp_path):
    """After the quickstart: one job, two attempts, one crash by cause, one recovery."""
    assert nightshift("run", "examples/goals/quickstart.yaml").returncode == 0
    r = json.loads(nightshift("report", "--json").stdout)
    assert r["states"] == {"succeeded": 1}
    assert r["attempts"] == 2
    assert r["failures_by_cause"] == {"crashed": 1}
    assert r["recoveries"] == 1
    assert r["cpu_hours"] > 0 and r["gpu_hours"] == 0
    assert r["energy_kwh"] is None  # no meter and no declared draw: not invented
    good = home / "runs" / "job-1" / "good-checkpoints"
    on_disk = sum(p.stat().st_size for p in good.rglob("*") if p.is_file())
    assert r["kept_checkpoint_bytes"] == on_disk > 0
    md = tmp_path / "night.md"
    res = nightshift("report", "--markdown", str(md))
    assert res.returncode == 0, res.stderr
    text = md.read_text()
    assert "| crashed | 1 |" in text and "![metric per job](night.png)" in text
    assert (tmp_path / "night.png").read_bytes()[:4] == b"\x89PNG"
