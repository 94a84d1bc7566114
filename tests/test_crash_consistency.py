"""The crash-consistency eval in its quick form: real daemons SIGKILLed at random moments and at
every named point of a launch, `nightshift run` raced against a daemon started later; counted from
outside by a ledger the workload writes. The long form (120 kills) is
`python -m nightshift.evals.crash_consistency`, its figures in docs/benchmarks.md."""

from __future__ import annotations

import pytest

from nightshift.evals.crash_consistency import run
from nightshift.runtime.executors import crashpoints


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_no_attempt_runs_twice_and_no_job_is_lost_under_sigkills(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("NIGHTSHIFT_HOME", raising=False)
    report = run(tmp_path / "home", kills=20, races=2, seed=7)
    assert report.targeted == {point: "crashed" for point in crashpoints.POINTS}
    assert report.kills_random == 20 and report.races == 2 and report.races_failed == 0
    assert report.launches_doubled == 0 and report.attempt_rows_doubled == 0
    assert report.jobs_lost == 0 and report.not_terminal == 0
    assert report.leftover_processes == 0
    assert report.audit_ok, report.audit_output
    assert report.launches >= report.jobs > 0  # work really ran, every job at least once
    assert report.ok
