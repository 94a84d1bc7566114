"""tune_lr on real curves: metrics files written by examples/train_numpy.py at several learning
rates, one resumed with a much larger lr, one with an injected NaN, and an LR range test (see
tests/fixtures/curves/README.md for the command behind each). Also the example's range-test mode,
the skill's other inputs (synthetic edge cases, a job's recorded metrics) and `nightshift tune-lr`."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from sqlmodel import select

from nightshift.runtime.config import Settings
from nightshift.runtime.errors import BadArguments, SkillFailed
from nightshift.runtime.store.db import (
    Attempt,
    AuditEvent,
    CheckpointRecord,
    Job,
    MetricPoint,
    Store,
)
from nightshift.skills.base import SkillContext
from nightshift.skills.registry import get_skill
from nightshift.skills.tune_lr import TuneLrResult, read_metrics_jsonl, tune_lr

from conftest import REPO, empty_store, nightshift, run_skill

CURVES = REPO / "tests" / "fixtures" / "curves"
TRAIN = REPO / "examples" / "train_numpy.py"
EVERY_25 = list(range(25, 301, 25))


@pytest.fixture
def ctx(tmp_path) -> SkillContext:
    return SkillContext(
        store=empty_store(tmp_path / "s.db"),
        settings=Settings(home=str(tmp_path)),
        now=datetime(2026, 12, 2, 3, 0),
    )


def curve(name: str) -> list[dict]:
    points, skipped = read_metrics_jsonl(CURVES / name)
    assert skipped == 0
    return points


def decide(ctx, name: str, **kw) -> TuneLrResult:
    return run_skill(tune_lr, ctx, {"points": curve(name), "knob": "lr", **kw})


def smoothed_tail(points: list[dict], n: int = 20) -> float:
    return sum(p["loss"] for p in points[-n:]) / n


# --- the fixtures are what the example really produces -------------------------------------------
def _load_make_curves():
    spec = importlib.util.spec_from_file_location("make_curves", CURVES / "make_curves.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fixture_curves_regenerate_from_the_example(ctx, tmp_path):
    """make_curves.py re-runs the example: the stored curve is its output and gets the same decision."""
    make_curves = _load_make_curves()
    assert set(make_curves.CURVES) == {p.name for p in CURVES.glob("*.jsonl")}
    make_curves.make("lr0.01.jsonl", make_curves.CURVES["lr0.01.jsonl"], tmp_path)
    fresh, _ = read_metrics_jsonl(tmp_path / "lr0.01.jsonl")
    stored = curve("lr0.01.jsonl")
    assert [p["step"] for p in fresh] == [p["step"] for p in stored] == list(range(1, 301))
    for a, b in zip(fresh[:50], stored[:50], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    again = run_skill(tune_lr, ctx, {"points": fresh, "knob": "lr"})
    assert again.decision == decide(ctx, "lr0.01.jsonl").decision == "no_change"


def test_no_learning_rate_made_the_example_produce_nan(ctx):
    """Checked: Adam's bounded steps and a stable log-softmax keep every loss finite, even at lr 5;
    the NaN curve comes from the example's fault injection."""
    for name in ("lr0.3.jsonl", "lr1.0.jsonl", "lr5.0.jsonl"):
        assert all(p["loss"] is not None for p in curve(name))
    assert curve("lr0.01_nan_at_180.jsonl")[-1] == {"step": 180, "loss": None, "lr": 0.01}


# --- decisions on the real curves ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["lr0.001.jsonl", "lr0.01.jsonl"])
def test_healthy_runs_get_no_change(ctx, name):
    """A run still improving at a sane lr: no divergence, no plateau, nothing proposed."""
    r = decide(ctx, name, checkpoint_steps=EVERY_25)
    assert r.decision == "no_change" and r.new_lr is None and r.changes == {}
    assert r.reasoning[0].startswith("no divergence") and r.reasoning[1].startswith("no plateau")
    assert r.points_used == 300


def test_a_run_that_diverges_midway_resumes_before_it_with_the_healthy_lr(ctx):
    """lr 0.01 for 100 steps, then resumed at lr 1.0: the loss explodes at step 102. Resume from the
    checkpoint of step 100 (measured healthy by step 101) at 0.01, the lr of the last good stretch."""
    r = decide(ctx, "lr0.01_then_lr1.0_from_100.jsonl", checkpoint_steps=EVERY_25)
    assert r.decision == "lower_lr_and_resume" and r.analysis == "divergence"
    assert r.divergence_step == 102 and r.detected_at_step == 103
    assert r.resume_from_step == 100
    assert r.current_lr == 1.0 and r.new_lr == 0.01 and r.changes == {"lr": 0.01}
    notes = {e.step: e.note for e in r.evidence}
    assert notes[102] == "divergence began" and notes[103] == "divergence detected"
    assert any("125, 150" in line and "diverging weights" in line for line in r.reasoning)


def test_a_nan_loss_resumes_from_the_last_checkpoint_it_did_not_touch(ctx):
    """The loss of step 180 is NaN: the checkpoint of step 175 was measured by step 176, still finite."""
    r = decide(ctx, "lr0.01_nan_at_180.jsonl", checkpoint_steps=[25, 50, 75, 100, 125, 150, 175])
    assert r.decision == "lower_lr_and_resume"
    assert r.divergence_step == 180 and r.resume_from_step == 175
    assert r.new_lr == 0.005 and r.changes == {"lr": 0.005}
    assert "not finite" in r.reasoning[0]


def test_a_checkpoint_right_before_the_bad_step_is_not_trusted(ctx):
    """A checkpoint of step 179 holds the weights whose loss (step 180) was NaN: go one further back."""
    r = decide(ctx, "lr0.01_nan_at_180.jsonl", checkpoint_steps=[150, 178, 179])
    assert r.resume_from_step == 178


@pytest.mark.parametrize(
    ("name", "lr", "began"),
    [("lr0.3.jsonl", 0.3, 4), ("lr1.0.jsonl", 1.0, 2), ("lr5.0.jsonl", 5.0, 2)],
)
def test_runs_that_diverge_at_once_start_over_at_a_lower_lr(ctx, name, lr, began):
    """Diverging within the first steps: no checkpoint precedes it; halve the lr, suggest a range test."""
    r = decide(ctx, name, checkpoint_steps=EVERY_25)
    assert r.decision == "lower_lr_and_resume"
    assert r.divergence_step == began and r.resume_from_step is None
    assert r.new_lr == pytest.approx(lr * 0.5)
    assert any("start again from the beginning" in line for line in r.reasoning)
    assert any("LR range test" in line for line in r.reasoning)


def test_a_plateau_at_too_high_an_lr_is_reduced(ctx):
    """At lr 0.1 the smoothed loss has not improved by 1% since step 214 (86 points): reduce ×0.1."""
    r = decide(ctx, "lr0.1.jsonl")
    assert r.decision == "reduce_lr" and r.analysis == "plateau"
    assert r.current_lr == 0.1 and r.new_lr == 0.01 and r.changes == {"lr": 0.01}
    assert r.resume_from_step is None  # continue from the current weights
    assert [e.note for e in r.evidence] == ["best smoothed loss", "latest point"]
    assert r.evidence[0].step == 214 and r.evidence[1].step == 300


def test_a_long_run_at_a_small_lr_plateaus_late(ctx):
    """The default lr run to 600 steps: healthy at 300 (the same points as lr0.01.jsonl), but its
    smoothed loss last gained 1% at step 535, so at 600 the proposal is to reduce to 0.001."""
    long = curve("lr0.01_600.jsonl")
    assert long[:300] == curve("lr0.01.jsonl")
    assert run_skill(tune_lr, ctx, {"points": long[:300]}).decision == "no_change"
    r = decide(ctx, "lr0.01_600.jsonl")
    assert r.decision == "reduce_lr" and r.new_lr == 0.001 and r.changes == {"lr": 0.001}
    assert r.evidence[0].step == 535 and r.evidence[1].step == 600


def test_the_reduction_applied_for_real_helps_and_then_no_change(ctx):
    """The same run resumed from step 300 at the proposed 0.01: the loss falls well below the plateau,
    and tune_lr then proposes nothing (the lr jump restarts the plateau count)."""
    plateau = decide(ctx, "lr0.1.jsonl")
    after = curve("lr0.1_then_lr0.01_from_300.jsonl")
    assert [p["lr"] for p in after[300:]] == [plateau.new_lr] * 200
    assert smoothed_tail(after) < plateau.evidence[0].smoothed / 5
    r = decide(ctx, "lr0.1_then_lr0.01_from_300.jsonl")
    assert r.decision == "no_change"
    assert any("starts at step 301" in line for line in r.reasoning)


def test_warm_restart_when_configured(ctx):
    """plateau_action=warm_restart goes back to restart_lr; without a higher lr to go to, no change."""
    r = decide(ctx, "lr0.1.jsonl", plateau_action="warm_restart", restart_lr=0.3)
    assert r.decision == "warm_restart" and r.new_lr == 0.3 and r.changes == {"lr": 0.3}
    flat = decide(ctx, "lr0.1.jsonl", plateau_action="warm_restart")
    assert flat.decision == "no_change" and any("restart_lr" in line for line in flat.reasoning)


def test_min_lr_floors_the_reduction(ctx):
    """A reduction never goes below min_lr; at the floor already, nothing is proposed."""
    assert decide(ctx, "lr0.1.jsonl", min_lr=0.05).new_lr == 0.05
    at_floor = decide(ctx, "lr0.1.jsonl", min_lr=0.1)
    assert at_floor.decision == "no_change" and "already at min_lr" in at_floor.reasoning[-1]


def test_range_test_suggests_a_sensible_lr(ctx):
    """The sweep from 1e-5 to 10: steepest descent of the smoothed loss at ~0.014, below the bound
    (lr at the minimum / 10 ≈ 0.019), between the slow 0.001 and the plateauing 0.1 runs."""
    r = decide(ctx, "range_test_1e-5_to_10.jsonl")
    assert r.decision == "suggest_lr" and r.analysis == "range_test"
    assert 0.003 <= r.suggested_lr <= 0.05
    assert r.suggested_lr <= r.lr_at_min_loss / 10
    assert r.suggested_lr == r.steepest_lr == r.new_lr and r.changes == {"lr": r.suggested_lr}
    assert r.current_lr is None  # the top of the sweep is not the run's learning rate
    assert r.reasoning[0].startswith("the learning rate rises geometrically")
    assert any("exceeds 4× its minimum" in line for line in r.reasoning)
    assert [e.note for e in r.evidence] == [
        "steepest descent",
        "minimum of the smoothed loss",
        "the curve stops here",
    ]


def test_range_test_bound_applies_when_the_steepest_point_is_too_high(ctx):
    """If the loss only falls near the top of the sweep, the steepest descent lies above
    lr_at_min/10 and the bound is the suggestion."""
    lrs = [1e-4 * 10 ** (4 * i / 99) for i in range(100)]
    points = [
        {"step": i + 1, "lr": lr, "loss": 2.0 if lr < 0.05 else 2.0 - math.log10(lr / 0.05)}
        for i, lr in enumerate(lrs)
    ]
    r = run_skill(tune_lr, ctx, {"points": points})
    assert r.decision == "suggest_lr" and r.steepest_lr > r.lr_at_min_loss / 10
    assert r.suggested_lr == pytest.approx(r.lr_at_min_loss / 10, rel=1e-3)
    assert any("the bound, since the steepest descent lies above it" in x for x in r.reasoning)


def test_explicit_modes_only_run_their_own_check(ctx):
    """mode=divergence ignores a plateau; mode=range_test refuses a constant-lr history."""
    assert decide(ctx, "lr0.1.jsonl", mode="divergence").decision == "no_change"
    assert decide(ctx, "lr0.1.jsonl", mode="plateau").decision == "reduce_lr"
    flat = decide(ctx, "lr0.01.jsonl", mode="range_test")
    assert flat.decision == "no_change" and "does not rise" in flat.reasoning[-1]


def test_same_input_same_output(ctx):
    """Deterministic: no clock, no randomness."""
    a = decide(ctx, "lr0.01_then_lr1.0_from_100.jsonl", checkpoint_steps=EVERY_25)
    b = decide(ctx, "lr0.01_then_lr1.0_from_100.jsonl", checkpoint_steps=EVERY_25)
    assert a.model_dump() == b.model_dump()


# --- synthetic edge cases -----------------------------------------------------------------------
def _pts(losses, lr=0.1, grads=None):
    return [
        {"step": i + 1, "loss": v, "lr": lr, **({"grad_norm": grads[i]} if grads else {})}
        for i, v in enumerate(losses)
    ]


def test_grad_norm_explosion_is_a_divergence(ctx):
    """A grad norm 10× its running minimum (smoothed) diverges before the loss shows it."""
    grads = [1.0] * 30 + [50.0] * 5
    r = run_skill(
        tune_lr,
        ctx,
        {
            "points": _pts([1.0 - i * 0.01 for i in range(35)], grads=grads),
            "checkpoint_steps": [10, 20, 30],
        },
    )
    assert r.decision == "lower_lr_and_resume" and r.divergence_step == 31
    assert r.resume_from_step == 20 and "grad norm" in r.reasoning[0]
    nan = run_skill(tune_lr, ctx, {"points": _pts([1.0] * 10, grads=[1.0] * 9 + [math.nan])})
    assert nan.divergence_step == 10 and "grad norm is not finite" in nan.reasoning[0]


def test_a_resumed_history_replaces_the_steps_it_redoes(ctx):
    """Steps that go back (a resumed run in the same file) replace the diverged ones."""
    points = _pts([2.0 - i * 0.05 for i in range(15)])
    points[10:] = [{**p, "loss": None} for p in points[10:]]  # diverged at step 11...
    points += _pts([2.0 - i * 0.05 for i in range(20)])[10:]  # ...resumed from step 10
    r = run_skill(tune_lr, ctx, {"points": points})
    assert r.decision == "no_change" and r.points_used == 20
    assert r.reasoning[0].startswith("5 logged point(s) were replaced")


def test_without_checkpoints_or_lr_the_proposal_says_what_to_do(ctx):
    """No checkpoint list and no lr logged: the step bound and the factor are still stated."""
    pts = [{"step": i, "loss": 1.0} for i in range(1, 40)] + [{"step": 40, "loss": None}]
    r = run_skill(tune_lr, ctx, {"points": pts})
    assert r.decision == "lower_lr_and_resume" and r.new_lr is None and r.changes == {}
    assert any("at step 38 or earlier" in line for line in r.reasoning)
    assert any("factor 0.5" in line for line in r.reasoning)


def test_bad_arguments_are_refused(ctx):
    """Exactly one history source; parameters within their ranges."""
    with pytest.raises(BadArguments):
        run_skill(tune_lr, ctx, {})
    with pytest.raises(BadArguments):
        run_skill(tune_lr, ctx, {"points": [], "job_id": 1})
    with pytest.raises(BadArguments):
        run_skill(tune_lr, ctx, {"points": [], "factor": 2})
    assert run_skill(tune_lr, ctx, {"points": []}).reasoning == [
        "the history has no points: nothing to decide"
    ]


def test_the_skill_is_a_registered_read_skill():
    """Registered as a built-in with capability read: it proposes, never applies."""
    s = get_skill("tune_lr")
    assert s.capability == "read"
    assert set(s.tool_schema()["function"]["parameters"]["properties"]) >= {
        "mode",
        "points",
        "job_id",
        "current_lr",
        "checkpoint_steps",
        "knob",
        "window",
        "k",
        "factor",
        "patience",
        "min_delta",
        "plateau_action",
        "min_lr",
    }


# --- a job's recorded metrics -------------------------------------------------------------------
def _record(store: Store, job_id: int, number: int, points: list[dict]) -> None:
    with store.session() as s:
        att = Attempt(job_id=job_id, number=number, start_step=points[0]["step"] - 1)
        s.add(att)
        s.commit()
        s.refresh(att)
        for p in points:
            for name in ("loss", "lr"):
                s.add(
                    MetricPoint(
                        attempt_id=att.id, job_id=job_id, step=p["step"], name=name, value=p[name]
                    )
                )
        s.commit()


def test_job_history_from_the_store(ctx):
    """With job_id: the spec's lr knob, the job's lr, its recorded checkpoints and metrics; a later
    attempt that resumed from step 100 replaces the diverged steps of the first."""
    with ctx.store.session() as s:
        job = Job(
            name="quickstart",
            spec={"knobs": {"learning_rate": "lr"}, "metrics": {"name": "loss"}},
            params={"lr": 1.0},
        )
        s.add(job)
        s.commit()
        s.refresh(job)
        job_id = job.id
        for step in (50, 75, 100, 125):
            s.add(CheckpointRecord(job_id=job_id, step=step, path=f"ck/step_{step:08d}.npz"))
        s.add(CheckpointRecord(job_id=job_id, step=110, path="ck/bad.npz", valid=False))
        s.commit()
    _record(ctx.store, job_id, 1, curve("lr0.01_then_lr1.0_from_100.jsonl"))
    r = run_skill(tune_lr, ctx, {"job_id": job_id})
    assert r.decision == "lower_lr_and_resume" and r.resume_from_step == 100
    assert r.current_lr == 1.0 and r.changes == {"lr": 0.01}
    # The example is deterministic: resumed from step 100 at lr 0.01 it logs lr0.01.jsonl's steps.
    _record(ctx.store, job_id, 2, curve("lr0.01.jsonl")[100:150])
    again = run_skill(tune_lr, ctx, {"job_id": job_id, "current_lr": 0.01})
    assert again.decision == "no_change" and again.points_used == 150
    with pytest.raises(SkillFailed):
        run_skill(tune_lr, ctx, {"job_id": 999})


# --- reading metrics files ----------------------------------------------------------------------
def test_reading_a_metrics_file(tmp_path):
    """Event lines are not steps, a torn line is counted and skipped, NaN becomes None."""
    f = tmp_path / "m.jsonl"
    f.write_text(
        '{"step": 1, "loss": 2.3, "lr": 0.01}\n{"step": 2, "loss": NaN, "lr": 0.01}\n'
        '{"event": "done", "step": 2, "loss": 1.0}\n{"step": 3, "lo\n'
        '{"step": 3, "eval_loss": 0.5}\n\n{"step": 4, "loss": 1.5, "grad_norm": 3}\n'
    )
    points, skipped = read_metrics_jsonl(f)
    assert points == [
        {"step": 1, "loss": 2.3, "lr": 0.01},
        {"step": 2, "loss": None, "lr": 0.01},
        {"step": 4, "loss": 1.5, "grad_norm": 3.0},
    ]
    assert skipped == 2
    assert read_metrics_jsonl(f, loss_name="eval_loss")[0] == [{"step": 3, "loss": 0.5}]


# --- the example's LR range test mode ------------------------------------------------------------
def _example(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_FAULT_")}
    return subprocess.run(
        [sys.executable, str(TRAIN), *args],
        cwd=tmp_path,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_example_range_test_sweeps_the_lr_geometrically(tmp_path):
    """--lr-range-test START END: step 1 at START, the last at END, a constant ratio between, one
    line per step, and no checkpoints (the weights at the top of the sweep are of no use)."""
    proc = _example(
        tmp_path,
        "--steps",
        "21",
        "--lr-range-test",
        "1e-4",
        "1",
        "--checkpoint-dir",
        "ck",
        "--metrics-file",
        "m.jsonl",
    )
    assert proc.returncode == 0, proc.stderr
    args = json.loads(proc.stdout.splitlines()[0].removeprefix("nightshift-args: "))
    assert args["lr_range_test"] == [1e-4, 1.0]
    assert "no checkpoints are written" in proc.stdout and not (tmp_path / "ck").exists()
    lines = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in lines if "event" not in r]
    assert len(lrs) == 21 and lrs[0] == pytest.approx(1e-4) and lrs[-1] == pytest.approx(1.0)
    ratios = [b / a for a, b in zip(lrs, lrs[1:], strict=False)]
    assert max(ratios) == pytest.approx(min(ratios)) == pytest.approx(10**0.2)
    assert lines[-1]["event"] == "done"


def test_example_range_test_refuses_bad_arguments(tmp_path):
    """START must be below END, and a range test starts from fresh weights (no --resume)."""
    assert _example(tmp_path, "--lr-range-test", "1", "0.1").returncode == 2
    bad = _example(tmp_path, "--lr-range-test", "1e-4", "1", "--resume", "x.npz")
    assert bad.returncode == 2 and "--resume" in bad.stderr


# --- `nightshift tune-lr METRICS.jsonl` ------------------------------------------------------------
def test_cli_json_matches_the_skill(home, ctx):
    """The command reads the file into points and asks the skill through the gate (audited)."""
    name = "lr0.01_then_lr1.0_from_100.jsonl"
    proc = nightshift(
        "tune-lr",
        str(CURVES / name),
        "--knob",
        "lr",
        "--json",
        *[a for step in EVERY_25 for a in ("--checkpoint", str(step))],
    )
    assert proc.returncode == 0, proc.stderr
    got = TuneLrResult.model_validate_json(proc.stdout)
    assert got == decide(ctx, name, checkpoint_steps=EVERY_25)
    with Store(f"sqlite:///{home / 'nightshift.db'}").session() as s:
        starts = s.exec(
            select(AuditEvent).where(
                AuditEvent.skill == "tune_lr", AuditEvent.action == "skill.start"
            )
        ).all()
    assert len(starts) == 1 and starts[0].call_id.startswith("cli-")


def test_cli_prints_the_decision_for_a_person(home):
    """Plain output: decision first, the lr change, where to resume, the reasoning, the changes."""
    proc = nightshift(
        "tune-lr",
        str(CURVES / "lr0.01_then_lr1.0_from_100.jsonl"),
        "--knob",
        "lr",
        "--checkpoint",
        "100",
        "--checkpoint",
        "125",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "lower_lr_and_resume  (analysis: divergence, 300 points)"
    assert lines[1] == "learning rate: 1 → 0.01"
    assert lines[2] == (
        "divergence: began at step 102, detected at step 103; resume from the "
        "checkpoint of step 100"
    )
    assert "changes: lr = 0.01  (apply with resume_job: param_changes)" in lines


def test_cli_modes_and_extra_parameters(home):
    """--mode and --arg key=value reach the skill: a range test, and a configured warm restart."""
    rt = nightshift("tune-lr", str(CURVES / "range_test_1e-5_to_10.jsonl"), "--json")
    assert TuneLrResult.model_validate_json(rt.stdout).decision == "suggest_lr"
    wr = nightshift(
        "tune-lr",
        str(CURVES / "lr0.1.jsonl"),
        "--mode",
        "plateau",
        "--arg",
        "plateau_action=warm_restart",
        "--arg",
        "restart_lr=0.3",
        "--json",
    )
    assert wr.returncode == 0, wr.stderr
    assert TuneLrResult.model_validate_json(wr.stdout).decision == "warm_restart"


def test_cli_bad_input_exits_2(home, tmp_path):
    """A missing file, an unknown mode, or a bad parameter is an error of the invocation: exit 2."""
    missing = tmp_path / "none.jsonl"
    proc = nightshift("tune-lr", str(missing))
    assert proc.returncode == 2 and str(missing) in proc.stderr
    proc = nightshift("tune-lr", str(CURVES / "lr0.1.jsonl"), "--mode", "sideways")
    assert proc.returncode == 2 and "--mode" in proc.stderr
    proc = nightshift("tune-lr", str(CURVES / "lr0.1.jsonl"), "--arg", "factor=3")
    assert proc.returncode == 2 and "factor" in proc.stderr
