"""Kernel `NVRM: Xid` lines judged against NVIDIA's XID catalogue (runtime/gpu/xid_catalogue.yaml),
per GPU by PCI bus id. The logs in tests/fixtures/kernel_xid are from public reports (SOURCES.md)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from sqlmodel import select

from nightshift.runtime.config import Settings
from nightshift.runtime.gpu.nvidia_smi_text import TextProbe
from nightshift.runtime.gpu.xid import (
    ACTIONS,
    CATALOGUE_PATH,
    catalogue,
    find_xid_events,
    findings,
)
from nightshift.runtime.store.db import GpuSample, Store
from nightshift.skills.base import SkillContext
from nightshift.skills.gpu_health import gpu_health_check

from conftest import nightshift, run_skill

KERNEL = Path(__file__).parent / "fixtures" / "kernel_xid"
SMI = Path(__file__).parent / "fixtures" / "nvidia_smi"
NOW = datetime(2026, 12, 2, 3, 0)
# The Xids the catalogue must know, with the verdict their action gives.
EXPECTED = {
    13: "WARNING",
    31: "WARNING",
    32: "WARNING",
    38: "WARNING",
    43: "WARNING",
    45: "WARNING",
    48: "CRITICAL",
    61: "CRITICAL",
    62: "CRITICAL",
    63: "WARNING",
    64: "CRITICAL",
    68: "WARNING",
    69: "WARNING",
    73: "WARNING",
    74: "CRITICAL",
    79: "CRITICAL",
    92: "WARNING",
    94: "WARNING",
    95: "CRITICAL",
    109: "CRITICAL",
    119: "CRITICAL",
    120: "CRITICAL",
    121: "WARNING",
    140: "CRITICAL",
    143: "CRITICAL",
    154: "CRITICAL",
}


def judged(text: str) -> dict[tuple[str, int], str]:
    return {(f.bus_id, f.xid): f.severity for f in findings(find_xid_events(text))}


# ------------------------------------------------------------------------------ the catalogue
def test_catalogue_has_the_common_xids_with_their_severity():
    cat = catalogue()
    for xid, severity in EXPECTED.items():
        assert xid in cat, xid
        assert ACTIONS[cat[xid].action][0] == severity, xid
        assert cat[xid].mnemonic and cat[xid].meaning and cat[xid].nvidia


def test_catalogue_names_its_source():
    assert "docs.nvidia.com/deploy/xid-errors" in CATALOGUE_PATH.read_text()


def test_unknown_xid_is_unknown_and_conservative():
    [f] = findings(find_xid_events("NVRM: Xid (PCI:0000:3b:00): 999, pid=1, something new"))
    assert not f.known and f.severity == "CRITICAL" and f.action == "drain"
    assert "unknown XID 999" in f.meaning and "docs.nvidia.com" in f.advice


@pytest.mark.parametrize(
    ("label", "action", "severity"),
    [
        ("None", "ignore", "WARNING"),
        ("GPU Reset Required", "reset_gpu", "CRITICAL"),
        ("Node Reboot Required", "reboot", "CRITICAL"),
        ("Drain P2P", "drain", "CRITICAL"),
        ("Drain and Reset", "reset_gpu", "CRITICAL"),
    ],
)
def test_xid_154_follows_the_recovery_action_it_names(label, action, severity):
    """Xid 154 carries the action ("GPU recovery action changed from 0x0 (None) to 0x2 (Node
    Reboot Required)": the label as in https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1134's
    title and https://github.com/wtdcode/vllm-backport/issues/62 — 'Drain and Reset'; the hex
    codes are illustrative)."""
    line = (
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to "
        f"0x2 ({label})"
    )
    [f] = findings(find_xid_events(line))
    assert (f.action, f.severity) == (action, severity)
    assert label in f.meaning


# ------------------------------------------------------------------------------ the lines
def test_journal_xid_79_with_uuid():
    text = (KERNEL / "xid79_fallen_off_journal.txt").read_text()
    [f] = findings(find_xid_events(text), {"0000:2b:00.0": "GPU-x"})
    assert (f.xid, f.bus_id, f.severity, f.action) == (79, "0000:2b:00.0", "CRITICAL", "reboot")
    assert f.last_line.endswith("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.")


def test_application_xids_are_warnings_and_repeats_are_counted():
    text = (KERNEL / "xid31_13_32_dmesg.txt").read_text()
    fs = {f.xid: f for f in findings(find_xid_events(text))}
    assert {x: f.severity for x, f in fs.items()} == {31: "WARNING", 13: "WARNING", 32: "WARNING"}
    assert fs[13].count == 4 and "Data 1000f010" in fs[13].last_line
    assert fs[31].action == "check_app" and "compute-sanitizer" in fs[31].advice


def test_dmesg_ctime_lines_and_a_reset_xid():
    assert judged((KERNEL / "xid13_109_dmesg_ctime.txt").read_text()) == {
        ("0000:cb:00.0", 13): "WARNING",
        ("0000:cb:00.0", 109): "CRITICAL",
    }


def test_xid_on_two_gpus_are_two_gpus():
    assert judged((KERNEL / "xid45_after_149_journal.txt").read_text()) == {
        ("0000:dc:00.0", 45): "WARNING",
        ("0000:ed:00.0", 45): "WARNING",
    }


# ------------------------------------------------------------------------------ nightshift health
def test_cli_kernel_log_gives_per_gpu_verdicts(home):
    """A saved kernel log is auto-detected; each GPU (by bus id) gets the worst of its Xids,
    each Xid its line as evidence and NVIDIA's recommended action."""
    done = nightshift("health", "--from", str(KERNEL / "xid31_62_45_dmesg.txt"), "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    out = json.loads(done.stdout)
    assert (out["backend"], out["overall"], out["recorded"]) == ("paste:kernel", "CRITICAL", 0)
    [gpu] = out["gpus"]
    assert gpu["pci_bus_id"] == "0000:0a:00.0" and gpu["verdict"] == "CRITICAL"
    assert gpu["uuid"] == "GPU-760d0170-b7c5-6817-9414-6cc7112645de"
    by_xid = {r["value"]: r for r in gpu["reasons"]}
    assert {x: r["severity"] for x, r in by_xid.items()} == {
        31: "WARNING",
        62: "CRITICAL",
        45: "WARNING",
    }
    assert "Xid (PCI:0000:0a:00): 62" in by_xid[62]["evidence"]
    assert "reset it" in by_xid[62]["action"] and "2 times" in by_xid[45]["message"]


def test_cli_application_xids_only_warn(home):
    done = nightshift("health", "--from", str(KERNEL / "xid31_13_32_dmesg.txt"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "overall: WARNING" in done.stdout and "0000:01:00.0" in done.stdout


def test_cli_kernel_log_without_xids_is_ok(home):
    done = nightshift("health", "--from", str(KERNEL / "no_xid_dmesg.txt"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "overall: OK" in done.stdout and "no NVRM Xid lines" in done.stdout


def test_xid_lines_pasted_with_an_nvidia_smi_table_join_that_gpu():
    """A table and the kernel log in one paste: the Xid lands on the GPU with that bus id."""
    table = (SMI / "h100_80gb_load_table.txt").read_text()
    xid = "[  123.456] NVRM: Xid (PCI:0000:00:09): 79, pid=1234, GPU has fallen off the bus.\n"
    ctx = SkillContext(store=Store("sqlite://"), settings=Settings(home="/nonexistent"), now=NOW)
    out = run_skill(gpu_health_check, ctx, {"from_text": table + xid})
    [gpu] = out.gpus
    assert gpu.index == 0 and gpu.verdict == "CRITICAL" and gpu.reading is not None
    assert [r.value for r in gpu.reasons if r.field == "xid"] == [79]


def test_recorded_kernel_log_quarantines_the_gpu_with_that_bus_id(tmp_path):
    """`--record` on this machine's kernel log: the CRITICAL Xid is recorded under the index last
    recorded for that bus id, so placement quarantines it; other GPUs are not called missing."""
    ctx = SkillContext(
        store=Store(f"sqlite:///{tmp_path}/s.db"), settings=Settings(home=str(tmp_path)), now=NOW
    )
    with ctx.store.session() as s:
        for index, bus in ((0, "00000000:2A:00.0"), (1, "00000000:2B:00.0")):
            s.add(
                GpuSample(
                    gpu_index=index,
                    uuid=f"GPU-{index}",
                    verdict="OK",
                    taken_at=datetime(2026, 12, 1),
                    data={"index": index, "pci_bus_id": bus},
                )
            )
    text = (KERNEL / "xid79_fallen_off_journal.txt").read_text()
    out = run_skill(gpu_health_check, ctx, {"from_text": text, "record": True})
    assert [(v.index, v.verdict) for v in out.gpus] == [(1, "CRITICAL")]
    with ctx.store.session() as s:
        rows = list(s.exec(select(GpuSample).where(GpuSample.taken_at == NOW)))
    assert [(r.gpu_index, r.verdict) for r in rows] == [(1, "CRITICAL")]


def test_text_probe_names_the_kernel_log():
    probe = TextProbe((KERNEL / "xid79_fallen_off_journal.txt").read_text(), "kern.log")
    result = probe.read()
    assert result.backend == "paste:kernel" and not result.complete
    assert "kernel log" in (result.message or "")
