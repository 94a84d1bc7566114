"""A GPU's power limit through NVML: read its constraints and current value, set a new one.

Setting a limit needs root (or a driver configured to let others), and not every card supports
it: those are answers NVML gives, turned here into typed errors that say what to do, never a
traceback. `nvidia-ml-py` is imported lazily, as for the health probe: a machine without the
driver still imports us.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pydantic import BaseModel

from nightshift.runtime.errors import OperatorError, SkillFailed

NO_PERMISSION = 4  # NVML_ERROR_NO_PERMISSION
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED


class PowerControlUnavailable(SkillFailed):
    """NVML is missing, the GPU is not there, or the card does not let its limit be read or set."""


class PowerLimitDenied(OperatorError):
    """NVML refused to change the limit for lack of permission (root, or the driver's settings)."""


class PowerLimits(BaseModel):
    """One GPU's power-limit state, in watts."""

    index: int
    uuid: str
    name: str
    current_w: float
    default_w: float
    min_w: float
    max_w: float


class NvmlPowerControl:
    """Reads and sets power limits by GPU index (the index nvidia-smi shows)."""

    def __init__(self, module: Any = None):
        self._module = module

    def _nvml(self) -> Any:
        if self._module is None:
            try:
                import pynvml
            except ImportError as exc:
                raise PowerControlUnavailable(
                    f"power limits need NVML: nvidia-ml-py is not installed ({exc})"
                ) from exc
            self._module = pynvml
        return self._module

    def count(self) -> int:
        """How many GPUs NVML sees."""
        with self._session() as nv:
            return self._count(nv)

    def read(self, index: int) -> PowerLimits:
        """The limit's constraints and current value."""
        with self._session() as nv:
            return self._read(nv, self._handle(nv, index), index)

    def set(self, index: int, watts: float) -> PowerLimits:
        """Set the limit (NVML takes milliwatts) and read it back."""
        with self._session() as nv:
            handle = self._handle(nv, index)
            try:
                nv.nvmlDeviceSetPowerManagementLimit(handle, round(watts * 1000))
            except Exception as exc:  # noqa: BLE001  (NVMLError; classified below)
                raise self._refusal(exc, index, "set its power limit") from exc
            return self._read(nv, handle, index)

    @contextlib.contextmanager
    def _session(self) -> Any:
        nv = self._nvml()
        try:
            nv.nvmlInit()
        except Exception as exc:  # noqa: BLE001  (any init failure: no NVML here)
            raise PowerControlUnavailable(f"NVML did not initialise: {exc}") from exc
        try:
            yield nv
        finally:
            with contextlib.suppress(Exception):
                nv.nvmlShutdown()

    def _count(self, nv: Any) -> int:
        try:
            return int(nv.nvmlDeviceGetCount())
        except Exception as exc:  # noqa: BLE001
            raise PowerControlUnavailable(f"NVML could not count GPUs: {exc}") from exc

    def _handle(self, nv: Any, index: int) -> Any:
        count = self._count(nv)
        if not 0 <= index < count:
            raise PowerControlUnavailable(
                f"gpu: there is no GPU {index} here (NVML sees {count}: "
                f"{', '.join(map(str, range(count))) or 'none'})"
            )
        try:
            return nv.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # noqa: BLE001
            raise self._refusal(exc, index, "open it") from exc

    def _read(self, nv: Any, handle: Any, index: int) -> PowerLimits:
        try:
            lo, hi = nv.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            default = nv.nvmlDeviceGetPowerManagementDefaultLimit(handle)
            current = nv.nvmlDeviceGetPowerManagementLimit(handle)
            uuid, name = nv.nvmlDeviceGetUUID(handle), nv.nvmlDeviceGetName(handle)
        except Exception as exc:  # noqa: BLE001
            raise self._refusal(exc, index, "read its power limits") from exc
        return PowerLimits(
            index=index,
            uuid=_text(uuid),
            name=_text(name),
            current_w=current / 1000.0,
            default_w=default / 1000.0,
            min_w=lo / 1000.0,
            max_w=hi / 1000.0,
        )

    def _refusal(self, exc: BaseException, index: int, what: str) -> Exception:
        code = getattr(exc, "value", None)
        nv = self._module
        if code == getattr(nv, "NVML_ERROR_NO_PERMISSION", NO_PERMISSION):
            return PowerLimitDenied(
                f"NVML refused to {what} on GPU {index}: no permission. Setting a power limit "
                "needs root: run the nightshift daemon as root, or `sudo nvidia-smi -i "
                f"{index} -pl WATTS` by hand"
            )
        if code == getattr(nv, "NVML_ERROR_NOT_SUPPORTED", NOT_SUPPORTED):
            return PowerControlUnavailable(
                f"GPU {index} does not support power management through NVML (cannot {what})"
            )
        return PowerControlUnavailable(f"NVML could not {what} on GPU {index}: {exc}")


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
