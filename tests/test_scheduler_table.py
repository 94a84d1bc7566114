"""Issue 31's one command for the scheduler table: every window and policy from one invocation,
and a goals table computed from the rows it printed."""

from __future__ import annotations

import csv
import math

import pytest

from nightshift.evals import scheduler_table as T
from nightshift.evals import simulate as S


def _metrics(delay: float, top: float, util: float, **kw: float) -> dict[str, float]:
    return {"delay_mean_h": delay, "delay_max_h": top, "util": util, "util_useful": util, **kw}


def test_goals_are_judged_from_the_rows_with_a_known_pass_and_fail():
    """Hand-made rows: the strongest baseline is 2D-LAS (1.0 h), EASY+SJF 2.0 h, EASY 4.0 h
    with a 20 h longest wait. nightshift-notariff at 0.85 h passes both delay goals (0.425 and
    0.85), fails the longest wait (25 h: 1.25 × EASY's) and passes utilisation (+0.01); the
    tariff's two goals do not apply to it (it has none). nightshift, at 0.95 h,
    fails the strongest-baseline goal (0.95) and the one miss its holds caused."""
    rows = {
        "fifo": _metrics(10.0, 40.0, 0.60),
        "easy": _metrics(4.0, 20.0, 0.70),
        "easy-sjf": _metrics(2.0, 60.0, 0.69),
        "easy-sjf-aging": _metrics(3.0, 30.0, 0.70),
        "2d-las": _metrics(1.0, 50.0, 0.65),
        "2d-gittins": _metrics(1.5, 45.0, 0.66),
        S.NOTARIFF: _metrics(0.85, 25.0, 0.71, misses_vs_twin=0, saving_share_deadline=0.2),
        # no miss after a hold, but one its twin meets (a held job's GPUs made another late)
        S.NIGHTSHIFT: _metrics(
            0.95, 18.0, 0.70, hold_misses_caused=0, misses_vs_twin=1, saving_share_deadline=0.95
        ),
    }
    results = [S.RunResult("philly", 0.8, p, m, [], [], {}) for p, m in rows.items()]
    notariff, nightshift = T.goal_rows(results)
    assert notariff["policy"] == S.NOTARIFF and notariff["strongest"] == "2d-las"
    assert notariff["delay_vs_easy_sjf"] == pytest.approx(0.425)
    assert notariff["delay_vs_strongest"] == pytest.approx(0.85)
    assert notariff["max_vs_easy"] == pytest.approx(1.25)
    assert notariff["util_vs_easy"] == pytest.approx(0.01)
    verdicts = {g.column: notariff[f"{g.column}_pass"] for g in T.GOALS}
    assert verdicts == {
        "delay_vs_easy_sjf": True,
        "delay_vs_strongest": True,
        "max_vs_easy": False,
        "util_vs_easy": True,
        # the tariff's goals are not applicable without one: it is its own no-tariff twin (the
        # misses goal would pass by construction) and tries to save nothing
        "misses_vs_twin": None,
        "saving_share_deadline": None,
    }
    assert math.isnan(notariff["misses_vs_twin"]) and math.isnan(notariff["saving_share_deadline"])  # type: ignore[arg-type]
    # a power cap without a tariff is judged on the saving, not on the tariff's misses
    caponly = _metrics(0.9, 20.0, 0.70, misses_vs_twin=0, saving_share_deadline=0.5)
    capped = T.judge(rows | {"nightshift-caponly": caponly}, "nightshift-caponly")
    assert (capped["misses_vs_twin_pass"], capped["saving_share_deadline_pass"]) == (None, False)
    # n/a is neither a pass nor a failure in the count
    assert T.count([notariff, nightshift]) == (1 + 2, 4 + 6)
    assert nightshift["delay_vs_strongest"] == pytest.approx(0.95)
    assert not nightshift["delay_vs_strongest_pass"] and nightshift["max_vs_easy_pass"]
    assert not nightshift["misses_vs_twin_pass"] and nightshift["saving_share_deadline_pass"]
    # a window where nothing queues meets "≤ 0.9 ×" (0 ≤ 0) with no ratio; queueing where
    # the reference does not fails
    quiet = {p: _metrics(0.0, 0.0, 0.5) for p in rows}
    quiet[S.NIGHTSHIFT] = _metrics(0.2, 3.0, 0.5)
    got = T.goal_rows([S.RunResult("quiet", 0.8, p, m, [], [], {}) for p, m in quiet.items()])
    assert got[0]["delay_vs_easy_sjf_pass"] and math.isnan(got[0]["delay_vs_easy_sjf"])  # type: ignore[arg-type]
    assert not got[1]["delay_vs_easy_sjf_pass"] and got[1]["delay_vs_easy_sjf"] == math.inf
    # without EASY's row, the goals that need it fail with no value rather than pass
    (alone,) = T.goal_rows([r for r in results if r.policy not in ("easy", S.NIGHTSHIFT)])
    assert math.isnan(alone["max_vs_easy"]) and not alone["max_vs_easy_pass"]  # type: ignore[arg-type]


def test_one_command_writes_every_window_and_policy_and_goals_from_its_rows(tmp_path, capsys):
    """The command on minutes-long windows of every trace: a row per window and policy in the
    CSV, a goals row per window and judged policy whose ratios are the CSV's own numbers, and
    the markdown with PASS/FAIL and the count of failed goals."""
    assert T.main(["--tiny", "--out", str(tmp_path)]) == 0
    with (tmp_path / "scheduler_table.csv").open() as fh:
        table = list(csv.DictReader(fh))
    with (tmp_path / "scheduler_goals.csv").open() as fh:
        goals = list(csv.DictReader(fh))
    windows = [(w.trace, str(w.load)) for w in T.TINY]
    assert [(r["trace"], r["load"], r["policy"]) for r in table] == [
        (t, load, p) for t, load in windows for p in T.POLICIES
    ]
    assert all(r["unfinished"] == "0" for r in table)
    assert [(g["trace"], g["load"], g["policy"]) for g in goals] == [
        (t, load, p) for t, load in windows for p in T.JUDGED
    ]
    by = {(r["trace"], r["load"], r["policy"]): r for r in table}
    for g in goals:
        mine, sjf = (
            by[(g["trace"], g["load"], g["policy"])],
            by[(g["trace"], g["load"], "easy-sjf")],
        )
        easy = by[(g["trace"], g["load"], "easy")]
        d, s = float(mine["delay_mean_h"]), float(sjf["delay_mean_h"])
        if s:
            assert float(g["delay_vs_easy_sjf"]) == pytest.approx(d / s, rel=1e-5)
            assert (g["delay_vs_easy_sjf_pass"] == "True") == (d / s <= 0.9 + 1e-9)
        util = float(mine["util_useful"]) - float(easy["util_useful"])
        assert float(g["util_vs_easy"]) == pytest.approx(util, abs=1e-5)
        # the holds goal counts every miss the no-tariff twin meets, held or not
        twin = by[(g["trace"], g["load"], S.NOTARIFF)]
        if g["policy"] == S.NOTARIFF:
            assert g["misses_vs_twin_pass"] == g["saving_share_deadline_pass"] == ""  # n/a
        else:
            assert float(g["misses_vs_twin"]) >= float(mine["hold_misses_caused"])
            assert float(g["misses_vs_twin"]) >= float(mine["deadline_misses"]) - float(
                twin["deadline_misses"]
            )
    text = (tmp_path / "scheduler_table.md").read_text()
    assert text in capsys.readouterr().out  # printed as written
    assert "Command: `python -m nightshift.evals.scheduler_table --tiny --out" in text
    assert "| philly | 0.8 | `nightshift-notariff` |" in text
    assert "PASS" in text or "FAIL" in text
    given = len(goals) * len(T.GOALS) - 2 * len(T.TINY)  # the no-tariff policy's two n/a
    assert f"of {given} (a tariff goal is not applicable" in text and "| n/a | n/a |" in text


def test_bad_policy_is_named_without_a_traceback(capsys):
    with pytest.raises(SystemExit) as e:
        T.main(["--tiny", "--policies", "easy,nope"])
    assert e.value.code == 2
    assert "--policies: unknown nope" in capsys.readouterr().err


def test_parallel_workers_give_the_rows_of_one_process_in_the_same_order():
    """--jobs 2 hands the biggest windows out first; the rows come back in window and policy
    order with the numbers one process computes (wall seconds aside)."""
    windows = (T.TINY[0], T.TINY[3])  # Philly's and Tiresias' tiny windows
    pols = ("easy", "2d-gittins", S.NOTARIFF, S.NIGHTSHIFT)
    one, two = T.run(windows, pols, 0, 1), T.run(windows, pols, 0, 2)

    def rows(t: T.Table) -> list[tuple]:
        return [
            (r.trace, r.load, r.policy, {k: v for k, v in r.metrics.items() if k != "wall_s"})
            for r in t.results
        ]

    assert rows(one) == rows(two)
    assert [(r.trace, r.policy) for r in two.results] == [
        (w.trace, p) for w in windows for p in pols
    ]
    assert one.goals == two.goals


def test_seeds_run_every_window_anew_and_count_the_goals_over_all(tmp_path, capsys):
    """`--seeds 0,1`: each seed's windows and goals, the goals CSV with its seed, and the failed
    goals counted over both; a seed that is not a number is a clear error, not a traceback."""
    pols = "easy,easy-sjf,2d-las,nightshift-notariff"
    assert T.main(["--tiny", "--seeds", "0,1", "--policies", pols, "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert (
        "#### Seed 0" in text and "#### Seed 1" in text and "Over seeds 0,1: goals failed" in text
    )
    with (tmp_path / "scheduler_goals.csv").open() as fh:
        goals = list(csv.DictReader(fh))
    assert [g["seed"] for g in goals] == ["0"] * len(T.TINY) + ["1"] * len(T.TINY)
    with (tmp_path / "scheduler_table.csv").open() as fh:
        assert {r["seed"] for r in csv.DictReader(fh)} == {"0", "1"}
    with pytest.raises(SystemExit) as exc:
        T.main(["--tiny", "--seeds", "one"])
    assert exc.value.code == 2 and "--seeds: whole numbers" in capsys.readouterr().err


def test_an_ablation_named_in_judge_is_judged_beside_the_default(tmp_path, capsys):
    """`--judge nightshift-notariff,nightshift-nomove`: both get goals rows per window (the
    migration's with-and-without comparison in docs/benchmarks.md comes from this); an unknown
    name is a clear error."""
    pols = "easy,easy-sjf,nightshift-notariff,nightshift-nomove"
    judge = "nightshift-notariff,nightshift-nomove"
    args = ["--tiny", "--policies", pols, "--judge", judge, "--out", str(tmp_path)]
    assert T.main(args) == 0
    with (tmp_path / "scheduler_goals.csv").open() as fh:
        goals = list(csv.DictReader(fh))
    assert [g["policy"] for g in goals] == judge.split(",") * len(T.TINY)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        T.main(["--tiny", "--judge", "nightshift-nope"])
    assert exc.value.code == 2 and "--judge: unknown nightshift-nope" in capsys.readouterr().err


def test_held_out_windows_are_none_of_the_tuned_ones_and_run_with_their_own_seeds(
    tmp_path, monkeypatch, capsys
):
    """`--held-out` runs HELD_OUT with seeds 10-12 (or the seeds given): no window of it is one
    the goals table reports, each trace and load is there once (rows are keyed by both), and a
    window's own host size reaches the cluster (the 4-GPU Philly window has 4-GPU hosts)."""
    tuned = {(w.trace, w.days, w.load, w.gpus_per_host) for w in T.WINDOWS}
    assert not tuned & {(w.trace, w.days, w.load, w.gpus_per_host) for w in T.HELD_OUT}
    keys = [(w.trace, w.load) for w in T.HELD_OUT]
    assert len(keys) == len(set(keys))
    calls: list[tuple] = []

    def run(windows, pols, seed, *args, **kw):  # the windows and seed asked for, run on nothing
        calls.append((windows, seed))
        return T.Table([], [], [], 0.0, 1, T.datetime.now(T.UTC))

    monkeypatch.setattr(T, "run", run)
    monkeypatch.setattr(T, "write_csv", lambda path, rows: None)  # no rows to write
    assert T.main(["--held-out", "--out", str(tmp_path)]) == 0
    assert calls == [(T.HELD_OUT, s) for s in (10, 11, 12)]
    calls.clear()
    assert T.main(["--held-out", "--seeds", "13", "--out", str(tmp_path)]) == 0
    assert calls == [(T.HELD_OUT, 13)]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        T.main(["--held-out", "--tiny"])
    assert exc.value.code == 2 and "one set of windows" in capsys.readouterr().err
    four = next(w for w in T.HELD_OUT if w.gpus_per_host)
    (setup,) = S.make_setups(
        [four.trace], [four.load], {four.trace: 0.05}, four.gpus_per_host, S.Options(seed=10)
    )
    assert set(setup.hosts) == {4}
