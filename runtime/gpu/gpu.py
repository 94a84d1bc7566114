"""GPU probes: what the GPUs on this machine report, read through one interface.

Backends, in the order `auto` tries them: NVML (`nvidia-ml-py`), `nvidia-smi --query-gpu … --format=csv`,
a declared inventory file (machines without GPUs, tests), and nothing (plan for the CPU).

Field value convention, the same for every backend: a field holds a value only when the card
reported one. A field the card does not have (`[N/A]` fan on a passively cooled data-centre GPU,
`NVMLError_NotSupported`) is None and named in `unsupported`; a field that failed to read (`ERR!`,
`[Unknown Error]`, any other NVML error) is None and named in `unreadable`, with the raw text in
`errors`. A field in neither list and None was not reported by this backend at all. A value is
never invented: nothing unreadable is ever stored as 0.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from nightshift.runtime.config import Settings
from nightshift.runtime.errors import SpecError
from nightshift.runtime.gpu.bus import normalize_bus_id as normalize_bus_id
from nightshift.runtime.gpu.driver_messages import DriverMessage, find_driver_messages
from nightshift.runtime.gpu.xid import XidFinding
from nightshift.runtime.yamlfile import read_yaml, validate

FieldStatus = Literal["ok", "unsupported", "unreadable", "absent"]

# Fields without which a GPU cannot be judged healthy.
ESSENTIAL_FIELDS: tuple[str, ...] = (
    "memory_total_mib",
    "memory_used_mib",
    "temperature_c",
    "utilization_pct",
)

# Clock-event (formerly "throttle") reasons, by NVML bit, in nvidia-smi's column names.
THROTTLE_BITS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

NO_GPU_MESSAGE = "no NVIDIA driver or nvidia-smi found; planning for CPU"


class GpuProcess(BaseModel):
    """A compute process running on a GPU."""

    pid: int
    name: str | None = None
    used_memory_mib: int | None = Field(
        None, description="None where the driver cannot tell (WDDM)"
    )


class _GpuFields(BaseModel):
    """The fields of a GPU reading; `index` may be left out only in a declared inventory."""

    index: int | None = None
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    temperature_c: float | None = None
    temp_slowdown_c: float | None = Field(None, description="The card's own slowdown threshold")
    temp_shutdown_c: float | None = Field(None, description="The card's own shutdown threshold")
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    utilization_pct: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_mj: int | None = Field(
        None, description="Total energy counter since the driver loaded (mJ)"
    )
    fan_pct: float | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    retired_pages: int | None = Field(
        None, description="Pages retired for single- and double-bit ECC"
    )
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    throttle_reasons: list[str] | None = Field(
        None, description="Active clock-event reasons; [] when none"
    )
    mig_mode: str | None = None
    driver_version: str | None = Field(
        None, description="The driver's version (nvidia-smi driver_version, NVML's system call)"
    )
    cuda_version: str | None = Field(
        None,
        description="The newest CUDA version the driver supports (NVML's CUDA driver version, "
        "the `CUDA Version:` of nvidia-smi's header)",
    )
    processes: list[GpuProcess] | None = None
    lost: bool = Field(False, description="The driver reports the GPU as lost (fell off the bus)")
    unsupported: list[str] = Field(
        default_factory=list, description="Fields this card does not have"
    )
    unreadable: list[str] = Field(default_factory=list, description="Fields that failed to read")
    errors: dict[str, str] = Field(
        default_factory=dict, description="Raw error text per unreadable field"
    )

    @model_validator(mode="after")
    def _missing_means_none(self) -> Self:
        for name in (*self.unsupported, *self.unreadable):
            if name not in VALUE_FIELDS:
                raise ValueError(f"'{name}' is not a reading field")
            if getattr(self, name) is not None:
                raise ValueError(f"'{name}' is marked missing but holds a value")
        return self

    def status(self, name: str) -> FieldStatus:
        """Whether `name` was read, is not supported by the card, failed to read, or was not reported."""
        if name in self.unreadable:
            return "unreadable"
        if name in self.unsupported:
            return "unsupported"
        return "absent" if getattr(self, name) is None else "ok"

    @property
    def label(self) -> str:
        return f"GPU {self.index}" + (f" ({self.name})" if self.name else "")


class GpuReading(_GpuFields):
    """One GPU as a backend read it. None plus `unsupported`/`unreadable` says why a value is missing."""

    index: int


_META_FIELDS = {
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "lost",
    "unsupported",
    "unreadable",
    "errors",
}
VALUE_FIELDS: frozenset[str] = frozenset(set(GpuReading.model_fields) - _META_FIELDS)


class ProbeResult(BaseModel):
    """What one read of a backend saw."""

    backend: str
    gpus: list[GpuReading] = Field(default_factory=list)
    error: str | None = Field(None, description="Why the backend could not read (all or some GPUs)")
    lost: list[str] = Field(
        default_factory=list,
        description="Lost GPUs: 'index N', a UUID, or a PCI bus id where only that is known",
    )
    message: str | None = Field(
        None, description="Context for a reader, such as why no GPU is visible"
    )
    driver: list[DriverMessage] = Field(
        default_factory=list,
        description="nvidia-smi's own error messages (a lost GPU, a driver that cannot be asked)",
    )
    xids: list[XidFinding] = Field(
        default_factory=list, description="Kernel `NVRM: Xid` findings, per GPU by PCI bus id"
    )
    complete: bool = Field(
        True,
        description="Whether `gpus` lists every GPU the machine has; False for a kernel log, "
        "which names only the GPUs that had errors",
    )


class GpuProbe(Protocol):
    """One interface for every backend. `read` never raises for hardware problems: it reports them."""

    name: str

    def read(self) -> ProbeResult: ...


# --------------------------------------------------------------------------------------- helpers
class _Collector:
    """Fills a reading field by field, sorting each failure into unsupported / unreadable / lost."""

    def __init__(self, index: int, classify: Callable[[BaseException], str]):
        self.values: dict[str, Any] = {"index": index}
        self.unsupported: list[str] = []
        self.unreadable: list[str] = []
        self.errors: dict[str, str] = {}
        self.lost = False
        self._classify = classify

    def take(self, name: str, read: Callable[[], Any]) -> Any:
        if self.lost:
            self.mark_unreadable(name, "GPU is lost")
            return None
        try:
            value = read()
        except Exception as exc:  # noqa: BLE001  (every failure is sorted, none is swallowed silently)
            kind = self._classify(exc)
            if kind == "unsupported":
                if name not in self.unsupported:
                    self.unsupported.append(name)
            else:
                self.mark_unreadable(name, f"{type(exc).__name__}: {exc}")
                self.lost = self.lost or kind == "lost"
            return None
        if value is not None:
            self.values[name] = value
        return value

    def mark_unreadable(self, name: str, text: str) -> None:
        if name not in self.unreadable:
            self.unreadable.append(name)
            self.errors[name] = text

    def reading(self) -> GpuReading:
        values = {
            k: v
            for k, v in self.values.items()
            if k in GpuReading.model_fields and k not in self.unreadable
        }
        unsupported = [
            n for n in self.unsupported if n not in self.unreadable and n in VALUE_FIELDS
        ]
        for name in unsupported:
            values.pop(name, None)
        return GpuReading(
            **values,
            unsupported=unsupported,
            unreadable=[n for n in self.unreadable if n in VALUE_FIELDS],
            errors={k: v for k, v in self.errors.items() if k in VALUE_FIELDS},
            lost=self.lost,
        )


def decode_throttle_mask(mask: int) -> list[str]:
    """Names of the active clock-event reasons in an NVML / nvidia-smi bit mask."""
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


# ------------------------------------------------------------------------------------------ NVML
class NvmlProbe:
    """NVML through `nvidia-ml-py` (imported lazily: a machine without the driver still imports us)."""

    name = "nvml"

    def __init__(self, module: Any = None):
        self._module = module

    def _nvml(self) -> Any:
        if self._module is None:
            import pynvml

            self._module = pynvml
        return self._module

    def available(self) -> tuple[bool, str | None]:
        """True when NVML initialises; else False and the reason (library missing, driver not loaded)."""
        try:
            nv = self._nvml()
        except ImportError as exc:
            return False, f"nvidia-ml-py is not installed ({exc})"
        try:
            nv.nvmlInit()
        except Exception as exc:  # noqa: BLE001  (any NVML init failure means "not this backend")
            return False, f"NVML did not initialise: {exc}"
        _shutdown(nv)
        return True, None

    def read(self) -> ProbeResult:
        try:
            nv = self._nvml()
        except ImportError as exc:
            return ProbeResult(backend=self.name, error=f"nvidia-ml-py is not installed ({exc})")
        try:
            nv.nvmlInit()
        except Exception as exc:  # noqa: BLE001
            return ProbeResult(backend=self.name, error=f"NVML unavailable: {exc}")
        try:
            try:
                count = nv.nvmlDeviceGetCount()
            except Exception as exc:  # noqa: BLE001
                return ProbeResult(backend=self.name, error=f"NVML could not count GPUs: {exc}")
            gpus = [self._read_one(nv, i) for i in range(count)]
        finally:
            _shutdown(nv)
        lost = [f"index {g.index}" for g in gpus if g.lost]
        return ProbeResult(
            backend=self.name,
            gpus=gpus,
            lost=lost,
            error=f"{len(lost)} GPU(s) lost" if lost else None,
        )

    def _classify(self, exc: BaseException) -> str:
        nv = self._module
        code = getattr(exc, "value", None)
        if code is None or not isinstance(exc, getattr(nv, "NVMLError", Exception)):
            return "unreadable"
        if code == getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3):
            return "unsupported"
        if code == getattr(nv, "NVML_ERROR_GPU_IS_LOST", 15):
            return "lost"
        return "unreadable"

    def _read_one(self, nv: Any, index: int) -> GpuReading:
        c = _Collector(index, self._classify)
        handle = c.take("_handle", lambda: nv.nvmlDeviceGetHandleByIndex(index))
        if handle is None:
            reading = c.reading()
            if not reading.lost:
                # Without a handle nothing is readable: say so field by field, never as zeros.
                for name in ESSENTIAL_FIELDS:
                    c.mark_unreadable(name, c.errors.get("_handle", "no device handle"))
                reading = c.reading()
            return reading
        c.take("uuid", lambda: _text(nv.nvmlDeviceGetUUID(handle)))
        c.take("name", lambda: _text(nv.nvmlDeviceGetName(handle)))
        c.take("pci_bus_id", lambda: _text(nv.nvmlDeviceGetPciInfo(handle).busId))
        c.take("temperature_c", lambda: float(_temperature(nv, handle)))
        c.take(
            "temp_slowdown_c",
            lambda: float(
                nv.nvmlDeviceGetTemperatureThreshold(handle, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
            ),
        )
        c.take(
            "temp_shutdown_c",
            lambda: float(
                nv.nvmlDeviceGetTemperatureThreshold(handle, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
            ),
        )
        mem = c.take("_memory", lambda: nv.nvmlDeviceGetMemoryInfo(handle))
        if mem is not None:
            c.values["memory_total_mib"] = int(mem.total) // (1 << 20)
            c.values["memory_used_mib"] = int(mem.used) // (1 << 20)
        else:
            for name in ("memory_total_mib", "memory_used_mib"):
                _copy_status(c, "_memory", name)
        util = c.take("_util", lambda: nv.nvmlDeviceGetUtilizationRates(handle))
        if util is not None:
            c.values["utilization_pct"] = float(util.gpu)
        else:
            _copy_status(c, "_util", "utilization_pct")
        c.take("power_w", lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        c.take("power_limit_w", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)
        c.take("energy_mj", lambda: int(nv.nvmlDeviceGetTotalEnergyConsumption(handle)))
        c.take("fan_pct", lambda: float(nv.nvmlDeviceGetFanSpeed(handle)))
        c.take(
            "ecc_volatile_uncorrected",
            lambda: int(
                nv.nvmlDeviceGetTotalEccErrors(
                    handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                )
            ),
        )
        c.take(
            "ecc_aggregate_uncorrected",
            lambda: int(
                nv.nvmlDeviceGetTotalEccErrors(
                    handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC
                )
            ),
        )
        c.take(
            "retired_pages",
            lambda: sum(
                len(nv.nvmlDeviceGetRetiredPages(handle, cause))
                for cause in (
                    nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                    nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
                )
            ),
        )
        rows = c.take("_remap", lambda: nv.nvmlDeviceGetRemappedRows(handle))
        if rows is not None:
            _corr, _unc, pending, failure = rows
            c.values["remapped_rows_pending"] = bool(pending)
            c.values["remapped_rows_failed"] = bool(failure)
        else:
            for name in ("remapped_rows_pending", "remapped_rows_failed"):
                _copy_status(c, "_remap", name)
        c.take("throttle_reasons", lambda: decode_throttle_mask(int(_event_reasons(nv, handle))))
        c.take("mig_mode", lambda: "Enabled" if nv.nvmlDeviceGetMigMode(handle)[0] else "Disabled")
        # The driver's, not the card's: the same for every GPU, kept with each reading so that an
        # attempt's provenance reads it from its own GPUs' latest reading.
        c.take("driver_version", lambda: _text(nv.nvmlSystemGetDriverVersion()))
        c.take("cuda_version", lambda: cuda_text(_cuda_driver_version(nv)))
        c.take(
            "processes",
            lambda: [_nvml_process(nv, p) for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)],
        )
        return c.reading()


def _shutdown(nv: Any) -> None:
    # A failed shutdown changes nothing about what was read.
    with contextlib.suppress(Exception):
        nv.nvmlShutdown()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _copy_status(c: _Collector, source: str, name: str) -> None:
    if source in c.unsupported:
        c.unsupported.append(name)
    elif source in c.unreadable:
        c.mark_unreadable(name, c.errors[source])


def _temperature(nv: Any, handle: Any) -> int:
    """nvmlDeviceGetTemperatureV where the driver has it (the old call goes away in CUDA 14)."""
    newer = getattr(nv, "nvmlDeviceGetTemperatureV", None)
    if newer is not None:
        try:
            return newer(handle, nv.NVML_TEMPERATURE_GPU)
        except Exception as exc:
            if getattr(exc, "value", None) != getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13):
                raise
    return nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)


def _cuda_driver_version(nv: Any) -> int:
    """nvmlSystemGetCudaDriverVersion_v2 where the bindings have it, else the first version."""
    call = (
        getattr(nv, "nvmlSystemGetCudaDriverVersion_v2", None) or nv.nvmlSystemGetCudaDriverVersion
    )
    return int(call())


def cuda_text(version: int) -> str:
    """NVML's CUDA driver version as people write it: 12040 → '12.4', 13010 → '13.1'."""
    return f"{version // 1000}.{version % 1000 // 10}"


# The first line of nvidia-smi's default table: `| NVIDIA-SMI 590.48.01  Driver Version:
# 590.48.01  CUDA Version: 13.1 |` (the `-q` report prints `CUDA Version : 13.1`).
_CUDA_HEADER = re.compile(r"CUDA Version\s*:\s*([0-9][0-9.]*)")
_DRIVER_HEADER = re.compile(r"Driver Version\s*:\s*([0-9][0-9.]*)")


def versions_in_header(text: str) -> tuple[str | None, str | None]:
    """The driver and CUDA versions nvidia-smi prints at the top of its table and `-q` report."""
    driver, cuda = _DRIVER_HEADER.search(text), _CUDA_HEADER.search(text)
    return (driver.group(1) if driver else None, cuda.group(1) if cuda else None)


def _event_reasons(nv: Any, handle: Any) -> int:
    fn = (
        getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    return fn(handle)


def _nvml_process(nv: Any, p: Any) -> GpuProcess:
    try:
        name = _text(nv.nvmlSystemGetProcessName(p.pid))
    except Exception:  # noqa: BLE001  (the process may have exited between the two calls)
        name = None
    used = getattr(p, "usedGpuMemory", None)
    return GpuProcess(
        pid=int(p.pid),
        name=name,
        used_memory_mib=int(used) // (1 << 20) if used is not None else None,
    )


# ------------------------------------------------------------------------------------ nvidia-smi
# Cells nvidia-smi writes instead of a value (lower case; the text parsers in nvidia_smi_text
# also accept them without brackets): the card lacks the field …
UNSUPPORTED_CELLS = {
    "[n/a]",
    "n/a",
    "[not supported]",
    "not supported",
    "[requested functionality has been deprecated]",
}
# … or the read failed.
ERROR_CELLS = {
    "err!",
    "[unknown error]",
    "unknown error",
    "[gpu is lost]",
    "[gpu requires reset]",
    "[insufficient permissions]",
    "[no data]",
    "[not found]",
}

# query field → reading field, for the plain numeric ones.
_NUMERIC: dict[str, tuple[str, type]] = {
    "temperature.gpu": ("temperature_c", float),
    "memory.total": ("memory_total_mib", int),
    "memory.used": ("memory_used_mib", int),
    "utilization.gpu": ("utilization_pct", float),
    "power.draw": ("power_w", float),
    "fan.speed": ("fan_pct", float),
    "ecc.errors.uncorrected.volatile.total": ("ecc_volatile_uncorrected", int),
    "ecc.errors.uncorrected.aggregate.total": ("ecc_aggregate_uncorrected", int),
}

QUERY_GPU_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "temperature.gpu",
    "memory.total",
    "memory.used",
    "utilization.gpu",
    "power.draw",
    "enforced.power.limit",
    "power.limit",
    "fan.speed",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "clocks_event_reasons.active",
    "mig.mode.current",
    "driver_version",
)
# Older drivers know some fields under another name.
_FIELD_FALLBACKS = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
QUERY_APPS_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "process_name", "used_gpu_memory")


class _Cell:
    """One CSV cell: a value with its unit stripped, or why there is none."""

    def __init__(self, raw: str):
        self.raw = raw.strip()
        low = self.raw.lower()
        self.unsupported = low in UNSUPPORTED_CELLS or low == ""
        self.error = low in ERROR_CELLS or (low.startswith("[") and not self.unsupported)

    def number(self, kind: type) -> Any:
        text = self.raw
        for unit in (" MiB", " W", " %", " MHz", " us", " C", "MiB", "W", "%"):
            if text.endswith(unit):
                text = text[: -len(unit)].strip()
                break
        value = float(text)
        return int(value) if kind is int else value


def _header_key(h: str) -> str:
    """'memory.total [MiB]' → 'memory.total'."""
    return h.split("[", 1)[0].strip().lower()


def _csv_rows(text: str) -> tuple[list[str], list[dict[str, _Cell]], list[str]]:
    """Rows keyed by field name (never by position); lines that are not rows come back as notes."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return [], [], []
    header = [_header_key(h) for h in next(csv.reader([lines[0]], skipinitialspace=True))]
    rows: list[dict[str, _Cell]] = []
    notes: list[str] = []
    for line in lines[1:]:
        cells = next(csv.reader([line], skipinitialspace=True))
        if len(cells) != len(header):
            notes.append(line.strip())
            continue
        rows.append({h: _Cell(v) for h, v in zip(header, cells, strict=True)})
    return header, rows, notes


def _reading_from_row(row: dict[str, _Cell], position: int) -> GpuReading:
    values: dict[str, Any] = {}
    unsupported: list[str] = []
    unreadable: list[str] = []
    errors: dict[str, str] = {}

    def missing(name: str, cell: _Cell) -> bool:
        if cell.error:
            unreadable.append(name)
            errors[name] = cell.raw
            return True
        if cell.unsupported:
            unsupported.append(name)
            return True
        return False

    def put(name: str, cell: _Cell | None, convert: Callable[[_Cell], Any]) -> None:
        if cell is None or missing(name, cell):
            return
        try:
            values[name] = convert(cell)
        except ValueError:
            unreadable.append(name)
            errors[name] = f"cannot parse {cell.raw!r}"

    index_cell = row.get("index")
    try:
        index = int(index_cell.raw) if index_cell is not None else position
    except ValueError:
        index = position
    for key, name in (("uuid", "uuid"), ("name", "name"), ("pci.bus_id", "pci_bus_id")):
        cell = row.get(key)
        if cell is not None and not cell.unsupported and not cell.error:
            values[name] = cell.raw
    for key, (name, kind) in _NUMERIC.items():
        put(name, row.get(key), functools.partial(_Cell.number, kind=kind))
    limit = row.get("enforced.power.limit")
    if limit is None or limit.unsupported:
        limit = row.get("power.limit") or limit
    put("power_limit_w", limit, lambda c: c.number(float))

    # Retired pages: single-bit plus double-bit; one failed cell makes the sum unreadable.
    pages = [
        row[k]
        for k in ("retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count")
        if k in row
    ]
    failed = [p for p in pages if p.error]
    read = [p for p in pages if not p.error and not p.unsupported]
    if failed:
        missing("retired_pages", failed[0])
    elif pages and not read:
        unsupported.append("retired_pages")
    elif read:
        put("retired_pages", read[0], lambda _c: sum(p.number(int) for p in read))
    put("remapped_rows_pending", row.get("remapped_rows.pending"), lambda c: _yes_no(c.raw))
    put("remapped_rows_failed", row.get("remapped_rows.failure"), lambda c: _yes_no(c.raw))
    put("mig_mode", row.get("mig.mode.current"), lambda c: c.raw)
    put("driver_version", row.get("driver_version"), lambda c: c.raw)
    _put_throttle(row, put, values)
    return GpuReading(
        index=index, **values, unsupported=unsupported, unreadable=unreadable, errors=errors
    )


def _put_throttle(row: dict[str, _Cell], put: Callable[..., None], values: dict[str, Any]) -> None:
    for prefix in ("clocks_event_reasons", "clocks_throttle_reasons"):
        mask = row.get(f"{prefix}.active")
        if mask is not None:
            put("throttle_reasons", mask, lambda c: decode_throttle_mask(int(c.raw, 16)))
            return
        flags = {
            k.split(".", 1)[1]: c
            for k, c in row.items()
            if k.startswith(prefix + ".") and k.split(".", 1)[1] in THROTTLE_BITS.values()
        }
        if flags:
            values["throttle_reasons"] = [n for n, c in flags.items() if c.raw.lower() == "active"]
            return


def _yes_no(text: str) -> bool:
    low = text.strip().lower()
    if low in {"yes", "true", "1", "enabled", "active"}:
        return True
    if low in {"no", "false", "0", "disabled", "not active"}:
        return False
    raise ValueError(text)


def parse_query_gpu_csv(text: str) -> list[GpuReading]:
    """Parse `nvidia-smi --query-gpu=… --format=csv` output into readings, columns matched by name."""
    _, rows, _ = _csv_rows(text)
    return [_reading_from_row(row, i) for i, row in enumerate(rows)]


def parse_query_compute_apps_csv(text: str) -> dict[str, list[GpuProcess]]:
    """Parse `nvidia-smi --query-compute-apps=… --format=csv`: processes per GPU UUID."""
    _, rows, _ = _csv_rows(text)
    out: dict[str, list[GpuProcess]] = {}
    for row in rows:
        uuid, pid = row.get("gpu_uuid"), row.get("pid")
        if uuid is None or pid is None:
            continue
        try:
            pid_value = int(pid.raw)
        except ValueError:
            continue
        mem = row.get("used_gpu_memory")
        used = mem.number(int) if mem is not None and not (mem.unsupported or mem.error) else None
        name = row.get("process_name")
        out.setdefault(uuid.raw, []).append(
            GpuProcess(pid=pid_value, name=name.raw if name else None, used_memory_mib=used)
        )
    return out


_HANDLE_ERROR = re.compile(
    r"unable to determine the device handle for gpu\s*"
    r"(?P<bus>[0-9a-f]+:[0-9a-f]+:[0-9a-f]+\.[0-9a-f])?",
    re.IGNORECASE,
)


def lost_in_output(text: str) -> list[str]:
    """PCI bus ids of the GPUs nvidia-smi cannot reach, from lines such as
    'Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost. Reboot the system …'.
    A line without a bus id is returned whole."""
    out = []
    for line in text.splitlines():
        m = _HANDLE_ERROR.search(line)
        if m:
            out.append(m.group("bus") or line.strip())
        elif "gpu is lost" in line.lower():
            out.append(line.strip())
    return out


def _is_device_error(line: str) -> bool:
    return bool(_HANDLE_ERROR.search(line)) or "gpu is lost" in line.lower()


# (nvidia-smi, driver version, runner) → the CUDA version the table's header printed, or why
# none: asked once per driver this process sees (a probe is made for each health check), since
# `--query-gpu` has no field for it; a driver upgraded under the daemon is asked again.
_CUDA_OF_DRIVER: dict[tuple[str, str, object], tuple[str | None, str | None]] = {}


class NvidiaSmiProbe:
    """`nvidia-smi --query-gpu` and `--query-compute-apps`, as an argv list with a timeout."""

    name = "nvidia-smi"

    def __init__(
        self,
        executable: str = "nvidia-smi",
        timeout_s: float = 15.0,
        runner: Callable[[list[str], float], tuple[int, str, str]] | None = None,
    ):
        self.executable = executable
        self.timeout_s = timeout_s
        self._run = runner or _run_argv

    def available(self) -> tuple[bool, str | None]:
        if shutil.which(self.executable):
            return True, None
        return False, f"{self.executable} is not on PATH"

    def query_argv(self, fields: list[str]) -> list[str]:
        return [self.executable, f"--query-gpu={','.join(fields)}", "--format=csv"]

    def apps_argv(self) -> list[str]:
        return [
            self.executable,
            f"--query-compute-apps={','.join(QUERY_APPS_FIELDS)}",
            "--format=csv",
        ]

    def read(self) -> ProbeResult:
        fields = list(QUERY_GPU_FIELDS)
        for _ in range(len(QUERY_GPU_FIELDS) + 1):
            try:
                rc, out, err = self._run(self.query_argv(fields), self.timeout_s)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return ProbeResult(backend=self.name, error=f"{self.executable} failed: {exc}")
            bad = _invalid_field(out + "\n" + err)
            if bad is None or bad not in fields:
                break
            # An older driver does not know a field: ask again without it (or by its old name).
            fields = [_FIELD_FALLBACKS.get(f, "") if f == bad else f for f in fields]
            fields = [f for f in fields if f]
        rows = "\n".join(ln for ln in out.splitlines() if not _is_device_error(ln))
        gpus = parse_query_gpu_csv(rows) if rows.strip().lower().startswith("index") else []
        lost = lost_in_output(out + "\n" + err)
        # nvidia-smi's own error messages ("No devices were found", "Failed to initialize NVML:
        # …") are verdicts on the machine, whatever the exit code.
        driver = find_driver_messages(out + "\n" + err)
        error = None
        if rc != 0 and not gpus:
            error = f"{self.executable} exited {rc}: {(err or out).strip()[:500]}"
        elif lost:
            error = f"{len(lost)} GPU(s) lost"
        elif driver and not gpus:
            error = "; ".join(m.text.replace("\n", " ") for m in driver)
        if gpus:
            self._add_processes(gpus)
            self._add_cuda(gpus)
        return ProbeResult(backend=self.name, gpus=gpus, error=error, lost=lost, driver=driver)

    def _add_cuda(self, gpus: list[GpuReading]) -> None:
        """The CUDA version the driver supports, from the header of nvidia-smi's default table
        (no `--query-gpu` field has it); a header without one leaves it unreadable, with why."""
        driver = next((g.driver_version for g in gpus if g.driver_version), None)
        if driver is None:
            return  # no driver version read: nothing to ask the header about
        key = (self.executable, driver, self._run)
        if key not in _CUDA_OF_DRIVER:
            if len(_CUDA_OF_DRIVER) >= 64:  # runners made per read (a census's replays)
                _CUDA_OF_DRIVER.clear()
            _CUDA_OF_DRIVER[key] = self._read_cuda()
        cuda, why = _CUDA_OF_DRIVER[key]
        for g in gpus:
            if cuda is not None:
                g.cuda_version = cuda
            elif "cuda_version" not in g.unreadable:
                g.unreadable.append("cuda_version")
                g.errors["cuda_version"] = why or "not read"

    def _read_cuda(self) -> tuple[str | None, str | None]:
        try:
            rc, out, err = self._run([self.executable], self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"{self.executable} failed: {exc}"
        _, cuda = versions_in_header(out)
        if cuda is not None:
            return cuda, None
        return (
            None,
            f"{self.executable} printed no `CUDA Version:` (exit {rc}): {(err or out)[:200]}",
        )

    def _add_processes(self, gpus: list[GpuReading]) -> None:
        try:
            rc, out, _ = self._run(self.apps_argv(), self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            for g in gpus:
                g.unreadable.append("processes")
                g.errors["processes"] = str(exc)
            return
        if rc != 0:
            for g in gpus:
                g.unreadable.append("processes")
                g.errors["processes"] = f"exit {rc}"
            return
        by_uuid = parse_query_compute_apps_csv(out)
        for g in gpus:
            g.processes = by_uuid.get(g.uuid or "", [])


def _invalid_field(text: str) -> str | None:
    """nvidia-smi refuses the whole query for one unknown field: 'Field "x" is not a valid field to query.'"""
    for line in text.splitlines():
        if "is not a valid field to query" in line and '"' in line:
            return line.split('"')[1]
    return None


def _run_argv(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    return done.returncode, done.stdout, done.stderr


# ------------------------------------------------------------------------------------- inventory
class InventoryGpu(_GpuFields):
    """A declared GPU: name and memory are required, any current value may be declared too.

    `index` (inherited, optional) defaults to the GPU's position in the list.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    memory_total_mib: int


class Inventory(BaseModel):
    """The inventory file: `gpus:` followed by a list of declared GPUs."""

    model_config = ConfigDict(extra="forbid")

    gpus: list[InventoryGpu] = Field(default_factory=list)


class InventoryProbe:
    """A declared YAML inventory, for machines without GPUs and for tests."""

    name = "inventory"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def read(self) -> ProbeResult:
        try:
            inventory = self.load()
        except SpecError as exc:
            return ProbeResult(backend=self.name, error=str(exc))
        gpus = []
        for pos, g in enumerate(inventory.gpus):
            data = g.model_dump()
            data["index"] = pos if g.index is None else g.index
            gpus.append(GpuReading.model_validate(data))
        lost = [f"index {g.index}" for g in gpus if g.lost]
        return ProbeResult(
            backend=self.name, gpus=gpus, lost=lost, message=f"declared inventory {self.path}"
        )

    def load(self) -> Inventory:
        """Read and validate the file; SpecError names the field and line of the first mistake."""
        data, node, _ = read_yaml(self.path)
        if isinstance(data, list) and node is not None:
            # A bare list of GPUs: read it as `gpus: [...]`, keeping line numbers for errors.
            key = yaml.ScalarNode("tag:yaml.org,2002:str", "gpus", node.start_mark, node.end_mark)
            node = yaml.MappingNode(
                "tag:yaml.org,2002:map", [(key, node)], node.start_mark, node.end_mark
            )
            data = {"gpus": data}
        if not isinstance(data, dict):
            raise SpecError(
                "expected `gpus:` followed by a list of GPUs", path=str(self.path), line=1
            )
        return validate(Inventory, data, path=str(self.path), node=node)


# -------------------------------------------------------------------------------------- no GPUs
class NoGpuProbe:
    """No backend works here: report no GPUs, and why, so that planning falls back to the CPU."""

    name = "none"

    def __init__(self, reason: str | None = None):
        self.reason = reason

    def read(self) -> ProbeResult:
        message = NO_GPU_MESSAGE + (f" ({self.reason})" if self.reason else "")
        return ProbeResult(backend=self.name, gpus=[], message=message)


def make_probe(settings: Settings) -> GpuProbe:
    """The probe `settings.gpu.probe` asks for; `auto` takes the first that works here:
    NVML if it initialises, else nvidia-smi if on PATH, else the inventory if configured, else none."""
    gpu = settings.gpu
    inventory = inventory_path(settings)
    if gpu.probe == "nvml":
        return NvmlProbe()
    if gpu.probe == "nvidia-smi":
        return NvidiaSmiProbe(gpu.nvidia_smi)
    if gpu.probe == "inventory":
        if inventory is None:
            return NoGpuProbe("gpu.probe is 'inventory' but gpu.inventory names no file")
        return InventoryProbe(inventory)
    if gpu.probe == "none":
        return NoGpuProbe("gpu.probe is 'none'")
    why: list[str] = []
    nvml = NvmlProbe()
    ok, reason = nvml.available()
    if ok:
        return nvml
    why.append(f"NVML: {reason}")
    smi = NvidiaSmiProbe(gpu.nvidia_smi)
    ok, reason = smi.available()
    if ok:
        return smi
    why.append(f"nvidia-smi: {reason}")
    if inventory is not None:
        return InventoryProbe(inventory)
    return NoGpuProbe("; ".join(why))


def inventory_path(settings: Settings) -> Path | None:
    """The declared inventory file, resolved against NIGHTSHIFT_HOME; None when none is configured."""
    if not settings.gpu.inventory:
        return None
    p = Path(settings.gpu.inventory).expanduser()
    return p if p.is_absolute() else settings.home_path / p


def health_source(settings: Settings) -> str:
    """Which probe configuration a process judges GPUs with, as recorded with its verdicts:
    the probe kind, with the inventory file where one is read (`auto` may fall back to it) and
    the census for a Ray cluster. Two processes with the same settings share verdicts; a client
    with others (another inventory, `probe: none`) keeps its own and never quarantines the
    daemon's GPUs."""
    gpu = settings.gpu
    if settings.executor.kind == "ray":
        return "ray-census"
    inventory = inventory_path(settings)
    if gpu.probe in ("inventory", "auto") and inventory is not None:
        return f"{gpu.probe}:{inventory}"
    return gpu.probe


def health_sources(settings: Settings) -> tuple[str, str]:
    """The verdicts a process reads: its own source's, and those recorded before sources
    (revision 0013), which a newer verdict of its own replaces."""
    return health_source(settings), ""
