"""The breakdown of GPUs idle while jobs wait (evals/idle_while_waiting.py) on a hand trace: two
4-GPU hosts, each pinned by a 10-hour 1-GPU job among three 1-hour ones, and a 4-GPU job from
1.5 h. Without migration six GPUs (three a host) stand idle, fragmented, until a 10-hour job
ends; with it, the wide job starts at once and nothing stands idle."""

from __future__ import annotations

import dataclasses

import pytest
from sim_setups import hand_setup

from nightshift.evals import idle_while_waiting as W
from nightshift.evals import simulate as S

HOUR = 3600.0


def _setup() -> S.Setup:
    jobs = [(0.0, 10 * HOUR, 1), (1.0, HOUR, 1), (2.0, HOUR, 1), (3.0, HOUR, 1)]
    jobs += [(4.0, 10 * HOUR, 1), (5.0, HOUR, 1), (6.0, HOUR, 1), (7.0, HOUR, 1)]
    jobs += [(1.5 * HOUR, 8 * HOUR, 4)]
    return dataclasses.replace(hand_setup(jobs, [4, 4]), window=(0.0, 20 * HOUR))


def test_fragmented_gpus_are_counted_and_agree_with_the_simulators_own_measure():
    got, metrics = W.idle_why(_setup(), "nightshift-nomove")
    assert got[W.FRAGMENTED] == pytest.approx(6 * 8.5 * HOUR, abs=6 * 10.0)
    assert sum(got.values()) == got[W.FRAGMENTED]
    capacity = 8 * 20 * HOUR
    assert metrics["idle_waiting"] * capacity == pytest.approx(got[W.FRAGMENTED], rel=1e-6)


def test_with_migration_no_gpu_stands_idle_while_the_wide_job_waits():
    got, metrics = W.idle_why(_setup(), S.NOTARIFF)
    assert sum(got.values()) == 0.0 and metrics["idle_waiting"] == 0.0


def test_an_unknown_policy_is_named_without_a_traceback(capsys):
    with pytest.raises(SystemExit) as exc:
        W.main(["--policy", "nightshift-nope"])
    assert exc.value.code == 2 and "--policy: unknown nightshift-nope" in capsys.readouterr().err
