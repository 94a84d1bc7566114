"""A quarantined GPU comes back after health.recover_after_checks consecutive healthy checks, not on
the first OK; the return is in the check's result, which the gate records in the audit."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from nightshift.runtime.config import Settings
from nightshift.runtime.gpu.gpu import GpuReading, ProbeResult
from nightshift.runtime.scheduling.snapshot import load_snapshot
from nightshift.runtime.store.db import Store
from nightshift.skills.base import SkillContext
from nightshift.skills.gpu_health import gpu_health_check

from conftest import run_skill

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
        store=Store(f"sqlite:///{tmp_path}/s.db"),
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
