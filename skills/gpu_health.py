"""gpu_health_check: read every GPU, judge it against the configured thresholds, record the verdict.

The skill only reports and records; placement derives quarantine from the latest recorded verdicts.
`judge_reading` is the pure rule set, usable without a store or a probe.
"""

from __future__ import annotations

from typing import Any, Literal

from nightshift.runtime.config import HealthThresholds
from nightshift.runtime.gpu import (
    ESSENTIAL_FIELDS,
    GpuReading,
    ProbeResult,
    make_probe,
    normalize_bus_id,
)
from nightshift.runtime.store import GpuSample
from nightshift.skills.base import SkillContext, skill
from pydantic import BaseModel, Field
from sqlmodel import select

Verdict = Literal["OK", "WARNING", "UNKNOWN", "CRITICAL"]
OverallVerdict = Literal["OK", "WARNING", "UNKNOWN", "CRITICAL", "NO_GPUS"]

# Worst wins: a GPU that cannot be judged ranks above one that merely needs watching.
SEVERITY: dict[str, int] = {"OK": 0, "WARNING": 1, "UNKNOWN": 2, "CRITICAL": 3}

# Non-essential fields whose failure to read hides a health problem: worth a warning.
_HEALTH_FIELDS = (
    "ecc_volatile_uncorrected",
    "ecc_aggregate_uncorrected",
    "retired_pages",
    "remapped_rows_pending",
    "remapped_rows_failed",
    "throttle_reasons",
)
# Clock-event reasons that mean the card protects itself from heat or a power emergency.
SLOWDOWN_REASONS = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "sw_thermal_slowdown",
    "hw_power_brake_slowdown",
)


class HealthCheckInput(BaseModel):
    """Which GPUs to check and whether to record the verdicts."""

    gpus: list[int] | None = Field(None, description="GPU indices to check; all GPUs when omitted")
    record: bool = Field(
        True, description="Record one GpuSample per GPU (placement reads the latest)"
    )


class HealthReason(BaseModel):
    """One finding: the field, what it read, the threshold it crossed, and what that means."""

    field: str
    value: Any = None
    threshold: Any = None
    severity: Verdict
    message: str


class GpuVerdict(BaseModel):
    """The verdict on one GPU with every reason behind it."""

    index: int | None = Field(description="None only for a lost GPU known by its bus id alone")
    uuid: str | None = None
    name: str | None = None
    verdict: Verdict
    reasons: list[HealthReason] = Field(default_factory=list)
    not_supported: list[str] = Field(
        default_factory=list, description="Fields this card lacks: no problem"
    )
    summary: str
    reading: GpuReading | None = None


class HealthCheckResult(BaseModel):
    """Per-GPU verdicts, the overall (worst) verdict and the thresholds used."""

    backend: str
    overall: OverallVerdict = Field(
        description="The worst per-GPU verdict; NO_GPUS when there are none"
    )
    gpus: list[GpuVerdict] = Field(default_factory=list)
    message: str
    thresholds: HealthThresholds
    error: str | None = Field(None, description="What the backend could not read")
    recorded: int = Field(0, description="GpuSample rows written")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def judge_reading(reading: GpuReading, t: HealthThresholds) -> GpuVerdict:
    """Apply the health rules to one reading. Pure: same reading and thresholds, same verdict."""
    reasons: list[HealthReason] = []

    def add(
        field: str, severity: Verdict, message: str, value: Any = None, threshold: Any = None
    ) -> None:
        reasons.append(
            HealthReason(
                field=field, value=value, threshold=threshold, severity=severity, message=message
            )
        )

    if reading.lost:
        add(
            "lost",
            "CRITICAL",
            "the GPU is lost (fell off the bus); it needs a reset or a reboot",
            True,
        )

    unreadable_essential = [f for f in ESSENTIAL_FIELDS if reading.status(f) == "unreadable"]
    if unreadable_essential and not reading.lost:
        severity: Verdict = (
            "UNKNOWN" if len(unreadable_essential) == len(ESSENTIAL_FIELDS) else "CRITICAL"
        )
        for f in unreadable_essential:
            add(
                f,
                severity,
                f"{f} cannot be read ({reading.errors.get(f, 'error')})",
                reading.errors.get(f),
            )
    for f in _HEALTH_FIELDS:
        if reading.status(f) == "unreadable" and not reading.lost:
            add(
                f,
                "WARNING",
                f"{f} cannot be read ({reading.errors.get(f, 'error')}); its state is unknown",
                reading.errors.get(f),
            )

    temp = reading.temperature_c
    if temp is not None:
        if temp >= t.temp_critical_c:
            add(
                "temperature_c",
                "CRITICAL",
                f"temperature {_fmt(temp)} °C ≥ critical {_fmt(t.temp_critical_c)} °C",
                temp,
                t.temp_critical_c,
            )
        elif temp >= t.temp_warning_c:
            add(
                "temperature_c",
                "WARNING",
                f"temperature {_fmt(temp)} °C ≥ warning {_fmt(t.temp_warning_c)} °C",
                temp,
                t.temp_warning_c,
            )
        elif reading.temp_slowdown_c is not None and temp >= reading.temp_slowdown_c:
            add(
                "temperature_c",
                "WARNING",
                f"temperature {_fmt(temp)} °C ≥ the card's slowdown threshold "
                f"{_fmt(reading.temp_slowdown_c)} °C",
                temp,
                reading.temp_slowdown_c,
            )

    used, total = reading.memory_used_mib, reading.memory_total_mib
    if used is not None and total:
        frac = used / total
        if frac >= t.memory_used_warning_frac:
            add(
                "memory_used_mib",
                "WARNING",
                f"memory {used} of {total} MiB used ({frac:.0%} ≥ "
                f"{t.memory_used_warning_frac:.0%}); little room for another job",
                used,
                t.memory_used_warning_frac,
            )

    power, limit = reading.power_w, reading.power_limit_w
    if power is not None and limit and power >= t.power_warning_frac * limit:
        add(
            "power_w",
            "WARNING",
            f"power {_fmt(power)} W at {power / limit:.0%} of the {_fmt(limit)} W limit "
            f"(≥ {t.power_warning_frac:.0%})",
            power,
            t.power_warning_frac,
        )

    vol, agg = reading.ecc_volatile_uncorrected, reading.ecc_aggregate_uncorrected
    if vol is not None and vol >= t.ecc_uncorrected_critical:
        add(
            "ecc_volatile_uncorrected",
            "CRITICAL",
            f"{vol} uncorrected ECC error(s) since the last reset (≥ {t.ecc_uncorrected_critical})",
            vol,
            t.ecc_uncorrected_critical,
        )
    elif agg is not None and agg >= t.ecc_uncorrected_critical:
        add(
            "ecc_aggregate_uncorrected",
            "WARNING",
            f"{agg} uncorrected ECC error(s) over the card's lifetime "
            f"(≥ {t.ecc_uncorrected_critical}), none since the last reset",
            agg,
            t.ecc_uncorrected_critical,
        )

    if reading.remapped_rows_failed:
        add(
            "remapped_rows_failed",
            "CRITICAL",
            "a row remapping failed: memory errors can no longer be repaired on this card",
            True,
        )
    if reading.remapped_rows_pending:
        add(
            "remapped_rows_pending",
            "WARNING",
            "row remapping is pending: reset the GPU to apply it",
            True,
        )

    pages = reading.retired_pages
    if pages is not None and pages >= t.retired_pages_warning:
        add(
            "retired_pages",
            "WARNING",
            f"{pages} retired memory page(s) (≥ {t.retired_pages_warning})",
            pages,
            t.retired_pages_warning,
        )

    slow = [r for r in reading.throttle_reasons or [] if r in SLOWDOWN_REASONS]
    if slow:
        add("throttle_reasons", "WARNING", f"clocks slowed by {', '.join(slow)}", slow)

    verdict: Verdict = max((r.severity for r in reasons), key=SEVERITY.__getitem__, default="OK")
    not_supported = sorted(reading.unsupported)
    return GpuVerdict(
        index=reading.index,
        uuid=reading.uuid,
        name=reading.name,
        verdict=verdict,
        reasons=reasons,
        not_supported=not_supported,
        summary=_summary(reading, verdict, reasons, not_supported),
        reading=reading,
    )


def _summary(
    reading: GpuReading, verdict: str, reasons: list[HealthReason], not_supported: list[str]
) -> str:
    text = f"{reading.label}: {verdict}"
    if reasons:
        text += " — " + "; ".join(r.message for r in reasons)
    if not_supported:
        text += f" (not supported by this card: {', '.join(not_supported)})"
    return text


def _lost_verdict(label: str, match: GpuSample | None, t: HealthThresholds) -> GpuVerdict:
    """A GPU the backend names only by bus id; the newest sample with that bus id tells which it was."""
    reason = HealthReason(
        field="lost",
        value=True,
        severity="CRITICAL",
        message=f"GPU {label} is lost (the driver cannot reach it); it needs a reset or a reboot",
    )
    if match is None:
        return GpuVerdict(
            index=None,
            verdict="CRITICAL",
            reasons=[reason],
            summary=f"GPU at {label}: CRITICAL — {reason.message}",
        )
    reading = GpuReading(
        index=match.gpu_index,
        uuid=match.uuid,
        name=(match.data or {}).get("name"),
        pci_bus_id=(match.data or {}).get("pci_bus_id"),
        lost=True,
    )
    return judge_reading(reading, t)


def _unmatched_lost(ctx: SkillContext, result: ProbeResult) -> list[GpuVerdict]:
    seen: set[str] = set()
    for g in result.gpus:
        seen |= {f"index {g.index}", g.uuid or ""}
        if g.pci_bus_id:
            seen.add(normalize_bus_id(g.pci_bus_id))
    out = []
    for label in result.lost:
        if label in seen or normalize_bus_id(label) in seen:
            continue
        out.append(_lost_verdict(label, _sample_for_bus_id(ctx, label), ctx.settings.health))
    return out


def _sample_for_bus_id(ctx: SkillContext, bus_id: str) -> GpuSample | None:
    want = normalize_bus_id(bus_id)
    with ctx.store.session() as s:
        rows = s.exec(
            select(GpuSample).order_by(GpuSample.taken_at.desc(), GpuSample.id.desc()).limit(1000)
        )
        for row in rows:
            known = (row.data or {}).get("pci_bus_id")
            if known and normalize_bus_id(known) == want:
                return row
    return None


@skill("gpu_health_check", capability="read")
def gpu_health_check(ctx: SkillContext, inp: HealthCheckInput) -> HealthCheckResult:
    """Check the health of this machine's GPUs: temperature, memory used/total, utilisation, power and
    limit, energy counter, fan, uncorrected ECC errors, retired pages and remapped rows, clock
    slowdowns (thermal, power brake) and running processes. Each GPU gets a verdict OK, WARNING,
    CRITICAL or UNKNOWN with the reasons and the thresholds crossed; the overall verdict is the worst
    one, or NO_GPUS when the machine has none (plan for the CPU). A field the card does not support is
    not a problem; a lost GPU or an unreadable essential field is never OK. Verdicts are recorded so
    that placement avoids CRITICAL GPUs. Use it before placing work and when a job fails oddly."""
    thresholds = ctx.settings.health
    probe = ctx.probe if ctx.probe is not None else make_probe(ctx.settings)
    result: ProbeResult = probe.read()

    verdicts = [judge_reading(g, thresholds) for g in result.gpus]
    verdicts += _unmatched_lost(ctx, result)
    if inp.gpus is not None:
        wanted = set(inp.gpus)
        verdicts = [
            v
            for v in verdicts
            if v.index in wanted or (v.index is None and v.verdict == "CRITICAL")
        ]
        for missing in sorted(wanted - {v.index for v in verdicts}):
            reason = HealthReason(
                field="index",
                value=missing,
                severity="UNKNOWN",
                message=f"GPU {missing} is not visible to the {result.backend} backend",
            )
            verdicts.append(
                GpuVerdict(
                    index=missing,
                    verdict="UNKNOWN",
                    reasons=[reason],
                    summary=f"GPU {missing}: UNKNOWN — {reason.message}",
                )
            )

    recorded = 0
    if inp.record:
        with ctx.store.session() as s:
            for v in verdicts:
                if v.reading is None or v.index is None:
                    continue
                s.add(
                    GpuSample(
                        gpu_index=v.index,
                        uuid=v.uuid,
                        verdict=v.verdict,
                        data=v.reading.model_dump(mode="json"),
                        taken_at=ctx.now,
                    )
                )
                recorded += 1

    if verdicts:
        overall: OverallVerdict = max((v.verdict for v in verdicts), key=SEVERITY.__getitem__)
        counts = {k: sum(v.verdict == k for v in verdicts) for k in SEVERITY}
        head = f"{len(verdicts)} GPU(s) via {result.backend}: " + ", ".join(
            f"{n} {k}" for k, n in counts.items() if n
        )
        message = head + "\n" + "\n".join(v.summary for v in verdicts)
    elif result.error:
        overall = "UNKNOWN"
        message = f"the {result.backend} backend could not read the GPUs: {result.error}"
    else:
        overall = "NO_GPUS"
        message = (
            result.message or f"no GPUs found by the {result.backend} backend; planning for CPU"
        )
    if result.error and verdicts:
        message += f"\nbackend: {result.error}"
    return HealthCheckResult(
        backend=result.backend,
        overall=overall,
        gpus=verdicts,
        message=message,
        thresholds=thresholds,
        error=result.error,
        recorded=recorded,
    )
