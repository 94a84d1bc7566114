"""Driver and CUDA versions in each attempt's provenance (issue 30): the health probe records them
(nvidia-smi's driver_version and its table header's `CUDA Version:`, NVML's system calls), the
attempt's record reads them from its GPUs' latest reading, and a second attempt of a job on
another driver is flagged. No GPU here: recorded nvidia-smi outputs and the NVML fake of
tests/test_gpu_health.py stand at the probe's boundary; what a probe cannot read is said, never
invented."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from typing import Any

from test_gpu_health import (
    EXPORTER_QUERY,
    FIXTURES,
    FakeSmi,
    fake_pynvml,
    h100,
    rtx2080,
)

from nightshift.runtime.gpu.gpu import NvidiaSmiProbe, NvmlProbe, cuda_text
from nightshift.runtime.gpu.nvidia_smi_text import parse_any
from nightshift.runtime.training import provenance

from conftest import nightshift


def test_smi_probe_records_the_driver_and_the_cuda_version_of_its_header():
    """driver_version comes with --query-gpu; the CUDA version from the default table's header,
    asked once per driver the probe sees, not at every health check."""
    fake = FakeSmi()
    for _ in range(2):  # a probe is made for each health check
        [g] = NvidiaSmiProbe(runner=fake).read().gpus
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


def test_a_second_attempt_on_another_driver_is_flagged(home, monkeypatch):
    """End to end, one job, two attempts: node n1's health check reads GPU 0 as the H100 capture
    (driver 590.48.01) and the engine starts attempt 1 there; it fails, the user retries it, and
    node n2 — whose GPU 0 reads as the recorded RTX 2080 SUPER (driver 591.86) — starts attempt
    2. `nightshift show` prints the first record's versions and flags the other driver."""
    import getpass

    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.api import Client
    from nightshift.evals.provenance_cost import _Instant
    from nightshift.runtime.config import GpuSettings, LoopSettings, Settings
    from nightshift.runtime.executors.executor import RunStatus
    from nightshift.runtime.store.lifecycle import Outcome

    def node(name: str, reading: dict[str, Any]) -> Wiring:
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([reading]))
        w = Wiring(
            Settings(home=str(home), gpu=GpuSettings(probe="nvml"), loop=LoopSettings(node=name))
        )
        w.engine.executor = _Instant()  # type: ignore[assignment]  # no GPU to start on here
        w.gate.call(w.context("system"), "gpu_health_check", {}, via="system")
        return w

    now = datetime(2026, 12, 5, 3, 0)
    n1 = node("n1", h100())
    job = Client(n1).submit(
        spec={"name": "d", "command": ["python3", "-c", "pass"], "resources": {"gpus": 1}}
    )
    first = n1.engine.start_attempt(job, [0], now)
    assert first is not None
    n1.engine._finish(
        first.id,  # type: ignore[arg-type]
        RunStatus(state="exited", exit_code=1, detail="exit 1"),
        now,
        outcome=Outcome.FAILED,
        reason="exit 1",
    )
    n1.gate.call(n1.context(getpass.getuser()), "retry_job", {"job_id": job}, via="cli")
    n2 = node("n2", rtx2080())
    second = n2.engine.start_attempt(job, [0], now + timedelta(hours=1))
    assert second is not None and second.provenance is not None
    [gpu] = second.provenance["gpu"]["devices"]
    assert (gpu["driver_version"], gpu["cuda_version"]) == ("591.86", "13.1")

    show = nightshift("show", str(job))
    assert show.returncode == 0, show.stderr
    assert "gpu 0   NVIDIA H100 80GB HBM3, driver 590.48.01, CUDA 13.1" in show.stdout
    changed = next(ln for ln in show.stdout.splitlines() if "attempt 2 changed:" in ln)
    assert 'driver: ["590.48.01"] → ["591.86"]' in changed, show.stdout
    assert "CUDA" not in changed  # 13.1 on both


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
