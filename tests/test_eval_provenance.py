"""The provenance cost eval in its smallest size: every way launches and is timed, and the
capture parts it lists are measured."""

from __future__ import annotations

import csv

import pytest

from nightshift.evals import provenance_cost

pytestmark = pytest.mark.slow


def test_provenance_eval_times_each_way_and_part(tmp_path, monkeypatch):
    """One timed launch per way; a cold package list costs more than a cached one."""
    monkeypatch.delenv("NIGHTSHIFT_HOME", raising=False)
    assert provenance_cost.main(["--launches", "1", "--out", str(tmp_path)]) == 0
    with (tmp_path / "provenance.csv").open() as f:
        rows = {(r["benchmark"], r["variant"]): r for r in csv.DictReader(f)}
    for way in ("off", "warm", "cold", "dirty + data"):
        assert float(rows["launch", way]["median_ms"]) > 0
    parts = {v: float(r["median_ms"]) for (b, v), r in rows.items() if b == "part"}
    assert parts["package list, cached"] < parts["package list, pip freeze"]
