"""Driver and CUDA versions in each attempt's provenance (issue 30): the health probe records them
(nvidia-smi's driver_version and its table header's `CUDA Version:`, NVML's system calls), the
attempt's record reads them from its GPUs' latest reading, and a second attempt of a job on
another driver is flagged. No GPU here: recorded nvidia-smi outputs and the NVML fake of
tests/test_gpu_health.py stand at the probe's boundary; what a probe cannot read is said, never
invented."""

from __future__ import annotations

import sys
from typing import Any

from sqlmodel import col, select
from test_gpu_health import (
    EXPORTER_QUERY,
    FIXTURES,
    FakeSmi,
    fake_pynvml,
    h100,
    make_ctx,
    rtx2080,
)

from nightshift.agent.doors.job_views import print_provenance
from nightshift.runtime.gpu.gpu import NvidiaSmiProbe, NvmlProbe, cuda_text
from nightshift.runtime.gpu.nvidia_smi_text import parse_any
from nightshift.runtime.store.db import GpuSample
from nightshift.runtime.training import provenance
from nightshift.skills.gpu_health import gpu_health_check

from conftest import run_skill


def test_smi_probe_records_the_driver_and_the_cuda_version_of_its_header():
    """driver_version comes with --query-gpu; the CUDA version from the default table's header,
    asked once per driver the probe sees, not at every health check."""
    fake = FakeSmi()
    probe = NvidiaSmiProbe(runner=fake)
    for _ in range(2):
        [g] = probe.read().gpus
        assert (g.driver_version, g.cuda_version) == ("590.48.01", "13.1")
    assert [c for c in fake.calls if c == ["nvidia-smi"]] == [["nvidia-smi"]]


def test_smi_probe_says_why_when_no_header_gives_the_cuda_version():
    """The exporter's recorded RTX 2080 SUPER row (driver 466.63) with nvidia-smi printing no
    table: the driver is recorded, the CUDA version is unreadable with the reason."""
    [g] = NvidiaSmiProbe(runner=FakeSmi(query=EXPORTER_QUERY, table="")).read().gpus
    assert g.driver_version == "466.63" and g.cuda_version is None
    assert g.status("cuda_version") == "unreadable"
    assert "printed no `CUDA Version:`" in g.errors["cuda_version"]


def test_nvml_probe_records_the_driver_and_cuda_versions(monkeypatch):
    """nvmlSystemGetDriverVersion and nvmlSystemGetCudaDriverVersion_v2 (13010 → 13.1); a
    driver that does not support the call leaves the field 'not supported'."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([h100()]))
    [g] = NvmlProbe().read().gpus
    assert (g.driver_version, g.cuda_version) == ("590.48.01", "13.1")
    assert cuda_text(12040) == "12.4"
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([h100(fail={"cuda": 3})]))
    [g] = NvmlProbe().read().gpus
    assert g.driver_version == "590.48.01" and g.status("cuda_version") == "unsupported"


def test_saved_tables_and_reports_carry_their_header_versions():
    """A saved default table or `-q` report read as a probe keeps the versions of its header."""
    for name, want in (
        ("h100_80gb_load_table.txt", ("590.48.01", "13.1")),
        ("h100_80gb_load_q.txt", ("590.48.01", "13.1")),
        ("win_rtx2080super_idle_table.txt", ("591.86", "13.1")),
    ):
        _, readings = parse_any((FIXTURES / name).read_text())
        assert {(r.driver_version, r.cuda_version) for r in readings} == {want}, name


def _samples(ctx: Any) -> list[dict[str, Any]]:
    """The latest readings as the engine hands them to capture (runtime/engine.py)."""
    with ctx.store.session() as s:
        rows = s.exec(select(GpuSample).order_by(col(GpuSample.taken_at).desc())).all()
        return [
            {
                "gpu_index": r.gpu_index,
                "uuid": r.uuid,
                "verdict": r.verdict,
                "data": r.data,
                "taken_at": r.taken_at,
            }
            for r in rows
        ]


def test_a_second_attempt_on_another_driver_is_flagged(tmp_path, monkeypatch, capsys):
    """Attempt 1 starts on a node whose health check read GPU 0 as the H100 capture (driver
    590.48.01); the job resumes on a node whose GPU 0 reads as the recorded RTX 2080 SUPER
    (driver 591.86): `show` prints the first record's versions and flags the driver of the
    second."""
    records = []
    for node, reading in (("n1", h100()), ("n2", rtx2080())):
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([reading]))
        ctx = make_ctx(tmp_path / node, probe=NvmlProbe())
        run_skill(gpu_health_check, ctx, {})
        inp = provenance.Inputs(
            code_dir=tmp_path,
            argv=["python", "t.py"],
            params={},
            spec_seed=0,
            env={},
            data=[],
            gpus=[0],
            samples=_samples(ctx),
            host=node,
        )
        records.append(provenance.capture(inp, tmp_path / "home", 5.0))
    first, second = records
    assert first["gpu"]["devices"][0]["driver_version"] == "590.48.01"
    assert second["gpu"]["devices"][0]["driver_version"] == "591.86"
    flags = provenance.changes(first, second)
    assert 'driver: ["590.48.01"] → ["591.86"]' in flags, flags
    assert not any(f.startswith("CUDA") for f in flags)  # 13.1 on both
    attempts = [
        type("A", (), {"number": 1, "provenance": first, "provenance_changes": []}),
        type("A", (), {"number": 2, "provenance": second, "provenance_changes": flags}),
    ]
    print_provenance(attempts)
    out = capsys.readouterr().out
    assert "gpu 0   NVIDIA H100 80GB HBM3, driver 590.48.01, CUDA 13.1" in out
    assert "attempt 2 changed:" in out and "591.86" in out


def test_a_reading_without_versions_says_why_in_the_record():
    """A reading from before the probe read versions (or an inventory) records none, and says
    so; an unreadable one carries the probe's error."""
    old = {"gpu_index": 0, "verdict": "OK", "data": {"index": 0, "name": "H100"}}
    bad = {
        "gpu_index": 1,
        "verdict": "OK",
        "data": {
            "index": 1,
            "name": "H100",
            "driver_version": "590.48.01",
            "unreadable": ["cuda_version"],
            "errors": {"cuda_version": "nvidia-smi printed no `CUDA Version:`"},
        },
    }
    [a, b] = provenance.gpu_info([0, 1], [old, bad])["devices"]
    assert a["driver_version"] is None and "not read by this probe" in a["driver_version_note"]
    assert b["driver_version"] == "590.48.01" and "driver_version_note" not in b
    assert b["cuda_version_note"] == "unreadable: nvidia-smi printed no `CUDA Version:`"
