"""How much a GPU draws and how fast it trains under a power limit, from published measurements.

A power cap trades time for energy: Zeus (NSDI '23) measured each power limit of a V100 and an
A40 over whole epochs, and a cap of 60 % saves about a fifth of the energy for a fifth more time.
This module answers, for a GPU type, a limit and a busy or idle GPU, the board's watts and the
throughput relative to the largest limit, and the time and energy of a job whose duration at full
power is known. The figures live in `power_model.yaml` beside this file, each with its source;
between two measured limits the answer is a linear interpolation and says so; a type measured on
another card's curve says `measured: false`.

Pure and deterministic: the simulator calls it per busy GPU, the scheduler per decision:

    m = power_model("H100")                  # a type key or an NVML product name
    r = m.at(limit_w, busy=True)             # r.watts for the energy of each busy interval,
                                             # r.throughput: work done per second (1.0 uncapped)
    m.at(limit_w, busy=False, idle_w=60.0)   # an idle GPU (idle_w where none is published)
    job = m.job_under_cap(full_power_s, limit_w)   # job.duration_s, job.energy_j
"""

from __future__ import annotations

from bisect import bisect_left
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from nightshift.runtime.errors import BadArguments

DATA_PATH = Path(__file__).with_name("power_model.yaml")


class PowerModelError(BadArguments):
    """A GPU type the model does not know, or a limit outside what was measured for it."""


class Reading(BaseModel):
    """The model's answer at one limit."""

    model_config = ConfigDict(frozen=True)

    gpu_type: str
    limit_w: float
    watts: float = Field(description="Board power: at the limit's measured draw if busy, else idle")
    throughput: float = Field(description="Work per second relative to the largest limit (1.0)")
    interpolated: bool = Field(description="Between two measured limits, not at one")
    measured: bool = Field(description="False where the curve is another GPU type's, scaled")


class CappedJob(BaseModel):
    """A job of known duration at full power, run under a cap."""

    model_config = ConfigDict(frozen=True)

    gpu_type: str
    limit_w: float
    duration_s: float
    energy_j: float
    mean_watts: float
    full_power_duration_s: float
    full_power_energy_j: float
    interpolated: bool
    measured: bool


class GpuPowerModel(BaseModel):
    """One GPU type: its limit constraints, idle draw and curve in this card's watts."""

    model_config = ConfigDict(frozen=True)

    gpu_type: str
    match: tuple[str, ...]
    min_w: float = Field(description="Smallest limit the model answers for")
    max_w: float
    default_w: float
    idle_w: float | None
    measured: bool
    curve: str
    sources: tuple[str, ...]
    # Measured points, ascending in limit: (limit W, relative throughput, busy board W).
    points: tuple[tuple[float, float, float], ...]

    def check_limit(self, limit_w: float) -> None:
        """Refuse a limit outside the modelled range, naming the range."""
        if not self.min_w - 1e-9 <= limit_w <= self.max_w + 1e-9:
            raise PowerModelError(
                f"limit_w: {limit_w:g} W is outside the {self.gpu_type} power model's range "
                f"{self.min_w:g}-{self.max_w:g} W (curve {self.curve}); pick a limit in it"
            )

    def at(self, limit_w: float, *, busy: bool = True, idle_w: float | None = None) -> Reading:
        """Watts and relative throughput at `limit_w`. Idle board power is the type's published
        idle figure, or `idle_w` where none is published (a limit does not change idle draw)."""
        self.check_limit(limit_w)
        throughput, busy_w, interpolated = self._interpolate(limit_w)
        if busy:
            watts = busy_w
        else:
            idle = self.idle_w if self.idle_w is not None else idle_w
            if idle is None:
                raise PowerModelError(
                    f"idle_w: no published idle power for {self.gpu_type}; pass idle_w "
                    "(e.g. the GPU's own reading at 0 % utilisation)"
                )
            watts = idle
        return Reading(
            gpu_type=self.gpu_type,
            limit_w=limit_w,
            watts=watts,
            throughput=throughput if busy else 0.0,
            interpolated=interpolated,
            measured=self.measured,
        )

    def throughput_factor(self, limit_w: float) -> float:
        """Work per second under `limit_w`, relative to the largest limit (1.0)."""
        return self.at(limit_w).throughput

    def busy_watts(self, limit_w: float) -> float:
        return self.at(limit_w).watts

    def least_energy_limit(self) -> float:
        """The measured limit with the least energy per unit of work (watts / throughput):
        where a cap trades the most energy for the time it costs (the daemon's peak cap)."""
        return min(self.points, key=lambda p: p[2] / p[1])[0]

    def job_under_cap(self, full_power_duration_s: float, limit_w: float) -> CappedJob:
        """A job that takes `full_power_duration_s` at the largest limit, run at `limit_w`: it
        takes longer by 1/throughput and draws the limit's busy power all along."""
        if full_power_duration_s < 0:
            raise PowerModelError(
                f"full_power_duration_s: {full_power_duration_s:g} is negative; give seconds >= 0"
            )
        capped = self.at(limit_w)
        full = self.at(self.max_w)
        duration = full_power_duration_s / capped.throughput
        return CappedJob(
            gpu_type=self.gpu_type,
            limit_w=limit_w,
            duration_s=duration,
            energy_j=capped.watts * duration,
            mean_watts=capped.watts,
            full_power_duration_s=full_power_duration_s,
            full_power_energy_j=full.watts * full_power_duration_s,
            interpolated=capped.interpolated,
            measured=self.measured,
        )

    def _interpolate(self, limit_w: float) -> tuple[float, float, bool]:
        limits = [p[0] for p in self.points]
        i = bisect_left(limits, limit_w - 1e-9)
        if i < len(limits) and abs(limits[i] - limit_w) <= 1e-9:
            _, tput, watts = self.points[i]
            return tput, watts, False
        if i == 0:  # below the curve: only where min_w allows it, which it does not
            raise PowerModelError(f"limit_w: {limit_w:g} W is below the measured curve")
        (l0, t0, w0), (l1, t1, w1) = self.points[i - 1], self.points[i]
        f = (limit_w - l0) / (l1 - l0)
        return t0 + f * (t1 - t0), w0 + f * (w1 - w0), True


class PowerModels(BaseModel):
    """Every type in the data file, and the sources they name."""

    gpus: dict[str, GpuPowerModel]

    def for_gpu(self, name: str) -> GpuPowerModel:
        """The model for a type key ("H100") or an NVML product name ("NVIDIA H100 80GB HBM3")."""
        if name in self.gpus:
            return self.gpus[name]
        low = name.lower()
        for model in self.gpus.values():
            if any(m.lower() in low for m in model.match):
                return model
        raise PowerModelError(
            f"gpu: no power model for {name!r}; known types: {', '.join(self.gpus)} "
            "(product names containing "
            + "; ".join(f"{k}: {', '.join(m.match)}" for k, m in self.gpus.items())
            + ")"
        )


def _relative_curve(raw: dict[str, Any]) -> list[tuple[float, float, float]]:
    """[(limit W, throughput relative to the largest limit, board W)] from published points."""
    pts = sorted((float(lim), float(sec), float(w)) for lim, sec, w in raw["points"])
    fastest = pts[-1][1]
    return [(lim, fastest / sec, w) for lim, sec, w in pts]


def load(data: dict[str, Any]) -> PowerModels:
    """Build the models from the data file's contents (a test may hand its own)."""
    curves = {name: _relative_curve(raw) for name, raw in data["curves"].items()}
    gpus: dict[str, GpuPowerModel] = {}
    for key, raw in data["gpus"].items():
        measured = "curve" in raw
        curve_name = raw["curve"] if measured else raw["borrowed_from"]
        curve = curves[curve_name]
        max_w = float(raw["max_w"])
        if measured:
            points = curve
        else:  # another card's curve, at the same fraction of the largest limit
            src_max = curve[-1][0]
            points = [(lim / src_max * max_w, t, w / src_max * max_w) for lim, t, w in curve]
        lowest = points[0][0]
        min_w = max(float(raw["min_w"]), lowest) if raw.get("min_w") is not None else lowest
        gpus[key] = GpuPowerModel(
            gpu_type=key,
            match=tuple(raw["match"]),
            min_w=min_w,
            max_w=max_w,
            default_w=float(raw["default_w"]),
            idle_w=None if raw.get("idle_w") is None else float(raw["idle_w"]),
            measured=measured,
            curve=curve_name,
            sources=tuple(raw["sources"]),
            points=tuple(points),
        )
    return PowerModels(gpus=gpus)


@cache
def power_models() -> PowerModels:
    """The shipped models (read once per process)."""
    return load(yaml.safe_load(DATA_PATH.read_text()))


def power_model(gpu: str) -> GpuPowerModel:
    """The shipped model for a type key or an NVML product name."""
    return power_models().for_gpu(gpu)
