"""A quarantined GPU comes back after health.recover_after_checks consecutive healthy checks, not on
the first OK; the return is in the check's result, which the gate records in the audit."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nightshift.runtime.config import Settings
from nightshift.runtime.gpu.gpu import GpuReading, ProbeResult
from nightshift.runtime.scheduling.snapshot import _back_by, load_snapshot
from nightshift.skills.base import SkillContext
from nightshift.skills.gpu_health import gpu_health_check

from conftest import empty_store, run_skill

NOW = datetime(2026, 12, 2, 3, 0)


class Probe:
    name = "static"

    def __init__(self, temperature: float = 50.0):
        self.temperature = temperature

    def read(self) -> ProbeResult:
        g = GpuReading(
            index=0,
            uuid="GPU-0",
            name="GPU",
            temperature_c=self.temperature,
            memory_total_mib=81559,
            memory_used_mib=1000,
            utilization_pct=10.0,
        )
        return ProbeResult(backend="static", gpus=[g])


def make_ctx(tmp_path: Path, **health: Any) -> SkillContext:
    return SkillContext(
        store=empty_store(tmp_path / "s.db"),
        settings=Settings(home=str(tmp_path), health=health),
        now=NOW,
        probe=Probe(),
    )


def check(ctx: SkillContext, temperature: float, hours: int):
    ctx.probe = Probe(temperature)
    ctx.now = NOW + timedelta(hours=hours)
    return run_skill(gpu_health_check, ctx, {})


def slot(ctx: SkillContext) -> str:
    [g] = load_snapshot(ctx.store, ctx.now).gpus
    return g.verdict


def test_default_is_three_healthy_checks_in_a_row(tmp_path):
    ctx = make_ctx(tmp_path)
    assert ctx.settings.health.recover_after_checks == 3
    assert check(ctx, 95.0, 0).overall == "CRITICAL" and slot(ctx) == "CRITICAL"
    first = check(ctx, 50.0, 1)
    # The check itself says OK, but placement keeps the GPU out (recorded UNKNOWN, held).
    [v] = first.gpus
    assert v.verdict == "OK" and v.quarantine is not None
    assert (v.quarantine.healthy_checks, v.quarantine.needed, v.quarantine.released) == (
        1,
        3,
        False,
    )
    assert "still quarantined: 1 of 3" in first.message and first.recovered == []
    assert slot(ctx) == "UNKNOWN"
    assert check(ctx, 50.0, 2).gpus[0].quarantine.healthy_checks == 2  # type: ignore[union-attr]
    assert slot(ctx) == "UNKNOWN"
    third = check(ctx, 50.0, 3)
    assert third.recovered == ["GPU 0"] and third.gpus[0].quarantine.released  # type: ignore[union-attr]
    assert "back in placement after 3 consecutive healthy check(s): GPU 0" in third.message
    assert slot(ctx) == "OK"
    assert check(ctx, 50.0, 4).gpus[0].quarantine is None  # out of quarantine: nothing to hold


def test_a_bad_check_starts_the_count_again(tmp_path):
    ctx = make_ctx(tmp_path)
    check(ctx, 95.0, 0)
    check(ctx, 50.0, 1)
    check(ctx, 50.0, 2)
    assert check(ctx, 95.0, 3).overall == "CRITICAL" and slot(ctx) == "CRITICAL"
    again = check(ctx, 50.0, 4)
    assert again.gpus[0].quarantine.healthy_checks == 1  # type: ignore[union-attr]
    assert "since CRITICAL at 2026-12-02 06:00" in again.message
    assert slot(ctx) == "UNKNOWN"


def test_placement_expects_a_gpu_passing_its_checks_back_after_the_rest_of_them(tmp_path):
    """A failing GPU has no expected return; one that passed 1 of its 3 healthy checks is back
    after 2 more at the health interval (placement counts it busy until then: `back_by`); a
    bad check takes the expectation away again; once released it is simply healthy."""

    def back_by():
        [g] = load_snapshot(ctx.store, ctx.now, recovery_interval_s=3600).gpus
        return g.back_by

    ctx = make_ctx(tmp_path)
    check(ctx, 95.0, 0)
    assert back_by() is None
    check(ctx, 50.0, 1)
    assert back_by() == NOW + timedelta(hours=1 + 2)
    check(ctx, 50.0, 2)
    assert back_by() == NOW + timedelta(hours=2 + 1)
    assert load_snapshot(ctx.store, ctx.now).gpus[0].back_by is None  # no interval: no guess
    check(ctx, 95.0, 3)
    assert back_by() is None
    for h in (4, 5, 6):
        check(ctx, 50.0, h)
    [g] = load_snapshot(ctx.store, ctx.now, recovery_interval_s=3600).gpus
    assert g.verdict == "OK" and g.back_by is None


@pytest.mark.parametrize(
    "data",
    [None, [], {"held": "3 of 3"}, {"held": {"needed": "x", "healthy_checks": 1}}, {"held": {}}],
)
def test_a_held_record_that_is_not_ours_means_no_expected_return(data):
    """A row another version (or a hand) wrote: no guess, and no error for the daemon's loop."""
    assert _back_by("UNKNOWN", data, NOW, 600.0) is None


def test_one_check_setting_restores_the_old_behaviour(tmp_path):
    ctx = make_ctx(tmp_path, recover_after_checks=1)
    check(ctx, 95.0, 0)
    out = check(ctx, 50.0, 1)
    assert out.recovered == ["GPU 0"] and slot(ctx) == "OK"


def test_a_warning_counts_as_healthy(tmp_path):
    """WARNING GPUs are placed; a quarantined GPU whose checks say WARNING comes back too."""
    ctx = make_ctx(tmp_path, recover_after_checks=2)
    check(ctx, 95.0, 0)
    check(ctx, 85.0, 1)
    assert check(ctx, 85.0, 2).recovered == ["GPU 0"] and slot(ctx) == "WARNING"


def test_the_return_is_in_the_audit(home):
    """Through the policy gate, the check's result (with `recovered`) is the audit's skill.result."""
    from sqlmodel import select

    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.store.db import AuditEvent

    (home / "config.yaml").write_text("health:\n  recover_after_checks: 2\n")
    w = Wiring.load()
    results = []
    for hour, temperature in enumerate([95.0, 50.0, 50.0]):
        ctx = w.context("agent", f"health-{hour}")
        ctx.probe, ctx.now = Probe(temperature), NOW + timedelta(hours=hour)
        results.append(w.gate.call(ctx, "gpu_health_check", {}))
    assert [r.overall for r in results] == ["CRITICAL", "OK", "OK"]  # type: ignore[attr-defined]
    assert results[-1].recovered == ["GPU 0"]  # type: ignore[attr-defined]
    with w.store.session() as s:
        events = list(
            s.exec(
                select(AuditEvent)
                .where(AuditEvent.action == "skill.result", AuditEvent.skill == "gpu_health_check")
                .order_by(AuditEvent.id)
            )
        )
    assert [e.payload["result"]["recovered"] for e in events] == [[], [], ["GPU 0"]]


# ------------------------------------------------------------------ dcgmi diag, where installed
def _with_dcgmi(monkeypatch, tmp_path: Path, fixture: str, **kw: Any) -> Path:
    import fake_dcgmi

    folder = tmp_path / "dcgm-bin"
    fake_dcgmi.install(folder, fixture, **kw)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ.get('PATH', '')}")
    return folder


def test_where_dcgm_is_installed_the_diag_must_pass_too(tmp_path, monkeypatch):
    """Why: a GPU that reads healthy three times may still fail DCGM's deployment checks. Where
    dcgmi is on PATH it runs `dcgmi diag -r 1 -i INDEX` at the last healthy check needed; its
    pass releases the GPU, with the parsed table and the output kept as evidence."""
    import fake_dcgmi

    folder = _with_dcgmi(monkeypatch, tmp_path, "diag_r1_pass.txt")
    ctx = make_ctx(tmp_path, recover_after_checks=2)
    check(ctx, 95.0, 0)
    first = check(ctx, 50.0, 1)
    assert first.gpus[0].quarantine.diag is None and fake_dcgmi.calls(folder) == []  # type: ignore[union-attr]
    second = check(ctx, 50.0, 2)
    q = second.gpus[0].quarantine
    assert q is not None and q.released and second.recovered == ["GPU 0"]
    assert fake_dcgmi.calls(folder) == [["diag", "-r", "1", "-i", "0"]]
    assert (
        q.diag is not None and q.diag.passed and q.diag.argv[1:] == ["diag", "-r", "1", "-i", "0"]
    )
    assert len(q.diag.tests) == 11 and {t.result for t in q.diag.tests} == {"Pass"}
    assert "| Persistence Mode          | Pass" in q.diag.output
    assert "dcgmi diag -r 1 passed (11 test(s))" in second.gpus[0].summary
    assert slot(ctx) == "OK"


def test_a_failed_diag_keeps_the_gpu_out_and_starts_the_count_again(tmp_path, monkeypatch):
    """Why: the diag's Fail is the word that matters; the healthy checks count again from 0."""
    _with_dcgmi(monkeypatch, tmp_path, "diag_fail.txt", exit_code=226)
    ctx = make_ctx(tmp_path, recover_after_checks=2)
    check(ctx, 95.0, 0)
    check(ctx, 50.0, 1)
    failed = check(ctx, 50.0, 2)
    q = failed.gpus[0].quarantine
    assert q is not None and not q.released and failed.recovered == []
    assert q.diag is not None and not q.diag.passed and q.diag.failed == ["PCIe"]
    pcie = next(t for t in q.diag.tests if t.name == "PCIe")
    assert (pcie.section, pcie.result, pcie.scope) == ("Integration", "Fail", "All")
    assert "cudaDeviceGetByPCIBusId" in (pcie.detail or "") and "00000000:1B:00.0" in (
        pcie.detail or ""
    )
    assert [t.result for t in q.diag.tests if t.name == "GPU Memory"] == ["Skip"]
    assert "dcgmi diag -r 1 failed: PCIe" in failed.gpus[0].summary
    assert slot(ctx) == "UNKNOWN"
    again = check(ctx, 50.0, 3)
    assert again.gpus[0].quarantine.healthy_checks == 1  # type: ignore[union-attr]
    assert again.gpus[0].quarantine.diag is None  # type: ignore[union-attr]


def test_a_diag_that_cannot_be_read_is_tried_at_the_next_check(tmp_path, monkeypatch):
    """Why: a timeout (or a table with no test) is no pass, but says nothing of the GPU: the
    next healthy check runs the diag again rather than counting from 0."""
    import fake_dcgmi

    folder = _with_dcgmi(monkeypatch, tmp_path, "diag_r1_pass.txt", sleep_s=5)
    ctx = make_ctx(tmp_path, recover_after_checks=2, dcgm_diag_timeout_s=0.5)
    check(ctx, 95.0, 0)
    check(ctx, 50.0, 1)
    slow = check(ctx, 50.0, 2).gpus[0].quarantine
    assert slow is not None and not slow.released and slow.diag is not None
    assert "did not end within 0.5 s" in (slow.diag.error or "")
    fake_dcgmi.install(folder, "diag_r1_pass.txt")
    back = check(ctx, 50.0, 3)
    assert back.recovered == ["GPU 0"] and len(fake_dcgmi.calls(folder)) == 2


def test_dcgm_diag_off_and_the_old_deployment_table(tmp_path, monkeypatch):
    """Why: `health.dcgm_diag: off` keeps the healthy checks alone; and the older table (no
    Metadata, `Blacklist`, no per-GPU scope) is read the same way."""
    import fake_dcgmi

    from nightshift.runtime.gpu import dcgm

    folder = _with_dcgmi(monkeypatch, tmp_path, "diag_r1_fail_deployment.txt")
    ctx = make_ctx(tmp_path, recover_after_checks=1, dcgm_diag="off")
    check(ctx, 95.0, 0)
    assert check(ctx, 50.0, 1).recovered == ["GPU 0"] and fake_dcgmi.calls(folder) == []
    text = (fake_dcgmi.FIXTURES / "diag_r1_fail_deployment.txt").read_text()
    tests = dcgm.parse(text)
    assert [t.name for t in tests if t.result == "Fail"] == [
        "Persistence Mode",
        "Environment Variables",
        "Page Retirement",
        "Graphics Processes",
        "Inforom",
    ]
    assert all(t.section == "Deployment" and t.scope is None for t in tests)


def test_the_diag_s_evidence_is_in_the_audit(home, tmp_path, monkeypatch):
    """Why: the output that released (or kept out) a GPU is kept where a person looks later."""
    from sqlmodel import select

    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.store.db import AuditEvent

    _with_dcgmi(monkeypatch, tmp_path, "diag_fail.txt", exit_code=226)
    (home / "config.yaml").write_text("health:\n  recover_after_checks: 1\n")
    w = Wiring.load()
    for hour, temperature in enumerate([95.0, 50.0]):
        ctx = w.context("agent", f"health-{hour}")
        ctx.probe, ctx.now = Probe(temperature), NOW + timedelta(hours=hour)
        w.gate.call(ctx, "gpu_health_check", {})
    with w.store.session() as s:
        last = list(
            s.exec(
                select(AuditEvent)
                .where(AuditEvent.action == "skill.result", AuditEvent.skill == "gpu_health_check")
                .order_by(AuditEvent.id)
            )
        )[-1]
    diag = last.payload["result"]["gpus"][0]["quarantine"]["diag"]
    assert diag["passed"] is False and diag["failed"] == ["PCIe"] and diag["exit_code"] == 226
    assert "| PCIe                      | Fail - All" in diag["output"]
