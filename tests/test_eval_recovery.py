"""The fault-injection recovery eval, end to end in its CI size (`--quick`: one run of each fault):
nightshift recovers every retryable fault within a checkpoint interval, and the naive retry loop
measured in the same invocation does worse."""

from __future__ import annotations

import csv

import pytest

from nightshift.evals import recovery

pytestmark = pytest.mark.slow

RETRYABLE = ("oom", "nan", "crash", "kill", "hang", "corrupt_checkpoint")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, str], dict]:
    """One `--quick` invocation shared by the tests below: {(fault, approach): CSV row}."""
    out = tmp_path_factory.mktemp("recovery-out")
    assert recovery.main(["--quick", "--out", str(out)]) == 0
    assert (out / "recovery_summary.csv").exists() and (out / "recovery_steps_lost.png").exists()
    with (out / "recovery_runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["fault"] for r in rows} == set(recovery.FAULTS)
    return {(r["fault"], r["approach"]): r for r in rows}


def test_nightshift_finishes_every_retryable_fault_within_one_interval_per_failure(runs):
    """Retryable faults finish, replaying ≤ one interval per failure (two if the newest is corrupt)."""
    for fault in RETRYABLE:
        r = runs[fault, "nightshift"]
        assert r["finished"] == "True", (fault, r)
        failures = int(r["attempts"]) - 1
        intervals = 2 if fault == "corrupt_checkpoint" else 1
        assert failures >= 1, (fault, r)
        assert int(r["steps_lost"]) <= intervals * int(r["checkpoint_every"]) * failures, (fault, r)
        assert float(r["detect_s"]) >= 0 and float(r["recover_s"]) > 0, (fault, r)
        assert r["model_calls"] == "0", (fault, r)
    assert "not truncated" not in runs["corrupt_checkpoint", "nightshift"]["note"]


def test_recoveries_change_the_parameters_the_fault_depends_on(runs):
    """OOM halves the micro-batch, NaN lowers the learning rate; the others resume unchanged."""
    assert "micro_batch 32→16" in runs["oom", "nightshift"]["changes"]
    assert "lr 0.01→" in runs["nan", "nightshift"]["changes"]
    for fault in ("crash", "kill", "hang", "corrupt_checkpoint"):
        assert runs[fault, "nightshift"]["param_changes"] == "0", fault


def test_naive_retry_loses_more_or_never_finishes(runs):
    """Plain retries never finish OOM, NaN or a hang, and replay every step of a transient fault."""
    for fault in ("oom", "nan", "hang"):
        assert runs[fault, "naive"]["finished"] == "False", fault
    for fault in ("crash", "kill", "corrupt_checkpoint"):
        naive, ours = runs[fault, "naive"], runs[fault, "nightshift"]
        assert naive["finished"] == "True", (fault, naive)
        assert int(naive["steps_lost"]) > int(ours["steps_lost"]), (fault, naive, ours)
        assert int(naive["steps_lost"]) == int(naive["fault_step"]) - 1, (fault, naive)


def test_missing_data_stops_at_once_while_naive_burns_its_retries(runs):
    """A missing data file stops nightshift after one attempt; the plain loop spends all its tries."""
    ours, naive = runs["missing_data", "nightshift"], runs["missing_data", "naive"]
    assert (ours["finished"], ours["attempts"], ours["causes"]) == ("False", "1", "file_missing")
    assert (naive["finished"], naive["attempts"]) == ("False", str(recovery.QUICK.retries + 1))


def test_the_control_run_loses_nothing(runs):
    """Without a fault both approaches finish in one attempt."""
    for approach in ("nightshift", "naive"):
        r = runs["none", approach]
        assert (r["finished"], r["attempts"], r["steps_lost"]) == ("True", "1", "0"), r
