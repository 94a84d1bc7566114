"""nvidia-smi's own error messages are verdicts, never a parse failure: read from `--from` files
(tests/fixtures/nvidia_smi/driver, sources in tests/fixtures/nvidia_smi/SOURCES.md), from the live
probe (through its runner) and from the Ray census, which replays the same probe."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from sqlmodel import select

from nightshift.runtime.config import Settings
from nightshift.runtime.gpu.driver_messages import find_driver_messages
from nightshift.runtime.gpu.gpu import NvidiaSmiProbe
from nightshift.runtime.gpu.nvidia_smi_text import TextProbe
from nightshift.runtime.gpu.ray_census import MARK, RayGpuCensus
from nightshift.runtime.store.db import GpuSample
from nightshift.skills.base import SkillContext
from nightshift.skills.gpu_health import gpu_health_check

from conftest import empty_store, nightshift, run_skill

DRIVER = Path(__file__).parent / "fixtures" / "nvidia_smi" / "driver"
NOW = datetime(2026, 12, 2, 3, 0)
LOST = (
    "Unable to determine the device handle for GPU 0000:03:00.0: GPU is lost. "
    "Reboot the system to recover this GPU"
)


def make_ctx(tmp_path: Path, probe=None) -> SkillContext:
    return SkillContext(
        store=empty_store(tmp_path / "s.db"),
        settings=Settings(home=str(tmp_path)),
        now=NOW,
        probe=probe,
    )


def record(ctx: SkillContext, index: int, bus: str, verdict: str = "OK") -> None:
    with ctx.store.session() as s:
        s.add(
            GpuSample(
                gpu_index=index,
                uuid=f"GPU-{index}",
                verdict=verdict,
                taken_at=datetime(2026, 12, 1),
                data={"index": index, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": bus},
            )
        )


def samples(ctx: SkillContext) -> list[GpuSample]:
    with ctx.store.session() as s:
        return list(s.exec(select(GpuSample).order_by(GpuSample.id)))


# ------------------------------------------------------------------------------ the messages
@pytest.mark.parametrize(
    ("name", "kind", "verdict", "text"),
    [
        ("gpu_lost_wrapped.txt", "gpu_lost", "CRITICAL", LOST),
        (
            "handle_unknown_error.txt",
            "gpu_unreachable",
            "CRITICAL",
            "Unable to determine the device handle for GPU 0000:03:00.0: Unknown Error",
        ),
        ("no_devices.txt", "no_devices", "UNKNOWN", "No devices were found"),
        (
            "driver_not_loaded.txt",
            "driver_not_loaded",
            "UNKNOWN",
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.",
        ),
        (
            "nvml_version_mismatch.txt",
            "nvml_version_mismatch",
            "UNKNOWN",
            "Failed to initialize NVML: Driver/library version mismatch\n"
            "NVML library version: 570.124",
        ),
        (
            "nvml_unknown_error.txt",
            "nvml_unknown_error",
            "UNKNOWN",
            "Failed to initialize NVML: Unknown Error",
        ),
    ],
)
def test_each_message_is_found_in_its_own_words(name, kind, verdict, text):
    """Wrapped lines and prompts around the message do not matter; the evidence is the tool's wording."""
    [m] = find_driver_messages((DRIVER / name).read_text())
    assert (m.kind, m.verdict, m.text) == (kind, verdict, text)
    assert m.meaning and m.action


def test_nothing_is_found_in_ordinary_output():
    assert find_driver_messages("index, name\n0, NVIDIA H100 80GB HBM3\n") == []


def test_the_unknown_error_of_one_gpu_is_not_the_nvml_one():
    """'…for GPU <bus>: Unknown Error' names a GPU (CRITICAL); 'Failed to initialize NVML:
    Unknown Error' is about the driver (UNKNOWN). Both in one text: both, in order."""
    text = (DRIVER / "handle_unknown_error.txt").read_text() + (
        DRIVER / "nvml_unknown_error.txt"
    ).read_text()
    assert [(m.kind, m.bus_id) for m in find_driver_messages(text)] == [
        ("gpu_unreachable", "0000:03:00.0"),
        ("nvml_unknown_error", None),
    ]


# ------------------------------------------------------------------------------ --from FILE
def test_cli_lost_gpu_paste_is_critical_not_a_parse_failure(home):
    """The issue's paste: exit 2 (CRITICAL) with the message and the action, not exit 3."""
    done = nightshift("health", "--from", str(DRIVER / "gpu_lost_wrapped.txt"), "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    out = json.loads(done.stdout)
    assert out["overall"] == "CRITICAL" and out["backend"] == "paste:driver"
    [gpu] = out["gpus"]
    assert gpu["pci_bus_id"] == "0000:03:00.0" and gpu["verdict"] == "CRITICAL"
    [reason] = gpu["reasons"]
    assert reason["evidence"] == LOST
    assert "fell off the bus" in reason["message"] and "reboot" in reason["action"]


def test_cli_lost_gpu_table_says_what_to_do(home):
    done = nightshift("health", "--from", str(DRIVER / "gpu_lost_wrapped.txt"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "0000:03:00.0" in done.stdout and "overall: CRITICAL" in done.stdout
    assert "do: drain" in done.stdout and "not recognised" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "name",
    [
        "no_devices.txt",
        "driver_not_loaded.txt",
        "nvml_version_mismatch.txt",
        "nvml_unknown_error.txt",
    ],
)
def test_cli_driver_that_cannot_be_asked_is_unknown_with_the_fix(home, name):
    """Exit 3 (UNKNOWN), the message and what to do in the output, no traceback."""
    done = nightshift("health", "--from", str(DRIVER / name))
    assert done.returncode == 3, done.stdout + done.stderr
    assert "overall: UNKNOWN" in done.stdout and "do: " in done.stdout
    assert "Traceback" not in done.stderr and "not recognised" not in done.stderr


def test_cli_unknown_text_still_names_the_file_and_what_is_expected(home, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("the GPU seemed slow yesterday\n")
    done = nightshift("health", "--from", str(path))
    assert done.returncode == 3
    assert str(path) in done.stderr and "NVRM: Xid" in done.stderr
    assert "Traceback" not in done.stderr


def test_err_fields_carry_the_evidence_and_an_action():
    """ERR! / [Unknown Error] cells were already unreadable (never 0); now with what to do."""
    text = (
        "index, name, pci.bus_id, temperature.gpu, memory.total [MiB], memory.used [MiB], "
        "utilization.gpu [%]\n"
        "0, NVIDIA H100 80GB HBM3, 00000000:03:00.0, ERR!, [Unknown Error], ERR!, ERR!\n"
    )
    ctx_probe = TextProbe(text, "test")
    from nightshift.runtime.config import HealthThresholds
    from nightshift.skills.gpu_health import judge_reading

    [g] = ctx_probe.read().gpus
    v = judge_reading(g, HealthThresholds())
    assert v.verdict == "UNKNOWN"
    assert {r.evidence for r in v.reasons} == {"ERR!", "[Unknown Error]"}
    assert all("journalctl -k" in (r.action or "") for r in v.reasons)


# ------------------------------------------------------------------------------ the live probe
def test_probe_no_devices_is_unknown_for_every_gpu_this_machine_knew(tmp_path):
    """nvidia-smi exits 6 with 'No devices were found': the GPUs placement knew become UNKNOWN
    (recorded: quarantined), with the message as evidence, instead of keeping their old OK."""
    runner = lambda argv, t: (6, "No devices were found\n", "")  # noqa: E731
    ctx = make_ctx(tmp_path, NvidiaSmiProbe(runner=runner))
    record(ctx, 0, "00000000:03:00.0")
    record(ctx, 1, "00000000:04:00.0")
    out = run_skill(gpu_health_check, ctx, {})
    assert out.overall == "UNKNOWN"
    assert [(v.index, v.verdict) for v in out.gpus] == [(0, "UNKNOWN"), (1, "UNKNOWN")]
    assert out.gpus[0].reasons[0].evidence == "No devices were found"
    assert "lspci" in out.message
    assert [(r.gpu_index, r.verdict) for r in samples(ctx)[2:]] == [(0, "UNKNOWN"), (1, "UNKNOWN")]


def test_probe_version_mismatch_is_unknown(tmp_path):
    text = (DRIVER / "nvml_version_mismatch.txt").read_text().split("\n", 1)[1]
    result = NvidiaSmiProbe(runner=lambda argv, t: (18, text, "")).read()
    assert result.gpus == [] and "exited 18" in (result.error or "")
    [m] = result.driver
    assert m.kind == "nvml_version_mismatch" and "570.124" in m.text


def test_probe_lost_gpu_uses_the_driver_words_under_its_recorded_index(tmp_path):
    """A lost GPU named by bus id is CRITICAL under the index last recorded for that bus."""
    ctx = make_ctx(tmp_path, NvidiaSmiProbe(runner=lambda argv, t: (15, LOST + "\n", "")))
    record(ctx, 2, "00000000:03:00.0")
    out = run_skill(gpu_health_check, ctx, {})
    [v] = out.gpus
    assert (v.index, v.verdict, v.uuid) == (2, "CRITICAL", "GPU-2")
    assert [r.evidence for r in v.reasons] == [LOST]
    assert samples(ctx)[-1].verdict == "CRITICAL" and samples(ctx)[-1].gpu_index == 2


# ------------------------------------------------------------------------------ the Ray census
def test_census_reads_a_nodes_driver_message():
    """A node whose nvidia-smi says 'Failed to initialize NVML: …' is reported with the message."""
    mismatch = "Failed to initialize NVML: Driver/library version mismatch\n"
    line = {"ip": "10.0.0.5", "results": [[18, mismatch, ""], [18, mismatch, ""]]}
    census = RayGpuCensus(lambda argv, t: MARK + json.dumps(line) + "\n")
    result = census.read_hosts()["ray:10.0.0.5"]
    assert result.gpus == [] and [m.kind for m in result.driver] == ["nvml_version_mismatch"]
    assert "Driver/library version mismatch" in (result.error or "")
