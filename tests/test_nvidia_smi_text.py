"""The nvidia-smi text readers (`-q`, the default table, the CSV query) on the real captures in
tests/fixtures/nvidia_smi, and on edits of them that put in the faults a real machine shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nightshift.runtime.config import HealthThresholds
from nightshift.runtime.gpu.gpu import GpuReading
from nightshift.runtime.gpu.nvidia_smi_text import (
    TextProbe,
    cell_kind,
    detect_format,
    parse_any,
    parse_q_text,
    parse_table,
)
from nightshift.skills.gpu_health import judge_reading

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia_smi"
H100_Q = (FIXTURES / "h100_80gb_load_q.txt").read_text()
H100_TABLE = (FIXTURES / "h100_80gb_load_table.txt").read_text()
H100_CSV = (FIXTURES / "h100_80gb_load_query_gpu.csv").read_text()
H100_APPS = (FIXTURES / "h100_80gb_load_query_compute_apps.csv").read_text()
H200_MIG_TABLE = (FIXTURES / "h200_mig_idle_table.txt").read_text()
WIN_TABLE = (FIXTURES / "win_rtx2080super_idle_table.txt").read_text()
EXPORTER_CSV = (FIXTURES / "exporter_testdata_query.csv").read_text()
H100_PROCS = [
    (11327, "/root/tools/memhog", 2566),
    (11328, "/root/tools/memhog", 1542),
    (11345, "./gpu_burn", 15690),
]
T = HealthThresholds()


def procs(g: GpuReading) -> list[tuple[int, str | None, int | None]]:
    return [(p.pid, p.name, p.used_memory_mib) for p in g.processes or []]


def edit(text: str, old: str, new: str, count: int = 1) -> str:
    """Replace exactly `count` occurrences, so an edit that no longer matches the capture fails loudly."""
    assert text.count(old) >= count, old
    return text.replace(old, new, count)


def q_line(key: str, value: str) -> str:
    """A `-q` line as nvidia-smi pads it (values start at column 56 under a 4-space section)."""
    return f"{key:<47}: {value}"


# ------------------------------------------------------------------------------- -q, real capture
def test_q_h100_under_load():
    """Every value gpu_health_check uses, read from the real H100 `-q` capture."""
    [g] = parse_q_text(H100_Q)
    assert (g.index, g.name, g.uuid, g.pci_bus_id) == (
        0,
        "NVIDIA H100 80GB HBM3",
        "GPU-00000000-0000-0000-0000-000000000000",
        "00000000:00:09.0",
    )
    assert (g.temperature_c, g.memory_used_mib, g.memory_total_mib, g.utilization_pct) == (
        59,
        19818,
        81559,
        100,
    )
    assert (g.power_w, g.power_limit_w) == (629.45, 700.0)  # average draw, current limit
    assert (g.ecc_volatile_uncorrected, g.ecc_aggregate_uncorrected) == (0, 0)
    assert (g.remapped_rows_pending, g.remapped_rows_failed) == (False, False)
    assert g.throttle_reasons == [] and g.mig_mode == "Disabled"
    assert procs(g) == H100_PROCS
    assert sorted(g.unsupported) == ["fan_pct", "retired_pages"] and g.unreadable == []
    assert g.energy_mj is None and g.status("energy_mj") == "absent"
    assert not g.lost


def test_q_tlimit_offsets_are_not_thresholds():
    """'GPU Slowdown T.Limit Temp : -2 C' is an offset, not a slowdown at -2 °C: no false WARNING."""
    [g] = parse_q_text(H100_Q)
    assert g.temp_slowdown_c is None and g.temp_shutdown_c is None
    assert judge_reading(g, T).verdict == "OK"


def test_q_memory_power_section_is_not_board_power():
    """'GPU Memory Power Readings' (85.83 W) must not stand in for the board's draw."""
    text = edit(H100_Q, "    GPU Power Readings\n", "    GPU Power Readingz\n")
    [g] = parse_q_text(text)
    assert g.power_w is None and g.status("power_w") == "absent"


# ------------------------------------------------------------------------------- -q, edited
def test_q_older_driver_layout():
    """Older drivers: 'Clocks Throttle Reasons', 'Power Readings' with 'Power Draw'/'Enforced Power
    Limit', absolute slowdown/shutdown temperatures, and Single/Double Bit ECC sections."""
    text = edit(H100_Q, "    Clocks Event Reasons\n", "    Clocks Throttle Reasons\n")
    text = edit(text, "    GPU Power Readings\n", "    Power Readings\n")
    text = edit(text, "        Average Power Draw    ", "        Power Draw            ")
    text = edit(text, "        Current Power Limit   ", "        Enforced Power Limit  ")
    text = edit(
        text, "GPU Shutdown T.Limit Temp                      : -8 C", "GPU Shutdown Temp : 92 C"
    )
    text = edit(
        text, "GPU Slowdown T.Limit Temp                      : -2 C", "GPU Slowdown Temp : 89 C"
    )
    old_ecc = text[text.index("    ECC Errors\n") : text.index("    Retired Pages\n")]
    new_ecc = (
        "    ECC Errors\n"
        "        Volatile\n"
        "            Single Bit\n"
        "                Device Memory             : 4\n"
        "                Total                     : 4\n"
        "            Double Bit\n"
        "                Device Memory             : 0\n"
        "                Total                     : 0\n"
        "        Aggregate\n"
        "            Single Bit\n"
        "                Total                     : 9\n"
        "            Double Bit\n"
        "                Device Memory             : 2\n"
        "                Register File             : 1\n"
        "                Total                     : 3\n"
    )
    text = edit(text, old_ecc, new_ecc)
    text = edit(
        text,
        "HW Thermal Slowdown                        : Not Active",
        "HW Thermal Slowdown : Active",
    )
    [g] = parse_q_text(text)
    assert (g.power_w, g.power_limit_w) == (629.45, 700.0)
    assert (g.temp_slowdown_c, g.temp_shutdown_c) == (89, 92)
    assert (g.ecc_volatile_uncorrected, g.ecc_aggregate_uncorrected) == (0, 3)
    assert g.throttle_reasons == ["hw_thermal_slowdown"]
    verdict = judge_reading(g, T)
    assert verdict.verdict == "WARNING"
    assert {r.field for r in verdict.reasons} == {"ecc_aggregate_uncorrected", "throttle_reasons"}


@pytest.mark.parametrize(
    ("old", "new", "verdict", "field"),
    [
        (
            "Pending                                        : No",
            "Pending : Yes",
            "WARNING",
            "remapped_rows_pending",
        ),
        (
            "Remapping Failure Occurred                     : No",
            "Remapping Failure Occurred : Yes",
            "CRITICAL",
            "remapped_rows_failed",
        ),
        (
            "HW Power Brake Slowdown                    : Not Active",
            "HW Power Brake Slowdown : Active",
            "WARNING",
            "throttle_reasons",
        ),
        (
            "GPU Current Temp                               : 59 C",
            "GPU Current Temp : 91 C",
            "CRITICAL",
            "temperature_c",
        ),
        (
            "GPU Current Temp                               : 59 C",
            "GPU Current Temp : ERR!",
            "CRITICAL",
            "temperature_c",
        ),
        (
            "Used                                           : 19818 MiB",
            "Used : [Unknown Error]",
            "CRITICAL",
            "memory_used_mib",
        ),
    ],
)
def test_q_faults_give_their_verdicts(old, new, verdict, field):
    """Pending row remaps, a failed remap, a power-brake slowdown, heat and failed reads, as `-q` prints them."""
    [g] = parse_q_text(edit(H100_Q, old, new))
    v = judge_reading(g, T)
    assert v.verdict == verdict and field in [r.field for r in v.reasons]


def test_q_volatile_uncorrected_ecc_is_critical():
    """Uncorrectable DRAM errors since the driver loaded are CRITICAL; SRAM parity and SEC-DED add up."""
    volatile_dram = "            DRAM Uncorrectable                         : 0\n"
    text = edit(H100_Q, volatile_dram, volatile_dram.replace(": 0", ": 2"))  # Volatile comes first
    text = edit(
        text,
        "SRAM Uncorrectable Parity                  : 0",
        "SRAM Uncorrectable Parity                  : 1",
    )
    [g] = parse_q_text(text)
    assert (g.ecc_volatile_uncorrected, g.ecc_aggregate_uncorrected) == (3, 0)
    v = judge_reading(g, T)
    assert v.verdict == "CRITICAL" and v.reasons[0].field == "ecc_volatile_uncorrected"


def test_q_error_words_are_unreadable_never_zero():
    """ERR!, [Unknown Error] and N/A land as unreadable / unsupported with no value; all essentials
    unreadable is UNKNOWN."""
    text = edit(
        H100_Q, "GPU Current Temp                               : 59 C", "GPU Current Temp : ERR!"
    )
    text = edit(
        text,
        "Total                                          : 81559 MiB",
        "Total : [Unknown Error]",
    )
    text = edit(
        text, "Used                                           : 19818 MiB", "Used : Unknown Error"
    )
    text = edit(text, "GPU                                            : 100 %", "GPU : ERR!")
    [g] = parse_q_text(text)
    assert set(g.unreadable) == {
        "temperature_c",
        "memory_total_mib",
        "memory_used_mib",
        "utilization_pct",
    }
    assert g.errors["temperature_c"] == "ERR!" and g.errors["memory_total_mib"] == "[Unknown Error]"
    assert g.temperature_c is None and g.memory_used_mib is None
    assert judge_reading(g, T).verdict == "UNKNOWN"


def test_q_gpu_is_lost():
    """'GPU is lost' in the values marks the GPU lost: CRITICAL whatever else it reads."""
    text = edit(
        H100_Q, "Used                                           : 19818 MiB", "Used : GPU is lost"
    )
    [g] = parse_q_text(text)
    assert g.lost and g.memory_used_mib is None and "memory_used_mib" in g.unreadable
    v = judge_reading(g, T)
    assert v.verdict == "CRITICAL" and v.reasons[0].field == "lost"


def test_q_lost_line_before_the_report():
    """A GPU nvidia-smi cannot reach is named only by bus id above the report; the probe reports it lost."""
    lost = (
        "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost. "
        "Reboot the system to recover this GPU\n"
    )
    probe = TextProbe(lost + H100_Q, "ticket")
    result = probe.read()
    assert result.lost == ["0000:3B:00.0"] and len(result.gpus) == 1
    assert result.backend == "paste:q" and "ticket" in (result.message or "")


def test_q_mig_enabled():
    """MIG devices' own ECC and memory sections do not stand in for the GPU's; utilisation N/A is unsupported."""
    mig_device = (
        "    MIG Device\n"
        "        Index                                          : 0\n"
        "        GPU Instance ID                                : 2\n"
        "        Compute Instance ID                            : 0\n"
        "        ECC Errors\n"
        "            Volatile\n"
        "                SRAM Uncorrectable                     : 7\n"
        "        Shared FB Memory Usage\n"
        "            Total                                      : 71424 MiB\n"
        "            Used                                       : 22 MiB\n"
    )
    text = edit(
        H100_Q,
        "        Current                                        : Disabled\n"
        "        Pending                                        : Disabled\n",
        "        Current                                        : Enabled\n"
        "        Pending                                        : Enabled\n" + mig_device,
    )
    text = edit(text, "GPU                                            : 100 %", "GPU : N/A")
    [g] = parse_q_text(text)
    assert g.mig_mode == "Enabled" and g.status("utilization_pct") == "unsupported"
    assert (g.memory_total_mib, g.memory_used_mib, g.ecc_volatile_uncorrected) == (81559, 19818, 0)
    assert judge_reading(g, T).verdict == "OK"


def test_q_processes_none_wddm_and_graphics():
    """'Processes : None' is an empty list; WDDM's memory text is None; graphics-only processes are left out."""
    none = H100_Q[: H100_Q.index("    Processes\n")] + "    Processes : None\n"
    assert parse_q_text(none)[0].processes == []
    text = edit(
        H100_Q,
        "Used GPU Memory               : 2566 MiB",
        "Used GPU Memory : Not available in WDDM driver model",
    )
    text = edit(text, "            Type                          : C\n", "            Type : C+G\n")
    text = edit(text, "            Type                          : C\n", "            Type : G\n")
    [g] = parse_q_text(text)
    assert procs(g) == [(11327, "/root/tools/memhog", None), (11345, "./gpu_burn", 15690)]


def test_q_remapped_rows_na_and_energy():
    """A section printed as 'N/A' makes its fields unsupported; a total energy counter in J is kept in mJ."""
    block = H100_Q[H100_Q.index("    Remapped Rows\n") : H100_Q.index("    Temperature\n")]
    text = edit(H100_Q, block, "    Remapped Rows : N/A\n")
    text = edit(
        text,
        "        Max Power Limit                                : 700.00 W\n",
        "        Max Power Limit                                : 700.00 W\n"
        "        Total Energy Consumption                       : 123456.789 J\n",
    )
    [g] = parse_q_text(text)
    assert (
        g.status("remapped_rows_pending") == "unsupported"
        and g.status("remapped_rows_failed") == "unsupported"
    )
    assert g.energy_mj == 123456789


def test_q_several_gpus_in_order():
    """GPUs are indexed in the order the report lists them; a paste's own indentation does not matter."""
    block = H100_Q[H100_Q.index("GPU 00000000:00:09.0") :]
    second = edit(block, "00000000:00:09.0", "00000000:0A:00.0", count=2)  # header and Bus Id
    second = edit(
        second, "GPU Current Temp                               : 59 C", "GPU Current Temp : 85 C"
    )
    pasted = "\n".join("    " + ln for ln in (H100_Q + second).splitlines())
    a, b = parse_q_text(pasted)
    assert (a.index, a.pci_bus_id, a.temperature_c) == (0, "00000000:00:09.0", 59)
    assert (b.index, b.pci_bus_id, b.temperature_c) == (1, "00000000:0A:00.0", 85)


# ------------------------------------------------------------------------------- table
def test_table_h100_under_load():
    """The default table's values (power in whole watts); what it does not print is absent."""
    [g] = parse_table(H100_TABLE)
    assert (g.index, g.name, g.pci_bus_id) == (0, "NVIDIA H100 80GB HBM3", "00000000:00:09.0")
    assert (g.temperature_c, g.memory_used_mib, g.memory_total_mib, g.utilization_pct) == (
        59,
        19818,
        81559,
        100,
    )
    assert (g.power_w, g.power_limit_w, g.ecc_volatile_uncorrected, g.mig_mode) == (
        629,
        700,
        0,
        "Disabled",
    )
    assert procs(g) == H100_PROCS
    assert g.unsupported == ["fan_pct"] and g.unreadable == []
    for absent in (
        "uuid",
        "throttle_reasons",
        "retired_pages",
        "remapped_rows_pending",
        "ecc_aggregate_uncorrected",
    ):
        assert getattr(g, absent) is None
    for absent in ("throttle_reasons", "retired_pages", "remapped_rows_pending", "energy_mj"):
        assert g.status(absent) == "absent"


def test_table_h200_mig():
    """H200 with MIG: utilisation N/A is unsupported, ECC 'On' gives way to the MIG instances' counts."""
    [g] = parse_table(H200_MIG_TABLE)
    assert (g.name, g.pci_bus_id, g.temperature_c, g.power_w, g.power_limit_w) == (
        "NVIDIA H200",
        "00000000:83:00.0",
        28,
        78,
        700,
    )
    assert (g.memory_used_mib, g.memory_total_mib, g.mig_mode) == (55, 143771, "Enabled")
    assert g.status("utilization_pct") == "unsupported" and g.status("fan_pct") == "unsupported"
    assert g.ecc_volatile_uncorrected == 0 and g.processes == []
    assert judge_reading(g, T).verdict == "OK"


def test_table_mig_ecc_counts_each_gpu_instance_once():
    """Compute instances of one GPU instance share its memory and print the same count: 3 + 1, not 3 + 3 + 1."""
    lines = []
    for line in H200_MIG_TABLE.splitlines():
        if line.startswith(("|  0    2   0   0", "|  0    2   1   1")):
            line = re.sub(r"\| (\d+)      0 \|", r"| \1      3 |", line)
        elif line.startswith("|  0    9   0   3"):
            line = re.sub(r"\| (\d+)      0 \|", r"| \1      1 |", line)
        lines.append(line)
    [g] = parse_table("\n".join(lines))
    assert g.ecc_volatile_uncorrected == 4
    assert judge_reading(g, T).verdict == "CRITICAL"


def test_table_windows_full_of_na():
    """WDDM: no ECC, no MIG (N/A = unsupported), process memory N/A = None, names as truncated."""
    [g] = parse_table(WIN_TABLE)
    assert (g.name, g.pci_bus_id, g.fan_pct, g.temperature_c) == (
        "NVIDIA GeForce RTX 2080 ...",
        "00000000:0C:00.0",
        37,
        40,
    )
    assert (
        g.power_w,
        g.power_limit_w,
        g.memory_used_mib,
        g.memory_total_mib,
        g.utilization_pct,
    ) == (38, 250, 702, 8192, 0)
    assert sorted(g.unsupported) == ["ecc_volatile_uncorrected", "mig_mode"]
    assert len(g.processes or []) == 10
    assert procs(g)[0] == (2056, r"C:\Windows\System32\dwm.exe", None)
    assert procs(g)[8] == (20372, r"...m Files\NZXT CAM\NZXT CAM.exe", None)
    assert judge_reading(g, T).verdict == "OK"


def test_table_err_cells_and_a_second_gpu():
    """A second GPU block is read under its own index; its ERR! cells are unreadable, never zero."""
    block = H100_TABLE[H100_TABLE.index("|   0  NVIDIA H100") : H100_TABLE.index("\n\n")]
    second = edit(block, "|   0  NVIDIA H100", "|   1  NVIDIA H100")
    second = edit(second, "00000000:00:09.0", "00000000:0A:00.0")
    second = edit(
        second,
        "| N/A   59C    P0            629W /  700W |   19818MiB /  81559MiB |    100%",
        "| ERR!  ERR!   P0           ERR! /  700W |   19818MiB /  81559MiB |    ERR!",
    )
    text = edit(H100_TABLE, block, block + "\n" + second)
    a, b = parse_table(text)
    assert (a.index, a.temperature_c) == (0, 59)
    assert (b.index, b.pci_bus_id, b.temperature_c, b.power_w, b.power_limit_w) == (
        1,
        "00000000:0A:00.0",
        None,
        None,
        700,
    )
    assert set(b.unreadable) == {"fan_pct", "temperature_c", "power_w", "utilization_pct"}
    assert b.errors["temperature_c"] == "ERR!" and b.processes == []
    v = judge_reading(b, T)
    assert v.verdict == "CRITICAL" and {r.field for r in v.reasons} >= {
        "temperature_c",
        "utilization_pct",
    }


def test_table_older_layout():
    """Hand-written in the layout of older drivers: two lines per GPU and processes without GI/CI."""
    old = """\
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 450.80.02    Driver Version: 450.80.02    CUDA Version: 11.0     |
|-------------------------------+----------------------+----------------------+
| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |
|===============================+======================+======================|
|   0  Tesla V100-SXM2...  On   | 00000000:00:1E.0 Off |                    2 |
| N/A   84C    P0   299W / 300W |  16100MiB / 16160MiB |     97%      Default |
+-------------------------------+----------------------+----------------------+

+-----------------------------------------------------------------------------+
| Processes:                                                       GPU Memory |
|  GPU       PID   Type   Process name                             Usage      |
|=============================================================================|
|    0     12345      C   python train.py                          16087MiB |
+-----------------------------------------------------------------------------+
"""
    [g] = parse_table(old)
    assert (g.name, g.temperature_c, g.power_w, g.power_limit_w, g.memory_used_mib) == (
        "Tesla V100-SXM2...",
        84,
        299,
        300,
        16100,
    )
    assert (
        g.ecc_volatile_uncorrected == 2 and g.mig_mode is None and g.status("mig_mode") == "absent"
    )
    assert procs(g) == [(12345, "python train.py", 16087)]
    v = judge_reading(g, T)
    assert v.verdict == "CRITICAL"
    assert {r.field for r in v.reasons} == {
        "ecc_volatile_uncorrected",
        "temperature_c",
        "memory_used_mib",
        "power_w",
    }


# ------------------------------------------------------------------------------- detection
@pytest.mark.parametrize(
    ("name", "fmt", "count"),
    [
        ("h100_80gb_load_q.txt", "q", 1),
        ("h100_80gb_load_table.txt", "table", 1),
        ("h200_mig_idle_table.txt", "table", 1),
        ("win_rtx2080super_idle_table.txt", "table", 1),
        ("h100_80gb_load_query_gpu.csv", "csv", 1),
        ("exporter_testdata_query.csv", "csv", 2),
    ],
)
def test_parse_any_detects_every_capture(name, fmt, count):
    """Each real capture is recognised as what it is and yields its GPUs."""
    text = (FIXTURES / name).read_text()
    assert detect_format(text) == fmt
    found, gpus = parse_any(text)
    assert found == fmt and len(gpus) == count


def test_parse_any_csv_with_prompt_and_processes():
    """A pasted CSV may carry the shell prompt above it and the compute-apps CSV below it."""
    text = "$ nvidia-smi --query-gpu=... --format=csv\n" + H100_CSV + "\n" + H100_APPS
    fmt, [g] = parse_any(text)
    assert fmt == "csv" and g.memory_used_mib == 19818 and procs(g) == H100_PROCS


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (H100_APPS, "query-compute-apps"),
        ("0, NVIDIA H100 80GB HBM3, 59, 19818 MiB\n", "header line"),
        ("Traceback (most recent call last):\n  ...\n", "not recognised"),
        ("", "not recognised"),
    ],
)
def test_parse_any_refuses_what_it_cannot_judge(text, match):
    """Processes alone, a CSV without header, or anything else: an error that says what to paste."""
    with pytest.raises(ValueError, match=match):
        parse_any(text)


def test_parse_any_exporter_csv_lacks_essentials():
    """The narrow exporter CSV has no temperature or total memory: absent, so judged only on what it has."""
    _, (a, b) = parse_any(EXPORTER_CSV)
    assert (a.index, a.fan_pct, a.memory_used_mib, a.temperature_c) == (0, 38, 575, None)
    assert (b.index, b.name) == (1, "Some Other GPU")
    assert a.status("temperature_c") == "absent" and a.unreadable == []


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ("[N/A]", "unsupported"),
        ("N/A", "unsupported"),
        ("[Not Supported]", "unsupported"),
        ("Requested functionality has been deprecated", "unsupported"),
        ("ERR!", "unreadable"),
        ("[Unknown Error]", "unreadable"),
        ("Unknown Error", "unreadable"),
        ("GPU is lost", "unreadable"),
        ("[GPU is lost]", "unreadable"),
        ("59 C", "value"),
    ],
)
def test_cell_words(raw, kind):
    """The words nvidia-smi prints instead of a value, with and without brackets."""
    assert cell_kind(raw) == kind


# ------------------------------------------------------------------------------- across formats
def verdict_of(text: str) -> tuple[str, frozenset[str]]:
    _, [g] = parse_any(text)
    v = judge_reading(g, T)
    return v.verdict, frozenset(r.field for r in v.reasons)


def test_same_capture_same_values_and_verdicts_in_every_format():
    """The H100 under load read from CSV, -q and the table: the fields they share agree, and so do the verdicts."""
    readings = {
        fmt: parse_any(text)[1][0]
        for fmt, text in (("csv", H100_CSV), ("q", H100_Q), ("table", H100_TABLE))
    }
    shared = (
        "name",
        "pci_bus_id",
        "temperature_c",
        "memory_used_mib",
        "memory_total_mib",
        "utilization_pct",
        "power_limit_w",
        "ecc_volatile_uncorrected",
        "mig_mode",
    )
    for name in shared:
        assert len({getattr(g, name) for g in readings.values()}) == 1, name
    assert readings["q"].uuid == readings["csv"].uuid
    assert procs(readings["q"]) == procs(readings["table"]) == H100_PROCS
    # Power was sampled at slightly different moments: all near 630 W of 700 W.
    assert all(625 <= g.power_w <= 635 for g in readings.values() if g.power_w is not None)
    assert {judge_reading(g, T).verdict for g in readings.values()} == {"OK"}


def test_same_fault_same_verdict_in_every_format():
    """91 °C in any of the three formats is CRITICAL on temperature."""
    hot_csv = edit(H100_CSV, ", 59, 26, 54,", ", 91, 26, 54,")
    hot_q = edit(
        H100_Q, "GPU Current Temp                               : 59 C", "GPU Current Temp : 91 C"
    )
    hot_table = edit(H100_TABLE, " N/A   59C ", " N/A   91C ")
    results = {verdict_of(text) for text in (hot_csv, hot_q, hot_table)}
    assert results == {("CRITICAL", frozenset({"temperature_c"}))}
