"""gpu_health_check: read every GPU, judge it against the configured thresholds, record the verdict.

The skill only reports and records; placement derives quarantine from the latest recorded verdicts.
Verdicts are recorded per node and per source (the probe as this process is configured,
`health_source`): placement, and the rules below, read only their own source's, so a command run
from a shell with other GPU settings (another inventory, `probe: none`) never quarantines the
daemon's GPUs.
`judge_reading` is the pure rule set, usable without a store or a probe.

Beyond what the probe reads, two rules compare it with what this machine should have, using only
the store and the settings (never a clock of its own):

- a GPU the declared inventory (`gpu.inventory`) lists, by UUID or else by index, that the probe
  does not see is CRITICAL: "expected by the inventory, not seen by the probe";
- a GPU that placement still knows, the latest recorded sample of its index, and that the probe no
  longer sees (by UUID; by index for samples without one) is CRITICAL: "GPU disappeared since the
  last check". Its CRITICAL sample is recorded, so placement keeps the index quarantined and the
  next check reports it again, until a GPU answers at that index again.

The same rules judge saved or pasted nvidia-smi output (`from_text`, `from_file`). A paste is a
snapshot of some machine, often a colleague's, not this one: by default nothing is recorded and it
is not compared with this machine's inventory or history, since its GPUs would otherwise quarantine
(or clear) this machine's GPUs of the same index. `record=true` says the paste is this machine's.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator
from sqlmodel import col, select

from nightshift.runtime.config import HealthThresholds
from nightshift.runtime.errors import BadArguments, SpecError
from nightshift.runtime.gpu import dcgm
from nightshift.runtime.gpu.bus import normalize_bus_id
from nightshift.runtime.gpu.driver_messages import DriverMessage, machine_wide
from nightshift.runtime.gpu.gpu import (
    ESSENTIAL_FIELDS,
    GpuReading,
    InventoryProbe,
    ProbeResult,
    health_source,
    health_sources,
    inventory_path,
    make_probe,
)
from nightshift.runtime.gpu.nvidia_smi_text import TextProbe
from nightshift.runtime.gpu.ray_census import HOST_PREFIX, RayGpuCensus
from nightshift.runtime.gpu.xid import XidFinding
from nightshift.runtime.scheduling.placement import QUARANTINED
from nightshift.runtime.store.db import GpuSample
from nightshift.runtime.user_files import read_limited
from nightshift.skills.base import SkillContext, skill

Verdict = Literal["OK", "WARNING", "UNKNOWN", "CRITICAL"]
OverallVerdict = Literal["OK", "WARNING", "UNKNOWN", "CRITICAL", "NO_GPUS"]
Hosts = tuple[str, ...]  # the GpuSample hosts that are one machine's

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


# A pasted output larger than this is not one nvidia-smi report.
MAX_PASTE_CHARS = 2_000_000

MISSING_FROM_INVENTORY = "expected by the inventory, not seen by the probe"
DISAPPEARED = "GPU disappeared since the last check"
LOST_ACTION = (
    "drain the GPU's work and reboot (a GPU reset cannot reach a lost GPU); if it happens "
    "again, check the card's power, cooling and seating, then RMA"
)
# What to do about a GPU whose essential fields nvidia-smi or NVML cannot read (ERR!, [Unknown Error]).
UNREADABLE_ACTION = (
    "read the kernel log for this GPU (`journalctl -k | grep NVRM`: an Xid line says why); "
    "reset the GPU (`nvidia-smi -r -i <index>`) when it is idle, or reboot"
)


class HealthCheckInput(BaseModel):
    """Which GPUs to check, where the readings come from, and whether to record the verdicts."""

    gpus: list[int] | None = Field(None, description="GPU indices to check; all GPUs when omitted")
    record: bool | None = Field(
        None,
        description="Record one GpuSample per GPU (placement reads the latest). Default: yes for "
        "this machine, no for from_text/from_file (a paste may be another machine's)",
    )
    from_text: str | None = Field(
        None,
        max_length=MAX_PASTE_CHARS,
        description="nvidia-smi output pasted by a user (`nvidia-smi -q`, the default `nvidia-smi` "
        "table, or `--query-gpu=… --format=csv` with its header) to judge instead of this machine",
    )
    from_file: str | None = Field(
        None, description="Path of a saved nvidia-smi output, judged like from_text"
    )

    @model_validator(mode="after")
    def _one_source(self) -> HealthCheckInput:
        if self.from_text is not None and self.from_file is not None:
            raise ValueError("give from_text or from_file, not both")
        return self

    @property
    def pasted(self) -> bool:
        return self.from_text is not None or self.from_file is not None


class HealthReason(BaseModel):
    """One finding: the field, what it read, the threshold it crossed, and what that means."""

    field: str
    value: Any = None
    threshold: Any = None
    severity: Verdict
    message: str
    evidence: str | None = Field(
        None, description="What the driver or the kernel log said, word for word"
    )
    action: str | None = Field(None, description="The recommended action")


class Quarantine(BaseModel):
    """A GPU placement had quarantined (its latest recorded verdict CRITICAL or UNKNOWN) that this
    check found healthy: it returns after `needed` consecutive healthy checks, not the first."""

    since: str = Field(description="The verdict that quarantined it, and when it was recorded")
    healthy_checks: int = Field(description="Consecutive healthy checks so far, this one included")
    needed: int = Field(description="health.recover_after_checks")
    released: bool = Field(description="True when this check returns the GPU to placement")
    diag: dcgm.DcgmDiag | None = Field(
        None,
        description="`dcgmi diag -r 1` on this GPU, run at the last healthy check needed where "
        "DCGM is installed (health.dcgm_diag): it must pass too; its output is the evidence",
    )


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
    missing: bool = Field(
        default=False,
        description="Not seen by the probe: expected by the inventory, or recorded at an earlier check",
    )
    host: str | None = Field(None, description="The cluster node ('ray:<IP>'); None: this machine")
    pci_bus_id: str | None = Field(
        None, description="The GPU's PCI bus id where it is known (a kernel log names GPUs so)"
    )
    quarantine: Quarantine | None = Field(
        None, description="Set when the GPU was quarantined before this check and is healthy now"
    )


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
    recovered: list[str] = Field(
        default_factory=list,
        description="GPUs this check returned to placement after enough consecutive healthy checks",
    )


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
        reasons[-1].action = LOST_ACTION

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
            reasons[-1].evidence = reading.errors.get(f)
            reasons[-1].action = UNREADABLE_ACTION
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
        pci_bus_id=reading.pci_bus_id,
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
    reason.action = LOST_ACTION
    if match is None:
        return GpuVerdict(
            index=None,
            verdict="CRITICAL",
            reasons=[reason],
            summary=f"GPU at {label}: CRITICAL — {reason.message}",
            pci_bus_id=label if normalize_bus_id(label).count(":") == 2 else None,
        )
    reading = GpuReading(
        index=match.gpu_index,
        uuid=match.uuid,
        name=(match.data or {}).get("name"),
        pci_bus_id=(match.data or {}).get("pci_bus_id"),
        lost=True,
    )
    return judge_reading(reading, t)


def _unmatched_lost(
    ctx: SkillContext, result: ProbeResult, use_store: bool, hosts: Hosts
) -> list[GpuVerdict]:
    seen: set[str] = set()
    for g in result.gpus:
        seen |= {f"index {g.index}", g.uuid or ""}
        if g.pci_bus_id:
            seen.add(normalize_bus_id(g.pci_bus_id))
    out = []
    for label in result.lost:
        if label in seen or normalize_bus_id(label) in seen:
            continue
        match = _sample_for_bus_id(ctx, label, hosts) if use_store else None
        out.append(_lost_verdict(label, match, ctx.settings.health))
    return out


def _bus_of(v: GpuVerdict) -> str | None:
    bus = v.pci_bus_id or (v.reading.pci_bus_id if v.reading is not None else None)
    return normalize_bus_id(bus) if bus else None


def _resummarise(v: GpuVerdict) -> None:
    """The verdict and summary again, after reasons were added or replaced."""
    v.verdict = max((r.severity for r in v.reasons), key=SEVERITY.__getitem__, default="OK")
    if v.index is not None:
        label = f"GPU {v.index}" + (f" ({v.name})" if v.name else "")
    else:
        label = f"GPU at {v.pci_bus_id}"
    text = f"{label}: {v.verdict}"
    if v.reasons:
        text += " — " + "; ".join(r.message for r in v.reasons)
    if v.not_supported:
        text += f" (not supported by this card: {', '.join(v.not_supported)})"
    v.summary = text


def _driver_reason(m: DriverMessage) -> HealthReason:
    return HealthReason(
        field="driver",
        value=m.kind,
        severity=m.verdict,
        message=m.meaning,
        evidence=m.text,
        action=m.action,
    )


def _apply_driver(verdicts: list[GpuVerdict], messages: list[DriverMessage]) -> None:
    """nvidia-smi's messages about one GPU ('Unable to determine the device handle for GPU …')
    become that GPU's reason, in the driver's words, in place of the generic 'lost' one."""
    for m in messages:
        if m.bus_id is None:
            continue
        want = normalize_bus_id(m.bus_id)
        for v in verdicts:
            if _bus_of(v) == want:
                v.reasons = [r for r in v.reasons if r.field != "lost"] + [_driver_reason(m)]
                _resummarise(v)
                break


def _xid_reason(f: XidFinding) -> HealthReason:
    name = f" {f.mnemonic}" if f.mnemonic else ""
    times = f", {f.count} times in the log" if f.count > 1 else ""
    return HealthReason(
        field="xid",
        value=f.xid,
        severity=f.severity,
        message=f"Xid {f.xid}{name}: {f.meaning}{times}",
        evidence=f.last_line,
        action=f.advice,
    )


def _xid_verdicts(
    ctx: SkillContext,
    findings: list[XidFinding],
    verdicts: list[GpuVerdict],
    use_store: bool,
    hosts: Hosts,
) -> list[GpuVerdict]:
    """Kernel-log findings per GPU (by bus id): added to the verdict of a GPU already judged,
    else a verdict of their own, under the index this machine last recorded for that bus id
    (so that, recorded, it quarantines that GPU), or the bus id alone."""
    by_bus: dict[str, list[XidFinding]] = {}
    for f in findings:
        by_bus.setdefault(f.bus_id, []).append(f)
    out: list[GpuVerdict] = []
    for bus, found in by_bus.items():
        reasons = [_xid_reason(f) for f in found]
        target = next((v for v in [*verdicts, *out] if _bus_of(v) == bus), None)
        if target is None:
            match = _sample_for_bus_id(ctx, bus, hosts) if use_store else None
            uuid = next((f.uuid for f in found if f.uuid), None)
            if match is not None:
                reading = GpuReading(
                    index=match.gpu_index,
                    uuid=match.uuid or uuid,
                    name=(match.data or {}).get("name"),
                    pci_bus_id=(match.data or {}).get("pci_bus_id") or bus,
                )
                target = GpuVerdict(
                    index=reading.index,
                    uuid=reading.uuid,
                    name=reading.name,
                    verdict="OK",
                    summary="",
                    reading=reading,
                    pci_bus_id=reading.pci_bus_id,
                )
            else:
                target = GpuVerdict(index=None, uuid=uuid, verdict="OK", summary="", pci_bus_id=bus)
            out.append(target)
        target.reasons += reasons
        _resummarise(target)
    return out


def _driver_unreadable(
    ctx: SkillContext, hosts: Hosts, messages: list[DriverMessage], judged: set[int | None]
) -> list[GpuVerdict]:
    """This machine's GPUs, as last recorded, when the driver cannot be asked at all ('No devices
    were found', 'Failed to initialize NVML: …'): each gets the message's verdict (UNKNOWN), so
    that, recorded, placement does not send work there on an old OK."""
    out = []
    worst = max((m.verdict for m in messages), key=SEVERITY.__getitem__)
    for sample in _latest_per_index(ctx, hosts):
        if sample.gpu_index in judged:
            continue
        reasons = [_driver_reason(m) for m in messages]
        data = sample.data or {}
        reading = GpuReading(
            index=sample.gpu_index,
            uuid=sample.uuid,
            name=data.get("name"),
            pci_bus_id=data.get("pci_bus_id"),
        )
        v = GpuVerdict(
            index=sample.gpu_index,
            uuid=sample.uuid,
            name=data.get("name"),
            verdict=worst,
            reasons=reasons,
            summary="",
            reading=reading,
            pci_bus_id=reading.pci_bus_id,
        )
        _resummarise(v)
        out.append(v)
    return out


def _sample_for_bus_id(ctx: SkillContext, bus_id: str, hosts: Hosts) -> GpuSample | None:
    want = normalize_bus_id(bus_id)
    with ctx.store.session() as s:
        rows = s.exec(
            select(GpuSample)
            .where(
                col(GpuSample.host).in_(hosts),
                col(GpuSample.source).in_(health_sources(ctx.settings)),
            )
            .order_by(GpuSample.taken_at.desc(), GpuSample.id.desc())
            .limit(1000)
        )
        for row in rows:
            known = (row.data or {}).get("pci_bus_id")
            if known and normalize_bus_id(known) == want:
                return row
    return None


# ------------------------------------------------------------------------------ missing GPUs
def _latest_per_index(ctx: SkillContext, hosts: Hosts) -> list[GpuSample]:
    """The newest sample of each GPU index up to ctx.now: the GPUs as placement knows them (of
    this process's source: a client with other GPU settings compares with its own history)."""
    latest: dict[int, GpuSample] = {}
    with ctx.store.session() as s:
        rows = s.exec(
            select(GpuSample)
            .where(
                GpuSample.taken_at <= ctx.now,
                col(GpuSample.host).in_(hosts),
                col(GpuSample.source).in_(health_sources(ctx.settings)),
            )
            .order_by(GpuSample.id)
        )
        for row in rows:
            latest[row.gpu_index] = row
    return [latest[i] for i in sorted(latest)]


class _Missing:
    """Collects the GPUs the probe does not see; two findings about one GPU make one verdict."""

    def __init__(self) -> None:
        self.verdicts: list[GpuVerdict] = []

    def flag(self, index: int, uuid: str | None, name: str | None, message: str) -> None:
        reason = HealthReason(field="missing", value=True, severity="CRITICAL", message=message)
        for v in self.verdicts:
            same = v.uuid == uuid if (uuid and v.uuid) else v.index == index
            if same:
                v.reasons.append(reason)
                v.uuid, v.name = v.uuid or uuid, v.name or name
                v.summary = _missing_summary(v)
                return
        v = GpuVerdict(
            index=index,
            uuid=uuid,
            name=name,
            verdict="CRITICAL",
            reasons=[reason],
            summary="",
            missing=True,
        )
        v.summary = _missing_summary(v)
        self.verdicts.append(v)


def _missing_summary(v: GpuVerdict) -> str:
    label = f"GPU {v.index}" + (f" ({v.name})" if v.name else "")
    return f"{label}: CRITICAL — " + "; ".join(r.message for r in v.reasons)


def _missing_gpus(
    ctx: SkillContext, result: ProbeResult, present: list[GpuVerdict], hosts: Hosts
) -> tuple[list[GpuVerdict], list[str]]:
    """GPUs the inventory declares or placement knows that the probe does not see, and notes
    for the message (an inventory that cannot be read)."""
    uuids = {v.uuid for v in present if v.uuid}
    where = {v.uuid: v.index for v in present if v.uuid and v.index is not None}
    answering = {v.index for v in present if v.index is not None}
    # A reading without a UUID (a table paste, an inventory) can only be matched by its index.
    anonymous = {v.index for v in present if v.index is not None and not v.uuid}

    def sees(uuid: str | None, index: int) -> bool:
        return (uuid in uuids or index in anonymous) if uuid else index in answering

    found = _Missing()
    notes: list[str] = []

    path = inventory_path(ctx.settings)
    if path is not None and result.backend != "inventory" and ctx.settings.node in hosts:
        try:
            inventory = InventoryProbe(path).load()
        except SpecError as exc:
            notes.append(f"inventory not compared: {exc}")
        else:
            for pos, g in enumerate(inventory.gpus):
                index = pos if g.index is None else g.index
                if not sees(g.uuid, index):
                    what = g.uuid or f"GPU {index}"
                    found.flag(index, g.uuid, g.name, f"{MISSING_FROM_INVENTORY} ({what}, {path})")

    for sample in _latest_per_index(ctx, hosts):
        i, uuid = sample.gpu_index, sample.uuid
        name = (sample.data or {}).get("name")
        when = f"{sample.taken_at:%Y-%m-%d %H:%M}"
        if sees(uuid, i):
            if i not in answering:
                found.flag(
                    i,
                    None,
                    name,
                    f"no GPU answers at index {i} any more: {uuid}, recorded there at {when}, "
                    f"now answers as GPU {where.get(uuid)}",
                )
        elif uuid:
            found.flag(i, uuid, name, f"{DISAPPEARED} ({uuid}, recorded as GPU {i} at {when})")
        else:
            found.flag(i, None, name, f"{DISAPPEARED} (GPU {i}, recorded at {when})")
    return found.verdicts, notes


def _sample(v: GpuVerdict, now: datetime, host: str, source: str) -> GpuSample | None:
    """The row that records a verdict; none for a GPU known by bus id alone or an unknown index."""
    if v.index is None:
        return None
    if v.reading is not None:
        data = v.reading.model_dump(mode="json")
    elif v.missing:
        data = GpuReading(index=v.index, uuid=v.uuid, name=v.name).model_dump(mode="json")
        data["missing"] = [r.message for r in v.reasons]
    else:
        return None
    return GpuSample(
        host=host,
        gpu_index=v.index,
        uuid=v.uuid,
        verdict=v.verdict,
        data=data,
        taken_at=now,
        source=source,
    )


# ------------------------------------------------------------------------------ quarantine
def _quarantine_holds(
    ctx: SkillContext, verdicts: list[GpuVerdict], known: dict[str, Hosts], recovered: list[str]
) -> set[int]:
    """Healthy verdicts on GPUs placement has quarantined (latest recorded verdict CRITICAL or
    UNKNOWN): each counts one more healthy check; the GPU returns to placement at the
    `health.recover_after_checks`-th in a row, not the first. Returns the ids (id(verdict)) to
    record as still held; fills `recovered` with the GPUs released now."""
    need = ctx.settings.health.recover_after_checks
    latest: dict[str, dict[int, GpuSample]] = {}
    held: set[int] = set()
    for v in verdicts:
        if v.index is None or v.missing or v.verdict in QUARANTINED:
            continue
        host = v.host or ctx.settings.node
        if host not in latest:
            latest[host] = {
                s.gpu_index: s for s in _latest_per_index(ctx, known.get(host, (host,)))
            }
        prev = latest[host].get(v.index)
        if prev is None or prev.verdict not in QUARANTINED:
            continue
        if prev.uuid and v.uuid and prev.uuid != v.uuid:
            continue  # another card answers at that index now: nothing to hold
        hold = (prev.data or {}).get("held") or {}
        since = hold.get("since") or f"{prev.verdict} at {prev.taken_at:%Y-%m-%d %H:%M}"
        count = int(hold.get("healthy_checks", 0)) + 1
        v.quarantine = Quarantine(
            since=since, healthy_checks=count, needed=need, released=count >= need
        )
        label = (f"{v.host} " if v.host else "") + f"GPU {v.index}"
        if v.quarantine.released and v.host is None:
            _dcgm_diag(ctx, v, v.quarantine)
        if v.quarantine.released:
            recovered.append(label)
            v.summary += f" (back in placement: {count} healthy check(s) in a row since {since})"
        else:
            held.add(id(v))
            v.summary += (
                f" (still quarantined: {count} of {need} healthy checks in a row since {since})"
            )
    return held


def _dcgm_diag(ctx: SkillContext, v: GpuVerdict, q: Quarantine) -> None:
    """Where DCGM is installed (and health.dcgm_diag is auto), the healthy checks are not enough:
    `dcgmi diag -r 1` on the GPU must pass too. A failed diag starts the count again; one that
    could not run or be read (a timeout, no table) is tried again at the next check."""
    exe = dcgm.available() if ctx.settings.health.dcgm_diag == "auto" else None
    if exe is None or v.index is None:
        return
    q.diag = dcgm.run(v.index, timeout_s=ctx.settings.health.dcgm_diag_timeout_s, exe=exe)
    said = dcgm.summary(q.diag)
    if not q.diag.passed:
        q.released = False
        q.healthy_checks = 0 if q.diag.failed else q.needed - 1
    v.summary += f"; {said}"


def _held(row: GpuSample | None, v: GpuVerdict, held: set[int]) -> GpuSample | None:
    """A healthy GPU still in quarantine is recorded UNKNOWN (placement keeps it out), with what
    this check judged and how many healthy checks it has passed."""
    if row is None or id(v) not in held or v.quarantine is None:
        return row
    row.verdict = "UNKNOWN"
    row.data = {
        **row.data,
        "judged": v.verdict,
        "held": v.quarantine.model_dump(mode="json"),
    }
    return row


# ----------------------------------------------------------------------------------- sources
def _source(ctx: SkillContext, inp: HealthCheckInput) -> Any:
    """The probe to read: a paste, a saved file, the context's probe, or the configured backend."""
    if inp.from_text is not None:
        return _text_probe(inp.from_text, "pasted text")
    if inp.from_file is not None:
        path = Path(inp.from_file).expanduser()
        # As the caller of the daemon's socket where there is one (runtime/user_files.py).
        raw = read_limited(
            path,
            "gpu_health_check: from_file",
            4 * MAX_PASTE_CHARS,
            "that is not one nvidia-smi output",
        )
        text = raw.decode("utf-8", errors="replace")
        if len(text) > MAX_PASTE_CHARS:
            raise BadArguments(
                f"gpu_health_check: from_file: {path} is over {MAX_PASTE_CHARS} characters; "
                "that is not one nvidia-smi output"
            )
        return _text_probe(text, str(path))
    if ctx.probe is not None:
        return ctx.probe
    if ctx.settings.executor.kind == "ray" and hasattr(ctx.executor, "run_driver"):
        gpu = ctx.settings.gpu
        return RayGpuCensus(ctx.executor.run_driver, gpu.nvidia_smi, gpu.cluster_census_timeout_s)
    return make_probe(ctx.settings)


def _text_probe(text: str, source: str) -> TextProbe:
    try:
        return TextProbe(text, source)
    except ValueError as exc:
        raise BadArguments(f"gpu_health_check: {source}: {exc}") from exc


def _judge_host(
    ctx: SkillContext, inp: HealthCheckInput, result: ProbeResult, hosts: Hosts, this_machine: bool
) -> tuple[list[GpuVerdict], list[str]]:
    """The verdicts on one machine's reading, and notes for the message."""
    verdicts = [judge_reading(g, ctx.settings.health) for g in result.gpus]
    verdicts += _unmatched_lost(ctx, result, this_machine, hosts)
    _apply_driver(verdicts, result.driver)
    verdicts += _xid_verdicts(ctx, result.xids, verdicts, this_machine, hosts)
    notes: list[str] = []
    if this_machine and result.complete and (result.gpus or not result.error):
        unseen, notes = _missing_gpus(ctx, result, verdicts, hosts)
        verdicts += unseen
    whole = machine_wide(result.driver)
    if this_machine and whole and not result.gpus and ctx.settings.node in hosts:
        verdicts += _driver_unreadable(ctx, hosts, whole, {v.index for v in verdicts})
    for m in whole:
        notes.append(f"{m.text.replace(chr(10), ' ')}: {m.meaning}; do: {m.action}")
    if inp.gpus is None:
        return verdicts, notes
    wanted = set(inp.gpus)
    verdicts = [
        v for v in verdicts if v.index in wanted or (v.index is None and v.verdict == "CRITICAL")
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
    return verdicts, notes


# ----------------------------------------------------------------------------- a Ray cluster
def _on(host: str, v: GpuVerdict) -> GpuVerdict:
    return v.model_copy(update={"host": host, "summary": f"{host} {v.summary}"})


def _unreadable(ctx: SkillContext, host: str, verdict: Verdict, why: str) -> list[GpuVerdict]:
    """A cluster host's GPUs, as last recorded, judged `verdict` because the host itself could
    not be read (or left): placement must not send work there on an old OK."""
    out = []
    for sample in _latest_per_index(ctx, (host,)):
        if sample.verdict == verdict and (sample.data or {}).get("missing") == [why]:
            continue  # already recorded so: nothing new to add each check
        name = (sample.data or {}).get("name")
        reason = HealthReason(field="host", value=host, severity=verdict, message=why)
        label = f"GPU {sample.gpu_index}" + (f" ({name})" if name else "")
        out.append(
            GpuVerdict(
                index=sample.gpu_index,
                host=host,
                uuid=sample.uuid,
                name=name,
                verdict=verdict,
                reasons=[reason],
                summary=f"{host} {label}: {verdict} — {why}",
                missing=True,
            )
        )
    return out


def _hosts_gone(ctx: SkillContext, seen: set[str]) -> list[str]:
    """Cluster hosts recorded before that the census no longer finds."""
    with ctx.store.session() as s:
        hosts = s.exec(
            select(GpuSample.host)
            .where(
                col(GpuSample.host).startswith(HOST_PREFIX, autoescape=True),
                col(GpuSample.source).in_(health_sources(ctx.settings)),
            )
            .distinct()
        ).all()
    return sorted(set(hosts) - seen)


def _as_one(backend: str, results: dict[str, ProbeResult]) -> ProbeResult:
    """A cluster's hosts as one result: their GPUs, and their errors by host."""
    errors = [f"{h}: {r.error}" for h, r in results.items() if r.error]
    return ProbeResult(
        backend=backend,
        gpus=[g for r in results.values() for g in r.gpus],
        error="; ".join(errors) or None,
        message=None if results else "the Ray cluster has no alive node with GPUs",
    )


@skill("gpu_health_check", capability="read")
def gpu_health_check(ctx: SkillContext, inp: HealthCheckInput) -> HealthCheckResult:
    """Check the health of this machine's GPUs: temperature, memory used/total, utilisation, power and
    limit, energy counter, fan, uncorrected ECC errors, retired pages and remapped rows, clock
    slowdowns (thermal, power brake) and running processes. Each GPU gets a verdict OK, WARNING,
    CRITICAL or UNKNOWN with the reasons and the thresholds crossed; the overall verdict is the worst
    one, or NO_GPUS when the machine has none (plan for the CPU). A field the card does not support is
    not a problem; a lost GPU, an unreadable essential field, or a GPU the inventory or an earlier
    check knows but the probe no longer sees is never OK. Verdicts are recorded so that placement
    avoids CRITICAL GPUs. Use it before placing work and when a job fails oddly. Give from_text (or
    from_file) to judge nvidia-smi output a user pasted (`-q`, the default table or the CSV query)
    with the same rules; a paste is not recorded unless record is true."""
    thresholds = ctx.settings.health
    probe = _source(ctx, inp)
    # A paste is judged on its own unless the caller says it is this machine's (record=true).
    this_machine = not inp.pasted or inp.record is True
    record = inp.record if inp.record is not None else not inp.pasted

    cluster = isinstance(probe, RayGpuCensus)
    if cluster:
        results = probe.read_hosts()
        known: dict[str, Hosts] = {h: (h,) for h in results}
    else:
        results = {ctx.settings.node: probe.read()}
        known = {ctx.settings.node: (ctx.settings.node, "localhost")}
    verdicts: list[GpuVerdict] = []
    notes: list[str] = []
    for host, result in results.items():
        found, said = _judge_host(ctx, inp, result, known[host], this_machine)
        if cluster:
            found = [_on(host, v) for v in found]
            if result.error and not result.gpus:
                judged = {v.index for v in found}
                found += [
                    v
                    for v in _unreadable(ctx, host, "UNKNOWN", f"not read: {result.error}")
                    if v.index not in judged
                ]
            said = [f"{host}: {n}" for n in said]
        verdicts += found
        notes += said
    if cluster:
        for host in _hosts_gone(ctx, set(results)):
            verdicts += _unreadable(ctx, host, "CRITICAL", "the node is not in the Ray cluster")
    result = _as_one(probe.name, results) if cluster else results[ctx.settings.node]

    recorded = 0
    recovered: list[str] = []
    if record:
        # GPUs not seen go first: where another GPU now answers at the same index, its sample
        # is the newer one, and placement reads the newest per index.
        source = health_source(ctx.settings)  # placement reads its own source's verdicts
        held = _quarantine_holds(ctx, verdicts, known, recovered)
        rows = [
            _held(_sample(v, ctx.now, v.host or ctx.settings.node, source), v, held)
            for v in sorted(verdicts, key=lambda v: not v.missing)
        ]
        with ctx.store.session() as s:
            for row in rows:
                if row is not None:
                    s.add(row)
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
    elif not result.complete:
        overall = "OK"  # a kernel log without Xid lines: the driver logged no GPU error
        message = (
            f"no NVRM Xid lines in the {result.message or result.backend}: no GPU errors logged"
        )
    else:
        overall = "NO_GPUS"
        message = (
            result.message or f"no GPUs found by the {result.backend} backend; planning for CPU"
        )
    if result.error and verdicts:
        message += f"\nbackend: {result.error}"
    if result.message and verdicts:
        message += f"\nsource: {result.message}"
    if inp.pasted and not record:
        message += "\nnot recorded: a paste may be another machine's"
    for note in notes:
        message += f"\n{note}"
    if recovered:
        message += (
            f"\nback in placement after {thresholds.recover_after_checks} consecutive healthy "
        )
        message += f"check(s): {', '.join(recovered)}"
    return HealthCheckResult(
        backend=result.backend,
        overall=overall,
        gpus=verdicts,
        message=message,
        thresholds=thresholds,
        error=result.error,
        recorded=recorded,
        recovered=recovered,
    )
