"""A stand-in for `pynvml` (nvidia-ml-py) on a machine without GPUs: the constants and calls that
NvmlProbe and the power-limit control use, over GPUs described as dicts built from the real
nvidia-smi captures in tests/fixtures/nvidia_smi. `fail` maps a call to an NVML error code.

In-process, a test puts `fake_pynvml([...])` in sys.modules["pynvml"]; a subprocess (the real CLI)
gets tests/fake_nvml/ on PYTHONPATH, whose pynvml.py builds one from a JSON state file."""

from __future__ import annotations

import types
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

MIB = 1 << 20

NVML_ERRORS = {
    "NotSupported": 3,
    "DriverNotLoaded": 9,
    "LibraryNotFound": 12,
    "GpuIsLost": 15,
    "Unknown": 999,
    "NoPermission": 4,
    "InvalidArgument": 2,
}


def fake_pynvml(
    gpus: list[dict[str, Any]],
    init_error: int | None = None,
    on_change: Callable[[], None] | None = None,
) -> types.ModuleType:
    """A stand-in for `pynvml` with the constants and calls NvmlProbe uses; `fail` maps a call to an error code."""
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value: int):
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            names = {v: k for k, v in NVML_ERRORS.items()}
            return names.get(self.value, f"NVML error {self.value}")

    nv.NVMLError = NVMLError
    for name in NVML_ERRORS:
        setattr(nv, f"NVMLError_{name}", type(f"NVMLError_{name}", (NVMLError,), {}))
    consts = {
        "NVML_ERROR_NOT_SUPPORTED": 3,
        "NVML_ERROR_GPU_IS_LOST": 15,
        "NVML_ERROR_NO_PERMISSION": 4,
        "NVML_ERROR_INVALID_ARGUMENT": 2,
        "NVML_TEMPERATURE_GPU": 0,
        "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN": 0,
        "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN": 1,
        "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
        "NVML_VOLATILE_ECC": 0,
        "NVML_AGGREGATE_ECC": 1,
        "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS": 0,
        "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR": 1,
    }
    for k, v in consts.items():
        setattr(nv, k, v)
    state: dict[str, Any] = {"inits": 0, "sets": []}

    def call(fn: str, compute):
        def f(handle, *args):
            gpu = gpus[handle]
            if fn in gpu.get("fail", {}):
                raise NVMLError(gpu["fail"][fn])
            return compute(gpu, *args)

        return f

    def init() -> None:
        if init_error is not None:
            raise NVMLError(init_error)
        state["inits"] += 1

    def handle(i: int) -> int:
        if "handle" in gpus[i].get("fail", {}):
            raise NVMLError(gpus[i]["fail"]["handle"])
        return i

    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: state.__setitem__("inits", state["inits"] - 1)
    nv.nvmlDeviceGetCount = lambda: len(gpus)
    nv.nvmlDeviceGetHandleByIndex = handle
    nv.nvmlDeviceGetUUID = call("uuid", lambda g: g["uuid"])
    nv.nvmlDeviceGetName = call("name", lambda g: g["name"].encode())
    nv.nvmlDeviceGetPciInfo = call("pci", lambda g: SimpleNamespace(busId=g["bus_id"].encode()))
    nv.nvmlDeviceGetTemperature = call("temperature", lambda g, sensor: g["temp"])
    nv.nvmlDeviceGetTemperatureThreshold = call(
        "threshold", lambda g, which: g["thresholds"][which]
    )
    nv.nvmlDeviceGetMemoryInfo = call(
        "memory",
        lambda g: SimpleNamespace(
            total=g["mem_total_mib"] * MIB, used=g["mem_used_mib"] * MIB, free=0
        ),
    )
    nv.nvmlDeviceGetUtilizationRates = call(
        "utilization", lambda g: SimpleNamespace(gpu=g["util"], memory=0)
    )
    nv.nvmlDeviceGetPowerUsage = call("power", lambda g: g["power_mw"])
    nv.nvmlDeviceGetEnforcedPowerLimit = call("power_limit", lambda g: g["limit_mw"])
    nv.nvmlDeviceGetTotalEnergyConsumption = call("energy", lambda g: g["energy_mj"])
    nv.nvmlDeviceGetFanSpeed = call("fan", lambda g: g["fan"])
    nv.nvmlDeviceGetTotalEccErrors = call("ecc", lambda g, kind, counter: g["ecc"][counter])
    nv.nvmlDeviceGetRetiredPages = call("retired", lambda g, cause: [0x1000] * g["retired"][cause])
    nv.nvmlDeviceGetRemappedRows = call("remap", lambda g: g["remap"])
    nv.nvmlDeviceGetCurrentClocksEventReasons = call("reasons", lambda g: g["reasons"])
    nv.nvmlDeviceGetMigMode = call("mig", lambda g: [g["mig"], g["mig"]])
    nv.nvmlDeviceGetComputeRunningProcesses = call(
        "processes",
        lambda g: [
            SimpleNamespace(pid=pid, usedGpuMemory=None if used is None else used * MIB)
            for pid, _, used in g["procs"]
        ],
    )
    names = {pid: name for g in gpus for pid, name, _ in g["procs"]}
    nv.nvmlSystemGetProcessName = lambda pid: names[pid].encode()

    def system(key: str) -> Any:
        """The driver's own calls take no handle: one machine, one driver (the first GPU's)."""
        first = gpus[0] if gpus else {}
        if key in first.get("fail", {}):
            raise NVMLError(first["fail"][key])
        return first[key]

    nv.nvmlSystemGetDriverVersion = lambda: system("driver")
    nv.nvmlSystemGetCudaDriverVersion_v2 = lambda: system("cuda")
    # Power management: the limit's constraints, default and current value (milliwatts), and
    # setting it, which NVML checks against the constraints (INVALID_ARGUMENT) and the caller's
    # rights (NO_PERMISSION: `fail={"set_limit": 4}`, as for a user who is not root).
    nv.nvmlDeviceGetPowerManagementLimitConstraints = call(
        "constraints", lambda g: [g["min_limit_mw"], g["max_limit_mw"]]
    )
    nv.nvmlDeviceGetPowerManagementDefaultLimit = call(
        "default_limit", lambda g: g["default_limit_mw"]
    )
    nv.nvmlDeviceGetPowerManagementLimit = call("power_limit", lambda g: g["limit_mw"])

    def set_limit(g: dict[str, Any], milliwatts: int) -> None:
        if not g["min_limit_mw"] <= milliwatts <= g["max_limit_mw"]:
            raise NVMLError(NVML_ERRORS["InvalidArgument"])
        g["limit_mw"] = milliwatts
        state["sets"].append((g["uuid"], milliwatts))
        if on_change is not None:
            on_change()

    nv.nvmlDeviceSetPowerManagementLimit = call("set_limit", set_limit)
    nv.state = state
    return nv


def h100(**over: Any) -> dict[str, Any]:
    """GPU 0 of the H100 capture under load, values from h100_80gb_load_q.txt."""
    gpu: dict[str, Any] = {
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "name": "NVIDIA H100 80GB HBM3",
        "bus_id": "00000000:00:09.0",
        "temp": 59,
        "mem_total_mib": 81559,
        "mem_used_mib": 19818,
        "util": 100,
        "power_mw": 629450,
        "limit_mw": 700000,
        # The capture's -q: Default Power Limit 700.00 W, Min 200.00 W, Max 700.00 W.
        "default_limit_mw": 700000,
        "min_limit_mw": 200000,
        "max_limit_mw": 700000,
        "fan": None,
        "reasons": 0,
        "mig": 0,
        "energy_mj": 987654321,
        "thresholds": {0: 92, 1: 87},  # not in the capture: made up
        "ecc": {0: 0, 1: 0},
        "retired": {0: 0, 1: 0},
        "remap": (0, 0, 0, 0),
        # The capture's header: Driver Version: 590.48.01, CUDA Version: 13.1 (NVML: 13010).
        "driver": "590.48.01",
        "cuda": 13010,
        "procs": [
            (11327, "/root/tools/memhog", 2566),
            (11328, "/root/tools/memhog", 1542),
            (11345, "./gpu_burn", 15690),
        ],
        # Fan Speed and Retired Pages read N/A on this card (it remaps rows instead).
        "fail": {"fan": 3, "retired": 3},
    }
    gpu.update(over)
    return gpu


def h200_mig() -> dict[str, Any]:
    """The idle H200 with MIG enabled (h200_mig_idle_table.txt): utilisation is N/A under MIG."""
    return h100(
        uuid="GPU-h200",
        name="NVIDIA H200",
        bus_id="00000000:83:00.0",
        temp=28,
        mem_total_mib=143771,
        mem_used_mib=55,
        power_mw=78000,
        limit_mw=700000,
        mig=1,
        procs=[],
        fail={"fan": 3, "retired": 3, "utilization": 3},
    )


def rtx2080() -> dict[str, Any]:
    """The idle Windows RTX 2080 SUPER (win_rtx2080super_idle_table.txt): no ECC, WDDM hides process memory."""
    return h100(
        uuid="GPU-df6e7a7c-7314-46f8-abc4-b88b36dcf3aa",
        name="NVIDIA GeForce RTX 2080 SUPER",
        bus_id="00000000:0C:00.0",
        temp=40,
        mem_total_mib=8192,
        mem_used_mib=702,
        util=0,
        power_mw=38000,
        limit_mw=250000,
        fan=37,
        driver="591.86",  # the capture's header: Driver Version: 591.86, CUDA Version: 13.1
        procs=[(2056, r"C:\Windows\System32\dwm.exe", None)],
        fail={"ecc": 3, "retired": 3, "remap": 3, "mig": 3},
    )
