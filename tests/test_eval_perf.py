"""The performance eval in its CI size (`--quick`): every figure is a positive number and the
audit chain it wrote verifies."""

from __future__ import annotations

import csv

import pytest

from nightshift.evals import perf

pytestmark = pytest.mark.slow


def test_perf_quick_reports_positive_numbers(tmp_path):
    """Agent step latencies and audit throughputs are measured, positive and ordered sensibly."""
    assert perf.main(["--quick", "--out", str(tmp_path)]) == 0
    with (tmp_path / "perf.csv").open() as f:
        rows = {(r["benchmark"], r["variant"]): r for r in csv.DictReader(f)}
    ways = ("direct", "gate", "graph (memory)", "graph (sqlite)")
    for way in ways:
        r = rows["agent_step", way]
        assert 0 < float(r["min"]) <= float(r["median"]) <= float(r["max"]), r
    assert float(rows["agent_step", "gate"]["ratio_to_direct"]) > 1
    assert [rows["agent_step", w]["audit_events_per_call"] for w in ways] == [
        "0.0",
        "3.0",
        "4.0",
        "4.0",
    ]
    for op in ("append", "verify"):
        r = rows["audit", f"{op} (1000 events)"]
        assert r["n"] == "3" and float(r["min"]) > 0, r
    assert (tmp_path / "perf_agent_step.png").exists()


def test_audit_throughput_verifies_the_chain_it_wrote(tmp_path):
    """The throughput run verifies every event it appended (and would raise if not)."""
    out = perf.audit_throughput(tmp_path, events=50, repeats=1)
    assert len(out["append"]) == len(out["verify"]) == 1
    assert out["append"][0] > 0 and out["verify"][0] > 0
