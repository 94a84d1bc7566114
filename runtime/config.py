"""Settings: one pydantic model, defaults that make the embedded default work with no file at all.

Precedence (highest first): environment `NIGHTSHIFT_<SECTION>__<KEY>`, `$NIGHTSHIFT_HOME/config.yaml`
(or an explicit path), built-in defaults. `sources()` says where each effective value came from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError

from nightshift.runtime.backoff import Backoff
from nightshift.runtime.errors import ConfigError
from nightshift.runtime.tariff import Tariff


def nightshift_home() -> Path:
    """The state folder: `$NIGHTSHIFT_HOME`, else `~/.nightshift`."""
    return Path(os.environ.get("NIGHTSHIFT_HOME") or Path.home() / ".nightshift").expanduser()


class StoreSettings(BaseModel):
    url: str | None = Field(None, description="SQLAlchemy URL; default sqlite:///$NIGHTSHIFT_HOME/nightshift.db")
    busy_timeout_s: float = Field(30.0, gt=0, description="How long a write waits for another process's lock")


class ExecutorSettings(BaseModel):
    kind: Literal["local", "docker"] = Field("local", description="local processes, or Docker "
                                             "containers for specs that name an image")
    runs_dir: str | None = Field(None, description="Where attempt logs go; default $NIGHTSHIFT_HOME/runs")
    stop_grace_s: float = 10.0
    docker_url: str | None = Field(None, description="Docker engine socket; default $DOCKER_HOST")
    network_mode: str = Field("none", description="Container network unless the spec names one")
    pids_limit: int | None = Field(4096, description="Max processes per container")


class GpuSettings(BaseModel):
    probe: Literal["auto", "nvml", "nvidia-smi", "inventory", "none"] = "auto"
    inventory: str | None = Field(None, description="Declared inventory file (YAML) for the inventory probe")
    nvidia_smi: str = "nvidia-smi"


class HealthThresholds(BaseModel):
    """Thresholds for the GPU verdict; each reason in a verdict names the one it crossed."""

    temp_warning_c: float = 83.0
    temp_critical_c: float = 90.0
    memory_used_warning_frac: float = 0.95
    power_warning_frac: float = 0.98
    ecc_uncorrected_critical: int = 1
    retired_pages_warning: int = 1


class PolicySettings(BaseModel):
    file: str | None = Field(None, description="Policy YAML; default: the shipped policies/default.yaml")
    principal: str | None = Field(None, description="Name for the local OS user; default: $USER")


class LoopSettings(BaseModel):
    poll_interval_s: float = 0.5
    cpu_slots: int = Field(1, ge=1, description="CPU-only jobs that may run at once")
    health_interval_min: float = Field(10.0, gt=0, description="The daemon checks GPU health this often")


class SchedulerSettings(BaseModel):
    """How placement weighs and holds queued work (see runtime/placement.py)."""

    aging_per_hour: float = Field(1.0, ge=0, description="Priority points a waiting job gains per hour")
    preempt_margin: int | None = Field(None, ge=1, description="Pause a running pausable job for a "
                                       "waiting one this much more urgent; None: never preempt")
    preempt_max_per_call: int = Field(4, ge=1)
    default_duration_min: float = Field(60.0, gt=0, description="For jobs with no expectation or history")
    cost_threshold_per_kwh: float | None = Field(None, ge=0, description="cost_sensitive jobs start "
                                                 "at or below this price; None: the cheapest band")
    tariff_horizon_h: float = Field(168.0, gt=0)
    long_job_start_grace_min: float = Field(30.0, ge=0)
    display_tz: str | None = Field(None, description="Zone for times in hold reasons; default: the tariff's")


class Settings(BaseModel):
    home: str
    store: StoreSettings = StoreSettings()
    executor: ExecutorSettings = ExecutorSettings()
    gpu: GpuSettings = GpuSettings()
    health: HealthThresholds = HealthThresholds()
    policy: PolicySettings = PolicySettings()
    loop: LoopSettings = LoopSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    retry: Backoff = Backoff()
    tariff: Tariff | None = Field(None, description="Time-of-use price windows; None: no tariff holds")

    @property
    def home_path(self) -> Path:
        return Path(self.home)

    @property
    def store_url(self) -> str:
        return self.store.url or f"sqlite:///{self.home_path / 'nightshift.db'}"

    @property
    def runs_dir(self) -> Path:
        return Path(self.executor.runs_dir) if self.executor.runs_dir else self.home_path / "runs"


def _env_overrides() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, value in os.environ.items():
        if not key.startswith("NIGHTSHIFT_") or "__" not in key:
            continue
        section, _, field = key[len("NIGHTSHIFT_"):].lower().partition("__")
        out.setdefault(section, {})[field] = yaml.safe_load(value) if value else value
    return out


def load_settings(path: str | Path | None = None) -> Settings:
    """Defaults ← config file ← environment. Raises ConfigError naming the field."""
    settings, _ = load_settings_with_sources(path)
    return settings


def load_settings_with_sources(path: str | Path | None = None) -> tuple[Settings, dict[str, str]]:
    home = nightshift_home()
    cfg_path = Path(path) if path else home / "config.yaml"
    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if cfg_path.exists():
        try:
            loaded = yaml.safe_load(cfg_path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{cfg_path}: not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{cfg_path}: expected a mapping of sections")
        for section, values in loaded.items():
            data[section] = dict(values or {})
            for k in values or {}:
                sources[f"{section}.{k}"] = str(cfg_path)
    elif path:
        raise ConfigError(f"--config {cfg_path}: file not found")
    for section, values in _env_overrides().items():
        data.setdefault(section, {}).update(values)
        for k in values:
            sources[f"{section}.{k}"] = f"env NIGHTSHIFT_{section.upper()}__{k.upper()}"
    try:
        settings = Settings(home=str(home), **data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"config field {where}: {first['msg']} (from {sources.get(where, 'defaults')})") from exc
    return settings, sources
