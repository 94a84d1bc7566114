"""set_power_limit: cap one GPU's board power through NVML, recorded and reversible.

A lower limit trades a little speed for a lot less energy (Zeus, NSDI '23), but it outlives the
job that asked for it and it changes the machine for everyone: the policy asks a person (or an
admin) to confirm, the limit the card had before is kept in the store before anything changes,
and `restore` puts that one back."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field, model_validator

from nightshift.runtime.errors import BadArguments, SkillFailed
from nightshift.runtime.gpu import power_record
from nightshift.runtime.gpu.power_limit import (
    NvmlPowerControl,
    PowerControlUnavailable,
    PowerLimits,
)
from nightshift.runtime.gpu.power_record import PowerLimitRecord
from nightshift.skills.base import Claims, SkillContext, SkillInput, skill


class SetPowerLimitInput(SkillInput):
    gpu: int = Field(ge=0, description="GPU index, as nvidia-smi numbers it")
    watts: float | None = Field(
        None,
        gt=0,
        description="The new power limit in watts, within the GPU's min and max limits; "
        "omit it with restore",
    )
    fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="The new limit as a fraction of the GPU's default limit (0.7: 70 %), "
        "instead of watts; a policy rule can bound it for every card alike",
    )
    restore: bool = Field(
        False,
        description="Put back the limit the GPU had before nightshift changed it (as recorded)",
    )
    reason: str = Field("", max_length=500, description="Why; recorded with the change")

    @model_validator(mode="after")
    def _one_action(self) -> SetPowerLimitInput:
        given = (self.watts is not None) + (self.fraction is not None) + self.restore
        if given != 1:
            raise ValueError(
                "give either watts (a new limit), fraction (of the default limit) or "
                "restore: true, one of them"
            )
        return self

    def claims(self) -> Claims:
        return Claims()  # no job, no launch: the approval rule names the skill


class SetPowerLimitResult(BaseModel):
    gpu: int
    uuid: str
    name: str
    before_w: float
    after_w: float
    default_w: float
    min_w: float
    max_w: float
    restored: bool = Field(description="True: the recorded limit was put back")
    recorded_previous_w: float | None = Field(
        description="The limit `restore` would put back; None once restored"
    )
    by: str
    at: datetime
    reason: str


def power_control(ctx: SkillContext) -> NvmlPowerControl:
    """This machine's GPUs through NVML, where the settings read them from the hardware
    (`gpu.probe` auto or nvml). With a declared inventory, nvidia-smi only or no probe, nightshift
    does not drive the hardware: GPUs it reads from a file are never changed by it."""
    probe = ctx.settings.gpu.probe
    if probe not in ("auto", "nvml"):
        raise PowerControlUnavailable(
            f"power limits are set through NVML, and gpu.probe is {probe!r}: this install does "
            "not read its GPUs through NVML, so it does not change them either (set gpu.probe "
            "to auto or nvml on the GPUs' machine)"
        )
    return NvmlPowerControl()


@skill("set_power_limit", capability="modify")
def set_power_limit(ctx: SkillContext, inp: SetPowerLimitInput) -> SetPowerLimitResult:
    """Set one GPU's power limit (watts, or a fraction of its default limit) through NVML, or
    restore: true to put back the limit it
    had before nightshift first changed it. The previous limit is recorded in the store, with
    who, when and why, before the change is made. A value outside the GPU's own min/max limits is
    refused, naming the range; NVML's 'no permission' (setting a limit needs root) is reported as
    such. Lower limits save energy for some speed (see `nightshift power show` for the model's
    estimate); a person or an admin confirms each change (the daemon's own cap at peak price
    goes without one where the policy's waivers allow it)."""
    control = power_control(ctx)
    before = control.read(inp.gpu)
    if inp.restore:
        return _restore(ctx, inp, control, before)
    watts = float(inp.watts) if inp.watts is not None else of_default(inp.fraction, before)
    check_range(watts, before)
    with ctx.store.write_session() as s:
        earlier = power_record.get(s, before.uuid)
        record = PowerLimitRecord(
            uuid=before.uuid,
            gpu=inp.gpu,
            name=before.name,
            previous_w=earlier.previous_w if earlier is not None else before.current_w,
            set_w=watts,
            by=ctx.principal,
            at=ctx.now,
            reason=inp.reason,
        )
        power_record.put(s, record)  # recorded before the card changes: a crash keeps it
    try:
        after = control.set(inp.gpu, watts)
    except Exception:
        with ctx.store.write_session() as s:  # nothing changed: the record goes back as it was
            if earlier is None:
                power_record.delete(s, before.uuid)
            else:
                power_record.put(s, earlier)
        raise
    return _result(inp, ctx, before, after, record.previous_w, restored=False)


def of_default(fraction: float | None, limits: PowerLimits) -> float:
    """A fraction of the card's default limit in watts, to the milliwatt NVML takes; within a
    milliwatt of a bound it is the bound (a fraction is rounded, the card's range is not)."""
    watts = round(float(fraction or 0) * limits.default_w, 3)
    for bound in (limits.min_w, limits.max_w):
        if abs(watts - bound) <= 0.001:
            return bound
    return watts


def check_range(watts: float, limits: PowerLimits) -> None:
    """A limit outside the GPU's own constraints is the caller's to fix: say the range."""
    if not limits.min_w <= watts <= limits.max_w:
        raise BadArguments(
            f"set_power_limit: watts: {watts:g} W is outside GPU {limits.index}'s "
            f"({limits.name}) allowed range {limits.min_w:g}-{limits.max_w:g} W "
            f"(default {limits.default_w:g} W)"
        )


def _restore(
    ctx: SkillContext, inp: SetPowerLimitInput, control: NvmlPowerControl, before: PowerLimits
) -> SetPowerLimitResult:
    with ctx.store.session() as s:
        record = power_record.get(s, before.uuid)
    if record is None:
        raise SkillFailed(
            f"set_power_limit: nothing to restore on GPU {inp.gpu} ({before.name}): nightshift "
            f"has no recorded change of its limit (now {before.current_w:g} W, default "
            f"{before.default_w:g} W); set one with watts instead"
        )
    after = control.set(inp.gpu, record.previous_w)
    with ctx.store.write_session() as s:
        power_record.delete(s, before.uuid)
    return _result(inp, ctx, before, after, None, restored=True)


def _result(
    inp: SetPowerLimitInput,
    ctx: SkillContext,
    before: PowerLimits,
    after: PowerLimits,
    previous: float | None,
    *,
    restored: bool,
) -> SetPowerLimitResult:
    return SetPowerLimitResult(
        gpu=inp.gpu,
        uuid=after.uuid,
        name=after.name,
        before_w=before.current_w,
        after_w=after.current_w,
        default_w=after.default_w,
        min_w=after.min_w,
        max_w=after.max_w,
        restored=restored,
        recorded_previous_w=previous,
        by=ctx.principal,
        at=ctx.now,
        reason=inp.reason,
    )
