"""The agent trajectory evals in their CI size (`--quick`): the small subset passes for both
planners with real training runs, the runner does fail a case whose expectations are not met, and
the full case set keeps covering every skill, playbook and way of answering an approval."""

from __future__ import annotations

import csv

import pytest

from nightshift.evals import trajectories as T
from nightshift.skills.registry import registry


@pytest.mark.slow
def test_quick_subset_passes_for_both_planners(tmp_path):
    """`--quick` runs end to end for both planners and every case either passes or is n/a."""
    out = tmp_path / "trajectories.csv"
    rc = T.main(["--quick", "--planner", "all", "--csv", str(out)])
    with out.open() as f:
        rows = list(csv.DictReader(f))
    bad = [
        (r["planner"], r["case"], r["failures"]) for r in rows if r["status"] not in ("pass", "n/a")
    ]
    assert rc == 0 and not bad, bad
    assert {r["planner"] for r in rows} == {"deterministic", "scripted"}
    assert len(rows) == 2 * len(T.load_cases(quick=True))
    for r in rows:
        if r["status"] == "n/a":
            assert r["planner"] == "deterministic", r  # chat text only
        elif r["planner"] == "deterministic":
            assert r["model_calls"] == "0" and r["tokens"] == "0", r
        else:
            assert int(r["model_calls"]) > int(r["calls"]) > 0 and int(r["tokens"]) > 0, r


@pytest.mark.slow
@pytest.mark.parametrize("planner", T.PLANNERS)
def test_a_wrong_expectation_fails_the_case(planner):
    """Expectations the run cannot meet make the case fail, each named in the failures."""
    case = T.load_cases("health-critical")[0]
    wrong = case.model_copy(
        update={
            "expect": T.Expect.model_validate(
                {
                    "calls": ["gpu_health_check", "submit_job"],
                    "forbidden": ["gpu_health_check"],
                    "end": {
                        "finish": "failed",
                        "job_count": 1,
                        "results": {"gpu_health_check": {"overall": "OK"}},
                    },
                }
            )
        }
    )
    result = T.run_case(wrong, T.FACTORIES[planner])
    assert not result.passed and result.status == "FAIL"
    text = "\n".join(result.failures)
    for missed in (
        "calls: expected",
        "forbidden: gpu_health_check",
        "expected finish failed",
        "expected 1 job(s)",
        "overall is 'CRITICAL', expected 'OK'",
    ):
        assert missed in text, text
    assert T.run_case(case, T.FACTORIES[planner]).passed  # the case as written passes


def test_cases_cover_every_skill_playbook_and_approval_answer():
    """Every registered skill is expected in some case, every playbook is a goal, approvals are
    answered every way, and there are at least 30 cases."""
    cases = T.load_cases()
    assert len(cases) >= 30
    expected = set()
    for c in cases:
        for exp in [c.expect, *(c.expect_for(p) for p in c.expect_by_planner)]:
            expected |= {x.partition(":")[0] for x in exp.calls + exp.calls_unordered}
    assert set(registry()) <= expected, set(registry()) - expected
    assert {(c.goal or {}).get("goal") for c in cases} >= set(T.PLAYBOOKS)
    answers = set()
    for c in cases:
        a = c.world.approvals
        answers |= {x.partition(":")[0] for x in ([a] if isinstance(a, str) else a)}
    assert answers >= {"approve", "reject", "requester", "expire", "none"}
    assert {c.category for c in cases} == set(T.CATEGORIES)
    assert {c.name for c in T.load_cases(quick=True)} >= {"train-clean", "cancel-running-approved"}


def test_chat_case_is_not_applicable_to_the_deterministic_planner():
    """Chat text is n/a for the deterministic planner: neither a pass nor a failure it could fix."""
    result = T.run_case(T.load_cases("chat-health-question")[0], T.FACTORIES["deterministic"])
    assert result.status == "n/a" and result.ok and "chat" in (result.not_applicable or "")


def test_a_misspelt_case_key_is_refused_when_loading(tmp_path):
    """A typo in a case file is an error at load time, never a check that silently passes."""
    (tmp_path / "bad.yaml").write_text(
        "- name: typo\n  category: skill\n  goal: {goal: health}\n  expect: {call: [gpu_health_check]}\n"
    )
    with pytest.raises(ValueError, match="call"):
        T.load_cases(folder=tmp_path)
