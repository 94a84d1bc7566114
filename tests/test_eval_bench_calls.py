"""The per-call cost benchmark in its smoke size (`--quick`): every measure is in the JSON, the
submissions from 1 and 4 processes all landed exactly once, and the audit chain they wrote
verifies."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nightshift.evals import bench_calls

pytestmark = pytest.mark.slow


def test_bench_calls_quick_measures_everything_and_loses_nothing(tmp_path):
    out = tmp_path / "calls.json"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_")},
        "NIGHTSHIFT_HOME": str(tmp_path / "home"),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nightshift.evals.bench_calls",
            "--quick",
            "--json",
            str(out),
            "--workdir",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "measure" in done.stdout and "met?" in done.stdout  # the table was printed
    result = json.loads(out.read_text())
    assert result["meta"]["quick"] is True
    measures = result["measures"]
    assert set(measures) == set(bench_calls.MEASURES)
    for key, m in measures.items():
        assert {"what", "value", "unit", "goal", "met", "detail"} <= set(m), key
        # A number, or an explicit n/a saying why: never silently missing.
        assert (isinstance(m["value"], (int, float)) and m["value"] > 0) or (
            m["value"] is None and m["detail"].startswith("n/a")
        ), (key, m)
    k = result["meta"]["sizes"]["submit_k"]
    for key, procs in (("submit_1proc", 1), ("submit_4proc", 4)):
        m = measures[key]
        assert m["value"] is not None, m["detail"]
        assert (m["lost"], m["doubled"], m["errors"]) == (0, 0, 0), m["detail"]
        assert m["calls"] == procs * (k + 1) == m["rows"], m["detail"]
        assert m["verify_ok"] is True, m["detail"]
        assert m["audit_events"] >= m["calls"], m["detail"]
    assert measures["sqlite_raw"]["value"] > 0
    # The benchmark left nothing behind in the home it was handed, nor in its work folder.
    assert not (tmp_path / "home").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["calls.json"]


def test_integrity_failures_names_a_lost_or_doubled_submission():
    """The exit status 1 path: a count that does not add up is reported, not averaged away."""
    good = {
        "value": 1.0,
        "lost": 0,
        "doubled": 0,
        "rows": 5,
        "calls": 5,
        "verify_ok": True,
        "detail": "ok",
    }
    assert bench_calls.integrity_failures({"measures": {"submit_4proc": good}}) == []
    for change in ({"lost": 1}, {"doubled": 1}, {"rows": 6}, {"verify_ok": False}):
        bad = {**good, **change, "detail": str(change)}
        assert bench_calls.integrity_failures({"measures": {"submit_4proc": bad}}) == [
            f"submit_4proc: {change}"
        ]
