"""GPU probes and gpu_health_check, fed with real nvidia-smi captures and a fake NVML built from them."""

from __future__ import annotations

import csv
import io
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fake_pynvml import NVML_ERRORS, fake_pynvml, h100, h200_mig, rtx2080  # noqa: F401  (re-exported)
from sqlmodel import select

from nightshift.runtime.config import HealthThresholds, Settings
from nightshift.runtime.errors import BadArguments
from nightshift.runtime.gpu.gpu import (
    GpuReading,
    InventoryProbe,
    NoGpuProbe,
    NvidiaSmiProbe,
    NvmlProbe,
    ProbeResult,
    lost_in_output,
    make_probe,
    parse_query_compute_apps_csv,
    parse_query_gpu_csv,
)
from nightshift.runtime.store.db import GpuSample
from nightshift.skills.base import SkillContext
from nightshift.skills.gpu_health import gpu_health_check, judge_reading

from conftest import empty_store, nightshift, run_skill

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia_smi"
H100_QUERY = (FIXTURES / "h100_80gb_load_query_gpu.csv").read_text()
H100_APPS = (FIXTURES / "h100_80gb_load_query_compute_apps.csv").read_text()
H100_TABLE = (FIXTURES / "h100_80gb_load_table.txt").read_text()
EXPORTER_QUERY = (FIXTURES / "exporter_testdata_query.csv").read_text()
NOW = datetime(2026, 12, 2, 3, 0)
MIB = 1 << 20


def make_ctx(tmp_path: Path, probe: Any = None, settings: Settings | None = None) -> SkillContext:
    return SkillContext(
        store=empty_store(tmp_path / "s.db"),
        settings=settings or Settings(home=str(tmp_path)),
        now=NOW,
        probe=probe,
    )


def samples(ctx: SkillContext) -> list[GpuSample]:
    with ctx.store.session() as s:
        return list(s.exec(select(GpuSample).order_by(GpuSample.id)))


def csv_table(text: str) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    return rows[0], rows[1:]


def csv_text(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(", ".join(r) for r in [header, *rows]) + "\n"


class StaticProbe:
    """A probe that returns a fixed result: the skill's rules without any backend."""

    name = "static"

    def __init__(self, result: ProbeResult):
        self.result = result

    def read(self) -> ProbeResult:
        return self.result


# ------------------------------------------------------------------------ nvidia-smi CSV parser
def test_parses_real_h100_query_csv():
    """The widest real query (212 columns, many [N/A]) yields the values nvidia-smi printed."""
    [g] = parse_query_gpu_csv(H100_QUERY)
    assert g.index == 0
    assert g.name == "NVIDIA H100 80GB HBM3"
    assert g.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert g.pci_bus_id == "00000000:00:09.0"
    assert g.temperature_c == 59
    assert (g.memory_total_mib, g.memory_used_mib) == (81559, 19818)
    assert g.utilization_pct == 100
    assert (g.power_w, g.power_limit_w) == (631.95, 700.0)
    assert (g.ecc_volatile_uncorrected, g.ecc_aggregate_uncorrected) == (0, 0)
    assert (g.remapped_rows_pending, g.remapped_rows_failed) == (False, False)
    assert g.throttle_reasons == []
    assert g.mig_mode == "Disabled"
    assert g.fan_pct is None and g.status("fan_pct") == "unsupported"
    assert g.retired_pages is None and g.status("retired_pages") == "unsupported"
    assert g.unreadable == []


def test_parses_exporter_fixture_with_missing_columns():
    """A narrow real query: absent fields stay absent (not unsupported, never zero) and the index column is used."""
    a, b = parse_query_gpu_csv(EXPORTER_QUERY)
    assert (a.index, a.name, a.fan_pct, a.memory_used_mib) == (
        0,
        "NVIDIA GeForce RTX 2080 SUPER",
        38,
        575,
    )
    assert (b.index, b.fan_pct, b.memory_used_mib) == (1, 50, 1234)
    assert a.temperature_c is None and a.status("temperature_c") == "absent"
    assert a.memory_total_mib is None and a.unsupported == [] and a.unreadable == []


def test_columns_matched_by_name_not_position():
    """nvidia-smi prints columns in the order asked; reordering them must not change the reading."""
    header, rows = csv_table(H100_QUERY)
    order = list(reversed(range(len(header))))
    shuffled = csv_text([header[i] for i in order], [[r[i] for i in order] for r in rows])
    assert parse_query_gpu_csv(shuffled) == parse_query_gpu_csv(H100_QUERY)


def test_missing_columns_leave_fields_absent():
    """An older driver lacks some fields: the rest still parse and the missing ones are simply absent."""
    header, rows = csv_table(H100_QUERY)
    drop = {
        i
        for i, h in enumerate(header)
        if h.startswith(("temperature.gpu", "fan.speed", "clocks_event"))
    }
    keep = [i for i in range(len(header)) if i not in drop]
    [g] = parse_query_gpu_csv(
        csv_text([header[i] for i in keep], [[r[i] for i in keep] for r in rows])
    )
    assert g.temperature_c is None and g.status("temperature_c") == "absent"
    assert g.status("fan_pct") == "absent" and g.throttle_reasons is None
    assert g.memory_total_mib == 81559


def test_error_cells_are_unreadable_never_zero():
    """ERR! and [Unknown Error] mean the read failed: the value is None and the raw text is kept."""
    header, rows = csv_table(H100_QUERY)
    row = rows[0][:]
    row[header.index("temperature.gpu")] = "ERR!"
    row[header.index("memory.used [MiB]")] = "[Unknown Error]"
    row[header.index("power.draw [W]")] = "[Not Supported]"
    [g] = parse_query_gpu_csv(csv_text(header, [row]))
    assert g.temperature_c is None and g.memory_used_mib is None
    assert set(g.unreadable) == {"temperature_c", "memory_used_mib"}
    assert g.errors == {"temperature_c": "ERR!", "memory_used_mib": "[Unknown Error]"}
    assert g.status("power_w") == "unsupported"


def test_parses_real_compute_apps_csv():
    """Processes from --query-compute-apps are keyed by GPU UUID, memory in MiB."""
    apps = parse_query_compute_apps_csv(H100_APPS)
    procs = apps["GPU-00000000-0000-0000-0000-000000000000"]
    assert [(p.pid, p.name, p.used_memory_mib) for p in procs] == [
        (11327, "/root/tools/memhog", 2566),
        (11328, "/root/tools/memhog", 1542),
        (11345, "./gpu_burn", 15690),
    ]


def test_lost_lines_give_bus_ids():
    """nvidia-smi names an unreachable GPU only by bus id; both common phrasings are recognised."""
    text = (
        "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost. "
        "Reboot the system to recover this GPU\n"
        "Unable to determine the device handle for gpu 0000:5E:00.0: Unknown Error\n"
    )
    assert lost_in_output(text) == ["0000:3B:00.0", "0000:5E:00.0"]


# ------------------------------------------------------------------------ nvidia-smi probe
class FakeSmi:
    """Answers --query-gpu from the real H100 capture, field by field, like nvidia-smi would."""

    def __init__(
        self,
        known: set[str] | None = None,
        extra_lines: str = "",
        apps: str = H100_APPS,
        query: str = H100_QUERY,
        table: str = H100_TABLE,
    ):
        header, rows = csv_table(query)
        self.table = table
        self.cells = {h.split("[")[0].strip(): (h, v) for h, v in zip(header, rows[0], strict=True)}
        self.known = known if known is not None else set(self.cells)
        self.extra_lines = extra_lines
        self.apps = apps
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        self.calls.append(argv)
        assert isinstance(argv, list) and timeout_s > 0
        if len(argv) == 1:  # the default table, whose header has the CUDA version
            return 0, self.table, ""
        query = argv[1]
        if query.startswith("--query-compute-apps="):
            return 0, self.apps, ""
        fields = query.split("=", 1)[1].split(",")
        for f in fields:
            if f not in self.known:
                return 2, f'Field "{f}" is not a valid field to query.\n\n', ""
        header = [self.cells.get(f, (f, ""))[0] for f in fields]
        values = [self.cells.get(f, (f, "[N/A]"))[1] for f in fields]
        if "clocks_throttle_reasons.active" in fields:
            values[fields.index("clocks_throttle_reasons.active")] = "0x0000000000000044"
        return 0, self.extra_lines + csv_text(header, [values]), ""


def test_smi_probe_reads_gpu_and_processes():
    """The probe asks nvidia-smi with an argv list and attaches each GPU's processes."""
    fake = FakeSmi()
    result = NvidiaSmiProbe("nvidia-smi", runner=fake).read()
    assert result.backend == "nvidia-smi" and result.error is None
    [g] = result.gpus
    assert g.memory_used_mib == 19818 and [p.pid for p in g.processes or []] == [
        11327,
        11328,
        11345,
    ]
    assert fake.calls[0][0] == "nvidia-smi" and fake.calls[0][-1] == "--format=csv"


def test_smi_probe_retries_without_field_an_old_driver_rejects():
    """An unknown field fails the whole query; the probe asks again using the older field name."""
    known = (set(FakeSmi().cells) - {"clocks_event_reasons.active"}) | {
        "clocks_throttle_reasons.active"
    }
    fake = FakeSmi(known=known)
    [g] = NvidiaSmiProbe(runner=fake).read().gpus
    assert len(fake.calls) == 4  # refused, retried, the processes, the table's CUDA version
    assert g.throttle_reasons == ["sw_power_cap", "hw_thermal_slowdown"]


def test_smi_probe_reports_lost_gpu(tmp_path):
    """A GPU that fell off the bus is CRITICAL under the index it had when last recorded."""
    ctx = make_ctx(tmp_path)
    with ctx.store.session() as s:
        s.add(
            GpuSample(
                gpu_index=1,
                uuid="GPU-lost",
                verdict="OK",
                taken_at=datetime(2026, 12, 1),
                data={
                    "index": 1,
                    "name": "NVIDIA H100 80GB HBM3",
                    "pci_bus_id": "00000000:3B:00.0",
                },
            )
        )
    lost = "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost. Reboot the system\n"
    ctx.probe = NvidiaSmiProbe(runner=FakeSmi(extra_lines=lost))
    out = run_skill(gpu_health_check, ctx, {})
    assert out.overall == "CRITICAL"
    by_index = {v.index: v for v in out.gpus}
    assert by_index[0].verdict == "OK"
    assert by_index[1].verdict == "CRITICAL" and by_index[1].uuid == "GPU-lost"
    assert samples(ctx)[-1].verdict == "CRITICAL" and samples(ctx)[-1].gpu_index == 1


def test_smi_probe_failure_is_an_error_not_an_empty_machine():
    """nvidia-smi exiting non-zero without rows is reported as an error."""
    failed = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    probe = NvidiaSmiProbe(runner=lambda argv, t: (9, "", failed))
    result = probe.read()
    assert result.gpus == [] and "exited 9" in (result.error or "")


def test_nvml_reads_h100_capture_values(monkeypatch):
    """NVML values convert to the reading's units; the unsupported fan is 'not supported', not a problem."""
    nv = fake_pynvml([h100()])
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    result = NvmlProbe().read()
    [g] = result.gpus
    assert result.backend == "nvml" and result.error is None and nv.state["inits"] == 0
    assert (g.name, g.temperature_c, g.memory_total_mib, g.memory_used_mib) == (
        "NVIDIA H100 80GB HBM3",
        59,
        81559,
        19818,
    )
    assert (g.power_w, g.power_limit_w, g.energy_mj) == (629.45, 700.0, 987654321)
    assert (g.temp_slowdown_c, g.temp_shutdown_c) == (87, 92)
    assert (
        g.pci_bus_id == "00000000:00:09.0" and g.mig_mode == "Disabled" and g.throttle_reasons == []
    )
    assert [(p.pid, p.name, p.used_memory_mib) for p in g.processes or []][2] == (
        11345,
        "./gpu_burn",
        15690,
    )
    assert (
        g.fan_pct is None and g.unsupported == ["fan_pct", "retired_pages"] and g.unreadable == []
    )
    verdict = judge_reading(g, HealthThresholds())
    assert verdict.verdict == "OK" and verdict.not_supported == ["fan_pct", "retired_pages"]
    assert "not supported by this card: fan_pct, retired_pages" in verdict.summary


def test_nvml_older_driver_without_temperature_v(monkeypatch):
    """A driver without nvmlDeviceGetTemperatureV still gives the temperature through the old call."""
    nv = fake_pynvml([h100()])

    def missing(handle: int, sensor: int) -> int:
        raise nv.NVMLError(13)  # NVML_ERROR_FUNCTION_NOT_FOUND

    nv.nvmlDeviceGetTemperatureV = missing
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    [g] = NvmlProbe().read().gpus
    assert g.temperature_c == 59 and g.unreadable == []


def test_nvml_mig_and_consumer_cards_are_ok_with_unsupported_fields(monkeypatch):
    """Utilisation N/A under MIG and no ECC on a GeForce card are not problems; WDDM process memory is None."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([h200_mig(), rtx2080()]))
    h200, rtx = NvmlProbe().read().gpus
    assert h200.mig_mode == "Enabled" and h200.status("utilization_pct") == "unsupported"
    assert set(rtx.unsupported) == {
        "ecc_volatile_uncorrected",
        "ecc_aggregate_uncorrected",
        "retired_pages",
        "remapped_rows_pending",
        "remapped_rows_failed",
        "mig_mode",
    }
    assert rtx.fan_pct == 37 and rtx.processes and rtx.processes[0].used_memory_mib is None
    assert [judge_reading(g, HealthThresholds()).verdict for g in (h200, rtx)] == ["OK", "OK"]


def test_nvml_temperature_error_is_critical_never_ok(monkeypatch):
    """An ERR!-style failure on the temperature makes the GPU CRITICAL, with no invented value."""
    gpu = h100(fail={"fan": 3, "retired": 3, "temperature": 999})
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([gpu]))
    [g] = NvmlProbe().read().gpus
    assert (
        g.temperature_c is None
        and g.unreadable == ["temperature_c"]
        and "Unknown" in g.errors["temperature_c"]
    )
    v = judge_reading(g, HealthThresholds())
    assert v.verdict == "CRITICAL" and v.reasons[0].field == "temperature_c"


def test_nvml_all_essentials_unreadable_is_unknown(monkeypatch):
    """When nothing essential can be read the verdict is UNKNOWN: neither OK nor a made-up CRITICAL value."""
    fail = {"fan": 3, "retired": 3, "temperature": 999, "memory": 999, "utilization": 999}
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([h100(fail=fail)]))
    [g] = NvmlProbe().read().gpus
    assert set(g.unreadable) == {
        "temperature_c",
        "memory_total_mib",
        "memory_used_mib",
        "utilization_pct",
    }
    assert judge_reading(g, HealthThresholds()).verdict == "UNKNOWN"


def test_nvml_lost_gpu_is_critical(monkeypatch, tmp_path):
    """GPU_IS_LOST on the handle, or in the middle of a read, marks the GPU lost and CRITICAL."""
    gpus = [
        h100(),
        h100(uuid="GPU-b", fail={"handle": 15}),
        h100(uuid="GPU-c", fail={"memory": 15}),
    ]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus))
    result = NvmlProbe().read()
    assert result.lost == ["index 1", "index 2"]
    assert [g.lost for g in result.gpus] == [False, True, True]
    c = result.gpus[2]
    assert (
        c.memory_total_mib is None
        and c.utilization_pct is None
        and "utilization_pct" in c.unreadable
    )
    ctx = make_ctx(tmp_path, probe=NvmlProbe())
    out = run_skill(gpu_health_check, ctx, {})
    assert [v.verdict for v in out.gpus] == [
        "OK",
        "CRITICAL",
        "CRITICAL",
    ] and out.overall == "CRITICAL"
    assert out.gpus[1].reasons[0].field == "lost"


def test_nvml_missing_library_makes_the_backend_unavailable(monkeypatch, tmp_path):
    """No libnvidia-ml: NVML is unavailable, auto falls through to the next backend."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], init_error=12))
    assert NvmlProbe().available()[0] is False
    assert "LibraryNotFound" in (NvmlProbe().read().error or "")
    settings = Settings(home=str(tmp_path), gpu={"nvidia_smi": "no-such-nvidia-smi-here"})
    probe = make_probe(settings)
    assert isinstance(probe, NoGpuProbe)
    assert "planning for CPU" in (probe.read().message or "")


def test_make_probe_auto_prefers_nvml_then_inventory(monkeypatch, tmp_path):
    """auto takes NVML when it initialises, else a configured inventory when nothing else works."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([h100()]))
    assert isinstance(make_probe(Settings(home=str(tmp_path))), NvmlProbe)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], init_error=9))
    settings = Settings(
        home=str(tmp_path), gpu={"nvidia_smi": "no-such-nvidia-smi-here", "inventory": "inv.yaml"}
    )
    probe = make_probe(settings)
    assert isinstance(probe, InventoryProbe) and probe.path == tmp_path / "inv.yaml"
    assert isinstance(make_probe(Settings(home=str(tmp_path), gpu={"probe": "none"})), NoGpuProbe)


# ------------------------------------------------------------------------ inventory and no GPUs
INVENTORY = """\
gpus:
  - name: NVIDIA A100-SXM4-40GB
    memory_total_mib: 40960
  - name: NVIDIA H100 80GB HBM3
    uuid: GPU-inv-1
    memory_total_mib: 81559
    temperature_c: 91
"""


def test_inventory_probe_reads_declared_gpus(tmp_path):
    """A declared inventory gives readings in file order, with only the values declared."""
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    result = InventoryProbe(tmp_path / "inv.yaml").read()
    a, b = result.gpus
    assert (a.index, a.name, a.memory_total_mib, a.temperature_c) == (
        0,
        "NVIDIA A100-SXM4-40GB",
        40960,
        None,
    )
    assert (b.index, b.uuid, b.temperature_c) == (1, "GPU-inv-1", 91)


def test_inventory_errors_name_field_and_line(tmp_path):
    """A mistake in the inventory is reported with its field path and line, not raised from read()."""
    (tmp_path / "inv.yaml").write_text("gpus:\n  - name: A100\n    memory_total_mib: lots\n")
    result = InventoryProbe(tmp_path / "inv.yaml").read()
    assert result.gpus == [] and "inv.yaml:3" in (result.error or "")
    assert "gpus.0.memory_total_mib" in (result.error or "")


def test_no_gpu_probe_reports_no_gpus(tmp_path):
    """Without any backend the skill says NO_GPUS and why, and records nothing."""
    out = run_skill(gpu_health_check, make_ctx(tmp_path, probe=NoGpuProbe()), {})
    assert out.overall == "NO_GPUS" and out.gpus == [] and out.backend == "none"
    assert "no NVIDIA driver or nvidia-smi found; planning for CPU" in out.message
    assert out.recorded == 0


def test_backend_error_without_gpus_is_unknown(tmp_path):
    """A backend that failed to read is UNKNOWN, not an empty healthy machine."""
    probe = StaticProbe(ProbeResult(backend="nvml", error="NVML could not count GPUs: Unknown"))
    out = run_skill(gpu_health_check, make_ctx(tmp_path, probe=probe), {})
    assert out.overall == "UNKNOWN" and "could not count" in out.message


# ------------------------------------------------------------------------ verdict rules
def reading(**values: Any) -> GpuReading:
    base = {
        "index": 0,
        "name": "GPU",
        "temperature_c": 50.0,
        "memory_total_mib": 81559,
        "memory_used_mib": 1000,
        "utilization_pct": 10.0,
        "power_w": 100.0,
        "power_limit_w": 700.0,
    }
    return GpuReading(**{**base, **values})


@pytest.mark.parametrize(
    ("values", "verdict", "field"),
    [
        ({"temperature_c": 83.0}, "WARNING", "temperature_c"),
        ({"temperature_c": 90.0}, "CRITICAL", "temperature_c"),
        ({"temperature_c": 80.0, "temp_slowdown_c": 79.0}, "WARNING", "temperature_c"),
        ({"ecc_volatile_uncorrected": 1}, "CRITICAL", "ecc_volatile_uncorrected"),
        (
            {"ecc_volatile_uncorrected": 0, "ecc_aggregate_uncorrected": 3},
            "WARNING",
            "ecc_aggregate_uncorrected",
        ),
        ({"remapped_rows_pending": True}, "WARNING", "remapped_rows_pending"),
        ({"remapped_rows_failed": True}, "CRITICAL", "remapped_rows_failed"),
        ({"retired_pages": 2}, "WARNING", "retired_pages"),
        ({"throttle_reasons": ["hw_thermal_slowdown"]}, "WARNING", "throttle_reasons"),
        ({"throttle_reasons": ["hw_power_brake_slowdown"]}, "WARNING", "throttle_reasons"),
        ({"memory_used_mib": 80000}, "WARNING", "memory_used_mib"),
        ({"power_w": 699.0}, "WARNING", "power_w"),
        ({"lost": True}, "CRITICAL", "lost"),
        (
            {"memory_used_mib": None, "unreadable": ["memory_used_mib"]},
            "CRITICAL",
            "memory_used_mib",
        ),
        (
            {"ecc_volatile_uncorrected": None, "unreadable": ["ecc_volatile_uncorrected"]},
            "WARNING",
            "ecc_volatile_uncorrected",
        ),
    ],
)
def test_verdict_rules(values, verdict, field):
    """Each rule gives its verdict and names the field (and threshold) behind it."""
    v = judge_reading(reading(**values), HealthThresholds())
    assert v.verdict == verdict
    assert field in [r.field for r in v.reasons]


@pytest.mark.parametrize(
    "values",
    [
        {"throttle_reasons": ["sw_power_cap", "gpu_idle"]},
        {
            "fan_pct": None,
            "unsupported": ["fan_pct", "ecc_volatile_uncorrected", "utilization_pct"],
            "utilization_pct": None,
            "ecc_volatile_uncorrected": None,
        },
        {"ecc_volatile_uncorrected": 0, "ecc_aggregate_uncorrected": 0, "retired_pages": 0},
    ],
)
def test_ok_readings(values):
    """A power cap under load and fields the card lacks are not problems."""
    v = judge_reading(reading(**values), HealthThresholds())
    assert v.verdict == "OK" and v.reasons == []


def test_thresholds_come_from_settings(tmp_path):
    """The configured thresholds decide, and the result echoes them."""
    settings = Settings(home=str(tmp_path), health={"temp_warning_c": 50, "temp_critical_c": 55})
    probe = StaticProbe(ProbeResult(backend="static", gpus=[reading(temperature_c=56.0)]))
    out = run_skill(
        gpu_health_check, make_ctx(tmp_path, probe=probe, settings=settings), {"record": False}
    )
    assert out.overall == "CRITICAL" and out.thresholds.temp_critical_c == 55
    assert out.gpus[0].reasons[0].threshold == 55


def test_reading_refuses_a_value_marked_missing():
    """The field value convention holds: a field marked unreadable can never carry a value."""
    with pytest.raises(ValueError):
        GpuReading(index=0, temperature_c=0.0, unreadable=["temperature_c"])


# ------------------------------------------------------------------------ the skill and the store
def test_records_one_sample_per_gpu(tmp_path):
    """Each verdict lands in GpuSample with the reading as data, stamped with ctx.now."""
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    ctx = make_ctx(tmp_path, probe=InventoryProbe(tmp_path / "inv.yaml"))
    out = run_skill(gpu_health_check, ctx, {})
    assert out.overall == "CRITICAL" and out.recorded == 2
    rows = samples(ctx)
    assert [(r.gpu_index, r.verdict, r.taken_at) for r in rows] == [
        (0, "OK", NOW),
        (1, "CRITICAL", NOW),
    ]
    assert rows[1].uuid == "GPU-inv-1" and rows[1].data == out.gpus[1].reading.model_dump(
        mode="json"
    )
    assert rows[1].data["memory_total_mib"] == 81559


def test_record_false_writes_nothing(tmp_path):
    """A dry look at the GPUs leaves the store untouched."""
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    ctx = make_ctx(tmp_path, probe=InventoryProbe(tmp_path / "inv.yaml"))
    assert run_skill(gpu_health_check, ctx, {"record": False}).recorded == 0 and samples(ctx) == []


def test_gpu_filter_and_unknown_index(tmp_path):
    """Asking for some GPUs checks only those; an index the backend does not see is UNKNOWN."""
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    ctx = make_ctx(tmp_path, probe=InventoryProbe(tmp_path / "inv.yaml"))
    out = run_skill(gpu_health_check, ctx, {"gpus": [0, 5]})
    assert [(v.index, v.verdict) for v in out.gpus] == [(0, "OK"), (5, "UNKNOWN")]
    assert [r.gpu_index for r in samples(ctx)] == [0]


def test_probe_from_settings_when_ctx_has_none(tmp_path):
    """Without ctx.probe the skill builds one from settings (here: the declared inventory)."""
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    settings = Settings(home=str(tmp_path), gpu={"probe": "inventory", "inventory": "inv.yaml"})
    out = run_skill(gpu_health_check, make_ctx(tmp_path, settings=settings), {"record": False})
    assert out.backend == "inventory" and len(out.gpus) == 2


def test_bad_arguments_go_back_to_the_planner(tmp_path):
    """Arguments are validated by the input model before anything is read."""
    with pytest.raises(BadArguments, match="gpus"):
        run_skill(gpu_health_check, make_ctx(tmp_path, probe=NoGpuProbe()), {"gpus": "all"})


def test_same_inputs_same_result(tmp_path):
    """Deterministic: two checks of the same readings give the same result."""
    probe = StaticProbe(
        ProbeResult(backend="static", gpus=[reading(temperature_c=85.0), reading(index=1)])
    )
    ctx = make_ctx(tmp_path, probe=probe)
    assert run_skill(gpu_health_check, ctx, {}) == run_skill(gpu_health_check, ctx, {})


# ------------------------------------------------------------------------ pasted nvidia-smi output
H100_Q = (FIXTURES / "h100_80gb_load_q.txt").read_text()
H100_TABLE = (FIXTURES / "h100_80gb_load_table.txt").read_text()


def test_paste_is_judged_but_not_recorded(tmp_path):
    """A colleague's `-q` paste gets the same verdicts; it is not this machine, so nothing is recorded."""
    ctx = make_ctx(tmp_path, probe=NoGpuProbe())
    out = run_skill(gpu_health_check, ctx, {"from_text": H100_Q})
    assert out.backend == "paste:q" and out.overall == "OK" and out.recorded == 0
    [v] = out.gpus
    assert (v.index, v.name, v.reading.memory_used_mib) == (0, "NVIDIA H100 80GB HBM3", 19818)
    assert samples(ctx) == [] and "not recorded" in out.message


def test_paste_recorded_when_asked(tmp_path):
    """record=true says the saved output is this machine's: its verdicts then feed placement."""
    path = tmp_path / "smi.txt"
    path.write_text(H100_TABLE)
    ctx = make_ctx(tmp_path)
    out = run_skill(gpu_health_check, ctx, {"from_file": str(path), "record": True})
    assert out.backend == "paste:table" and out.recorded == 1
    assert [(r.gpu_index, r.verdict) for r in samples(ctx)] == [(0, "OK")]


def test_paste_is_not_compared_with_this_machine(tmp_path):
    """A paste showing one GPU does not make this machine's other recorded GPUs 'disappeared'."""
    ctx = make_ctx(tmp_path)
    record_sample(ctx, 1, "GPU-here-1", "OK")
    out = run_skill(gpu_health_check, ctx, {"from_text": H100_Q})
    assert [v.index for v in out.gpus] == [0] and out.overall == "OK"


def test_lost_gpu_in_a_paste_is_not_matched_with_this_machine(tmp_path):
    """A lost GPU in a colleague's paste is named by its bus id, never by this machine's GPU there."""
    ctx = make_ctx(tmp_path)
    with ctx.store.session() as s:
        s.add(
            GpuSample(
                gpu_index=1, uuid="GPU-here", verdict="OK", data={"pci_bus_id": "0000:3B:00.0"}
            )
        )
    lost = "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.\n"
    out = run_skill(gpu_health_check, ctx, {"from_text": lost + H100_Q})
    assert out.overall == "CRITICAL"
    [gone] = [v for v in out.gpus if v.verdict == "CRITICAL"]
    assert (gone.index, gone.uuid) == (None, None) and "0000:3B:00.0" in gone.summary


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"from_text": "hello", "from_file": "x"}, "not both"),
        ({"from_text": "hello"}, "not recognised as nvidia-smi output"),
        ({"from_file": "/no/such/smi.txt"}, "cannot read /no/such/smi.txt"),
    ],
)
def test_bad_paste_goes_back_to_the_caller(tmp_path, args, match):
    """Two sources, text that is not nvidia-smi output, or a missing file: an input error saying so."""
    with pytest.raises(BadArguments, match=match):
        run_skill(gpu_health_check, make_ctx(tmp_path, probe=NoGpuProbe()), args)


# ------------------------------------------------------------------------ GPUs the probe no longer sees
def record_sample(ctx: SkillContext, index: int, uuid: str | None, verdict: str) -> None:
    """A sample from an earlier check, the day before NOW."""
    data = {"index": index, "uuid": uuid, "name": "NVIDIA H100 80GB HBM3"}
    with ctx.store.session() as s:
        s.add(
            GpuSample(
                gpu_index=index,
                uuid=uuid,
                verdict=verdict,
                taken_at=datetime(2026, 12, 1),
                data=data,
            )
        )


def static_gpus(*present: int, temperature: float = 50.0) -> StaticProbe:
    gpus = [reading(index=i, uuid=f"GPU-{i}", temperature_c=temperature) for i in present]
    return StaticProbe(ProbeResult(backend="static", gpus=gpus))


def test_inventory_gpu_not_seen_is_critical(tmp_path):
    """The inventory declares two GPUs (by UUID, and by index); the probe sees one: the other is CRITICAL."""
    (tmp_path / "inv.yaml").write_text(
        "gpus:\n"
        "  - {name: NVIDIA H100 80GB HBM3, uuid: GPU-0, memory_total_mib: 81559}\n"
        "  - {name: NVIDIA H100 80GB HBM3, memory_total_mib: 81559}\n"
        "  - {name: NVIDIA H100 80GB HBM3, uuid: GPU-7, index: 2, memory_total_mib: 81559}\n"
    )
    settings = Settings(home=str(tmp_path), gpu={"inventory": "inv.yaml"})
    ctx = make_ctx(tmp_path, probe=static_gpus(0), settings=settings)
    out = run_skill(gpu_health_check, ctx, {})
    assert out.overall == "CRITICAL"
    by_index = {v.index: v for v in out.gpus}
    assert by_index[0].verdict == "OK"
    for i in (1, 2):
        assert by_index[i].verdict == "CRITICAL" and by_index[i].missing
        assert "expected by the inventory, not seen by the probe" in by_index[i].reasons[0].message
    assert by_index[2].uuid == "GPU-7"
    assert {(r.gpu_index, r.verdict) for r in samples(ctx)} == {
        (0, "OK"),
        (1, "CRITICAL"),
        (2, "CRITICAL"),
    }


def test_unreadable_inventory_is_a_note_not_a_failure(tmp_path):
    """A broken inventory file does not stop the check; the message says it was not compared."""
    (tmp_path / "inv.yaml").write_text("gpus:\n  - name: A100\n    memory_total_mib: lots\n")
    settings = Settings(home=str(tmp_path), gpu={"inventory": "inv.yaml"})
    out = run_skill(
        gpu_health_check, make_ctx(tmp_path, probe=static_gpus(0), settings=settings), {}
    )
    assert out.overall == "OK" and "inventory not compared" in out.message


def test_disappeared_gpu_is_critical_until_it_answers_again(tmp_path):
    """A GPU recorded earlier that the probe no longer sees is CRITICAL, stays so at the next check,
    and clears when it answers again; placement follows the latest verdict of each index."""
    ctx = make_ctx(tmp_path, probe=static_gpus(0, 1))
    run_skill(gpu_health_check, ctx, {})
    ctx.probe, ctx.now = static_gpus(0), datetime(2026, 12, 2, 4, 0)
    out = run_skill(gpu_health_check, ctx, {})
    assert out.overall == "CRITICAL"
    [gone] = [v for v in out.gpus if v.index == 1]
    assert gone.missing and gone.uuid == "GPU-1" and gone.reading is None
    assert "GPU disappeared since the last check" in gone.reasons[0].message
    [row] = [r for r in samples(ctx) if r.gpu_index == 1 and r.taken_at == ctx.now]
    assert row.verdict == "CRITICAL" and row.uuid == "GPU-1" and row.data["missing"]
    assert slot_verdicts(ctx) == {0: "OK", 1: "CRITICAL"}

    ctx.now = datetime(2026, 12, 2, 5, 0)
    assert run_skill(gpu_health_check, ctx, {}).gpus[-1].missing  # still gone: still reported
    ctx.probe, ctx.now = static_gpus(0, 1), datetime(2026, 12, 2, 6, 0)
    back = run_skill(gpu_health_check, ctx, {})
    assert back.overall == "OK" and not any(v.missing for v in back.gpus)
    # Back, but quarantined until health.recover_after_checks (3) healthy checks in a row.
    assert slot_verdicts(ctx) == {0: "OK", 1: "UNKNOWN"}
    for hour in (7, 8):
        ctx.now = datetime(2026, 12, 2, hour, 0)
        out = run_skill(gpu_health_check, ctx, {})
    assert out.recovered == ["GPU 1"]
    assert slot_verdicts(ctx) == {0: "OK", 1: "OK"}


def test_gpu_that_fell_off_shifts_the_indices(tmp_path):
    """GPU 1 falls off and GPU 2 answers as index 1: GPU-1 disappeared, and index 2 no longer exists."""
    ctx = make_ctx(tmp_path, probe=static_gpus(0, 1, 2))
    run_skill(gpu_health_check, ctx, {})
    shifted = [reading(index=0, uuid="GPU-0"), reading(index=1, uuid="GPU-2")]
    ctx.probe = StaticProbe(ProbeResult(backend="static", gpus=shifted))
    ctx.now = datetime(2026, 12, 2, 4, 0)
    out = run_skill(gpu_health_check, ctx, {})
    missing = {v.index: v.reasons[0].message for v in out.gpus if v.missing}
    assert "GPU disappeared since the last check (GPU-1" in missing[1]
    assert (
        "no GPU answers at index 2 any more" in missing[2] and "now answers as GPU 1" in missing[2]
    )
    # Index 1 is GPU-2 now (recorded after the disappeared GPU-1); index 2 is quarantined.
    assert slot_verdicts(ctx) == {0: "OK", 1: "OK", 2: "CRITICAL"}


def test_missing_rules_need_a_successful_read(tmp_path):
    """A backend that could not read at all says nothing about single GPUs: UNKNOWN, no 'disappeared'."""
    ctx = make_ctx(tmp_path)
    record_sample(ctx, 0, "GPU-0", "OK")
    ctx.probe = StaticProbe(ProbeResult(backend="nvml", error="NVML could not count GPUs"))
    out = run_skill(gpu_health_check, ctx, {})
    assert out.overall == "UNKNOWN" and out.gpus == []


def test_gpu_filter_applies_to_missing_gpus(tmp_path):
    """Checking only GPU 0 does not report (or record) a missing GPU 1."""
    ctx = make_ctx(tmp_path)
    record_sample(ctx, 1, "GPU-1", "OK")
    ctx.probe = static_gpus(0)
    out = run_skill(gpu_health_check, ctx, {"gpus": [0]})
    assert [v.index for v in out.gpus] == [0] and out.overall == "OK"


# ------------------------------------------------------------------------ placement reads the latest
def gpu_slots(ctx: SkillContext):
    """The GPUs as the loop's placement snapshot sees them (latest sample per GPU)."""
    from nightshift.runtime.scheduling.snapshot import load_snapshot

    return load_snapshot(ctx.store, NOW).gpus


def slot_verdicts(ctx: SkillContext) -> dict[int, str]:
    return {s.index: s.verdict for s in gpu_slots(ctx)}


def test_placement_quarantines_critical_until_a_later_check_clears_it(tmp_path):
    """Only the latest recorded verdict counts: a CRITICAL GPU is skipped, then used once a check
    says OK (with health.recover_after_checks: 1; the default 3 is tested in test_gpu_recovery)."""
    from nightshift.runtime.scheduling.placement import PendingJob, Snapshot, place

    settings = Settings(home=str(tmp_path), health={"recover_after_checks": 1})
    ctx = make_ctx(tmp_path, probe=static_gpus(0, temperature=95.0), settings=settings)
    assert run_skill(gpu_health_check, ctx, {}).overall == "CRITICAL"
    job = PendingJob(id=1, gpus=1, submitted_at=NOW)
    slots = gpu_slots(ctx)
    assert [(s.index, s.verdict) for s in slots] == [(0, "CRITICAL")]
    held = place(Snapshot(now=NOW, pending=[job], gpus=slots))
    assert held.starts == [] and "quarantined" in held.holds[1]

    ctx.probe, ctx.now = static_gpus(0), datetime(2026, 12, 2, 4, 0)
    assert run_skill(gpu_health_check, ctx, {}).overall == "OK"
    slots = gpu_slots(ctx)
    assert [(s.index, s.verdict) for s in slots] == [(0, "OK")]
    assert [s.gpus for s in place(Snapshot(now=NOW, pending=[job], gpus=slots)).starts] == [[0]]


# ------------------------------------------------------------------------ `nightshift health`
def test_cli_health_from_q_json(home):
    """`health --from FILE --json` judges a saved `-q` output and prints the result model; exit 0 for OK."""
    done = nightshift("health", "--from", str(FIXTURES / "h100_80gb_load_q.txt"), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["backend"], out["overall"], out["recorded"]) == ("paste:q", "OK", 0)
    [gpu] = out["gpus"]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["reading"]["memory_used_mib"] == 19818
    assert [p["pid"] for p in gpu["reading"]["processes"]] == [11327, 11328, 11345]


Q_TEMP = "GPU Current Temp                               : 59 C"
Q_UNREADABLE = [
    (Q_TEMP, "GPU Current Temp : ERR!"),
    ("GPU                                            : 100 %", "GPU : ERR!"),
    ("Total                                          : 81559 MiB", "Total : ERR!"),
    ("Used                                           : 19818 MiB", "Used : ERR!"),
]


@pytest.mark.parametrize(
    ("edits", "overall", "code"),
    [
        ([("Pending                                        : No", "Pending : Yes")], "WARNING", 1),
        ([(Q_TEMP, "GPU Current Temp : 91 C")], "CRITICAL", 2),
        (Q_UNREADABLE, "UNKNOWN", 3),
    ],
)
def test_cli_health_exit_codes(home, tmp_path, edits, overall, code):
    """The table names the GPU and its verdict; the exit code follows the monitoring convention."""
    text = H100_Q
    for old, new in edits:
        assert old in text
        text = text.replace(old, new, 1)
    path = tmp_path / "smi.txt"
    path.write_text(text)
    done = nightshift("health", "--from", str(path))
    assert done.returncode == code, done.stdout + done.stderr
    assert "NVIDIA H100 80GB HBM3" in done.stdout and f"overall: {overall}" in done.stdout


def test_cli_health_unreadable_file_is_unknown(home):
    """A check that cannot run at all exits 3 (UNKNOWN) with one clear error line."""
    done = nightshift("health", "--from", "/no/such/smi.txt")
    assert done.returncode == 3 and "cannot read /no/such/smi.txt" in done.stderr


def test_cli_health_this_machine_records(home):
    """Without --from the configured probe is read and the verdicts recorded; --no-record records none."""
    (home / "inv.yaml").write_text(INVENTORY)
    env = {"NIGHTSHIFT_GPU__PROBE": "inventory", "NIGHTSHIFT_GPU__INVENTORY": "inv.yaml"}
    done = nightshift("health", "--json", env=env)
    assert done.returncode == 2, done.stderr
    out = json.loads(done.stdout)
    assert (out["backend"], out["overall"], out["recorded"]) == ("inventory", "CRITICAL", 2)
    again = json.loads(nightshift("health", "--json", "--no-record", env=env).stdout)
    assert again["recorded"] == 0
