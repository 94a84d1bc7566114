"""nvidia-smi's own error messages, read as verdicts instead of as output that failed to parse.

When the driver cannot answer, nvidia-smi prints a sentence instead of a report: "Unable to
determine the device handle for GPU 0000:03:00.0: GPU is lost. Reboot the system to recover this
GPU", "No devices were found", "Failed to initialize NVML: Driver/library version mismatch" … Each
is a finding about the machine: a GPU that is lost or unreachable is CRITICAL, a driver that
cannot be asked at all leaves every GPU UNKNOWN. The message is kept word for word as evidence.

The text is data from a paste, a saved file or nvidia-smi's own output: it is matched, never run or
interpreted further. Pastes wrap long lines (a terminal's width, a ticket's editor) and put shell
prompts and other text around the message, so the matching ignores all whitespace, including the
line breaks a wrap adds inside a word.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

DriverVerdict = Literal["CRITICAL", "UNKNOWN"]

_BUS = r"(?P<bus>[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f])"


class DriverMessage(BaseModel):
    """One message nvidia-smi printed instead of readings, and what it means."""

    kind: Literal[
        "gpu_lost",
        "gpu_unreachable",
        "no_devices",
        "driver_not_loaded",
        "nvml_version_mismatch",
        "nvml_unknown_error",
    ]
    verdict: DriverVerdict = Field(
        description="CRITICAL: this GPU is lost or unreachable; UNKNOWN: the driver cannot be asked"
    )
    bus_id: str | None = Field(None, description="The GPU the message names, when it names one")
    text: str = Field(description="The message in nvidia-smi's own words")
    meaning: str
    action: str = Field(description="What to do about it")


# Each pattern matches the message with every whitespace character removed and in lower case.
_HANDLE = re.compile(r"unabletodeterminethedevicehandleforgpu" + _BUS + r":?(?P<reason>[a-z.!]*)")
_NO_DEVICES = re.compile(r"nodeviceswerefound")
_NOT_LOADED = re.compile(
    r"nvidia-smihasfailedbecauseitcouldn.{0,3}tcommunicatewiththenvidiadriver"
    r"(?P<tail>\.makesurethatthelatestnvidiadriverisinstalledandrunning\.?)?"
)
_MISMATCH = re.compile(
    r"failedtoinitializenvml:driver/libraryversionmismatch"
    r"(?:nvmllibraryversion:(?P<version>\d+(?:\.\d+){1,2}))?"
)
_NVML_UNKNOWN = re.compile(r"failedtoinitializenvml:unknownerror")

LOST_TEXT = "GPU is lost. Reboot the system to recover this GPU"
NOT_LOADED_TEXT = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def _squeeze(text: str) -> str:
    return "".join(text.split()).lower()


def find_driver_messages(text: str) -> list[DriverMessage]:
    """The nvidia-smi error messages in `text`, in the order printed, each once per GPU."""
    flat = _squeeze(text)
    found: list[tuple[int, DriverMessage]] = []
    seen: set[tuple[str, str | None]] = set()

    def add(at: int, message: DriverMessage) -> None:
        key = (message.kind, message.bus_id)
        if key not in seen:
            seen.add(key)
            found.append((at, message))

    for m in _HANDLE.finditer(flat):
        bus = _original_bus(text, m["bus"])
        reason = m["reason"]
        if reason.startswith("gpuislost"):
            add(m.start(), _lost(bus))
        else:
            add(m.start(), _unreachable(bus, _original_reason(text, bus)))
    for m in _NO_DEVICES.finditer(flat):
        add(m.start(), NO_DEVICES)
    for m in _NOT_LOADED.finditer(flat):
        add(m.start(), NOT_LOADED)
    for m in _MISMATCH.finditer(flat):
        add(m.start(), _mismatch(m["version"]))
    for m in _NVML_UNKNOWN.finditer(flat):
        add(m.start(), NVML_UNKNOWN)
    return [message for _, message in sorted(found, key=lambda pair: pair[0])]


def _original_bus(text: str, squeezed: str) -> str:
    """The bus id as the text spells it (case kept), found again in the original text."""
    m = re.search(re.escape(squeezed), text, re.IGNORECASE)
    return m.group(0) if m else squeezed


def _original_reason(text: str, bus: str) -> str:
    """What follows '<bus>:' on the line that names the GPU, e.g. 'Unknown Error'."""
    m = re.search(re.escape(bus) + r":\s*(?P<reason>[^\n]*)", text)
    return m["reason"].strip() if m and m["reason"].strip() else "no reason given"


def _lost(bus: str) -> DriverMessage:
    return DriverMessage(
        kind="gpu_lost",
        verdict="CRITICAL",
        bus_id=bus,
        text=f"Unable to determine the device handle for GPU {bus}: {LOST_TEXT}",
        meaning=f"GPU {bus} is lost: it fell off the bus (the kernel log usually shows Xid 79)",
        action="drain the machine's work on this GPU and reboot (a GPU reset cannot reach a "
        "lost GPU); if it happens again, check the card's power, cooling and seating, then RMA",
    )


def _unreachable(bus: str, reason: str) -> DriverMessage:
    return DriverMessage(
        kind="gpu_unreachable",
        verdict="CRITICAL",
        bus_id=bus,
        text=f"Unable to determine the device handle for GPU {bus}: {reason}",
        meaning=f"the driver cannot reach GPU {bus} ({reason})",
        action="read the kernel log for this GPU (`journalctl -k | grep NVRM`): an Xid line says "
        "why; reset the GPU (`nvidia-smi -r -i <index>`) when it is idle, or reboot",
    )


NO_DEVICES = DriverMessage(
    kind="no_devices",
    verdict="UNKNOWN",
    text="No devices were found",
    meaning="the NVIDIA driver answered but sees no GPU",
    action="check that the GPUs are on the bus (`lspci | grep -i nvidia`) and why the driver did "
    "not take them (`journalctl -k | grep NVRM`: RmInitAdapter failed, Xid 79); in a container, "
    "start it with the GPUs (`--gpus all`)",
)
NOT_LOADED = DriverMessage(
    kind="driver_not_loaded",
    verdict="UNKNOWN",
    text=NOT_LOADED_TEXT,
    meaning="the NVIDIA kernel driver is not loaded, so no GPU can be asked",
    action="check `lsmod | grep nvidia`; after a kernel update rebuild the driver for the running "
    "kernel (DKMS) or reinstall it, then reboot",
)
NVML_UNKNOWN = DriverMessage(
    kind="nvml_unknown_error",
    verdict="UNKNOWN",
    text="Failed to initialize NVML: Unknown Error",
    meaning="NVML could not reach the driver (in a container: it lost access to the GPU devices, "
    "e.g. after `systemctl daemon-reload` on the host)",
    action="restart the container; if nvidia-smi fails on the host too, read the kernel log "
    "(`journalctl -k | grep NVRM`) and reboot",
)


def _mismatch(version: str | None) -> DriverMessage:
    text = "Failed to initialize NVML: Driver/library version mismatch"
    if version:
        text += f"\nNVML library version: {version}"
    return DriverMessage(
        kind="nvml_version_mismatch",
        verdict="UNKNOWN",
        text=text,
        meaning="the NVIDIA user-space libraries were upgraded while the older kernel module is "
        "still loaded" + (f" (the library is {version})" if version else ""),
        action="reboot to load the new kernel module (or unload and reload the nvidia modules "
        "when no process uses the GPUs)",
    )


def machine_wide(messages: list[DriverMessage]) -> list[DriverMessage]:
    """The messages that are about the driver, not one GPU."""
    return [m for m in messages if m.bus_id is None]
