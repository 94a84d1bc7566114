"""show_power_limits: each GPU's power limit, its allowed range, the change nightshift recorded
(what `restore` would put back, who set it, when and why) and what the power model estimates at
the current limit — so that a person deciding on a cap sees its price before paying it."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from nightshift.runtime.errors import NightshiftError
from nightshift.runtime.gpu import power_record
from nightshift.runtime.scheduling.power_model import PowerModelError, power_model
from nightshift.skills.base import SkillContext, SkillInput, skill
from nightshift.skills.set_power_limit import power_control


class ShowPowerLimitsInput(SkillInput):
    gpus: list[int] = Field(default_factory=list, description="GPU indexes; empty: every GPU")


class ModelEstimate(BaseModel):
    """The power model at the GPU's current limit (runtime/scheduling/power_model.yaml)."""

    gpu_type: str
    throughput: float = Field(description="Training speed relative to the largest limit")
    busy_watts: float
    measured: bool = Field(description="False: the curve is another GPU type's, scaled")
    interpolated: bool
    curve: str


class GpuPowerLimit(BaseModel):
    gpu: int
    uuid: str | None = None
    name: str | None = None
    current_w: float | None = None
    default_w: float | None = None
    min_w: float | None = None
    max_w: float | None = None
    error: str | None = Field(None, description="Why NVML could not read it")
    recorded_previous_w: float | None = Field(None, description="What `restore` puts back")
    set_by: str | None = None
    set_at: datetime | None = None
    reason: str | None = None
    estimate: ModelEstimate | None = None
    estimate_note: str | None = None


class ShowPowerLimitsResult(BaseModel):
    gpus: list[GpuPowerLimit]
    error: str | None = Field(None, description="NVML unavailable here: limits cannot be read")


@skill("show_power_limits", capability="read")
def show_power_limits(ctx: SkillContext, inp: ShowPowerLimitsInput) -> ShowPowerLimitsResult:
    """Each GPU's power limit (current, default, min, max, through NVML), the earlier limit
    nightshift recorded when it changed one (restore puts it back; who, when, why), and the power
    model's estimate of training speed and board power at the current limit. Changes nothing."""
    with ctx.store.session() as s:
        records = {r.uuid: r for r in power_record.all_records(s)}
    out: list[GpuPowerLimit] = []
    try:
        control = power_control(ctx)
        indexes = inp.gpus or list(range(control.count()))
    except NightshiftError as exc:
        rows = [_from_record(r) for r in records.values() if not inp.gpus or r.gpu in inp.gpus]
        return ShowPowerLimitsResult(gpus=rows, error=str(exc))
    for index in indexes:
        try:
            limits = control.read(index)
        except NightshiftError as exc:
            out.append(GpuPowerLimit(gpu=index, error=str(exc)))
            continue
        row = GpuPowerLimit(
            gpu=index,
            uuid=limits.uuid,
            name=limits.name,
            current_w=limits.current_w,
            default_w=limits.default_w,
            min_w=limits.min_w,
            max_w=limits.max_w,
        )
        rec = records.get(limits.uuid)
        if rec is not None:
            row.recorded_previous_w, row.set_by, row.set_at, row.reason = (
                rec.previous_w,
                rec.by,
                rec.at,
                rec.reason,
            )
        try:
            model = power_model(limits.name)
            at = model.at(limits.current_w)
            row.estimate = ModelEstimate(
                gpu_type=model.gpu_type,
                throughput=at.throughput,
                busy_watts=at.watts,
                measured=at.measured,
                interpolated=at.interpolated,
                curve=model.curve,
            )
        except PowerModelError as exc:
            row.estimate_note = str(exc)
        out.append(row)
    return ShowPowerLimitsResult(gpus=out)


def _from_record(rec: power_record.PowerLimitRecord) -> GpuPowerLimit:
    return GpuPowerLimit(
        gpu=rec.gpu,
        uuid=rec.uuid,
        name=rec.name,
        current_w=None,
        recorded_previous_w=rec.previous_w,
        set_by=rec.by,
        set_at=rec.at,
        reason=rec.reason,
    )
