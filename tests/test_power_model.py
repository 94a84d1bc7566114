"""The power model per GPU type (runtime/scheduling/power_model.py): it reproduces the published
measurements it is built from (Zeus NSDI '23's power trace, copied in tests/fixtures/power; the
H100's nvidia-smi captures), is monotone and bounded, and prices a job under a cap."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
import yaml

from nightshift.runtime.scheduling.power_model import (
    DATA_PATH,
    PowerModelError,
    power_model,
    power_models,
)

FIXTURES = Path(__file__).parent / "fixtures"


def published(file: str, workload: dict) -> dict[int, tuple[float, float]]:
    """{limit W: (seconds per epoch, average W)} of one workload in a carried Zeus trace file."""
    with (FIXTURES / "power" / f"zeus_{file}").open() as f:
        rows = [
            r
            for r in csv.DictReader(f)
            if (r["dataset"], r["network"], int(r["batch_size"]), r["optimizer"])
            == (
                workload["dataset"],
                workload["network"],
                workload["batch_size"],
                workload["optimizer"],
            )
        ]
    return {
        int(r["power_limit"]): (float(r["time_per_epoch"]), float(r["average_power"])) for r in rows
    }


def smi_power(file: str) -> dict[str, float]:
    """The `GPU Power Readings` of an `nvidia-smi -q` capture: {field: watts}."""
    text = (FIXTURES / "nvidia_smi" / file).read_text()
    block = text.split("GPU Power Readings", 1)[1].split("GPU Memory Power Readings", 1)[0]
    return {
        k.strip(): float(v)
        for k, v in re.findall(r"^\s+([A-Za-z ]+?)\s+: ([\d.]+) W$", block, re.M)
    }


def test_measured_curves_reproduce_the_published_points():
    """At every measured limit the model gives the trace's average board power and the speed the
    trace's epoch times imply (fastest / this), not an interpolation."""
    data = yaml.safe_load(DATA_PATH.read_text())
    models = power_models().gpus
    checked = 0
    for gpu, raw in data["gpus"].items():
        if "curve" not in raw:
            continue
        curve = data["curves"][raw["curve"]]
        points = published(curve["file"], curve["workload"])
        assert sorted(points) == [p[0] for p in curve["points"]], gpu
        fastest = points[max(points)][0]
        for limit, (seconds, watts) in points.items():
            r = models[gpu].at(limit)
            assert r.watts == pytest.approx(watts, abs=0.006), (gpu, limit)
            assert r.throughput == pytest.approx(fastest / seconds, rel=1e-5), (gpu, limit)
            assert r.measured and not r.interpolated
            checked += 1
    assert checked == 7 + 9  # the V100's seven limits and the A40's nine


def test_h100_figures_are_the_captures():
    """H100 limits and idle draw are those nvidia-smi reported on a real H100 (idle and loaded)."""
    idle, load = smi_power("h100_80gb_idle_q.txt"), smi_power("h100_80gb_load_q.txt")
    m = power_model("NVIDIA H100 80GB HBM3")
    assert (m.max_w, m.default_w) == (load["Max Power Limit"], load["Default Power Limit"])
    assert idle["Min Power Limit"] == 200.0 and m.min_w >= idle["Min Power Limit"]
    assert m.at(700, busy=False).watts == idle["Average Power Draw"] == 69.85
    assert not m.measured and m.curve == "a40-resnet50-imagenet"  # said, not hidden


@pytest.mark.parametrize("gpu", ["V100", "A40", "A100", "H100"])
def test_monotone_and_bounded(gpu):
    """More power never means slower or less drawn; the largest limit is full speed; a job takes
    longer and draws less power at a lower cap."""
    m = power_model(gpu)
    steps = 200
    limits = [m.min_w + (m.max_w - m.min_w) * i / steps for i in range(steps + 1)]
    readings = [m.at(lim) for lim in limits]
    for a, b in zip(readings, readings[1:], strict=False):
        assert a.throughput <= b.throughput + 1e-12 and a.watts <= b.watts + 1e-12
    assert readings[-1].throughput == 1.0
    assert all(0 < r.throughput <= 1 and r.watts > 0 for r in readings)
    job_full, job_low = m.job_under_cap(3600, m.max_w), m.job_under_cap(3600, m.min_w)
    assert job_full.duration_s == 3600 and job_full.energy_j == job_full.full_power_energy_j
    assert job_low.duration_s > 3600 and job_low.mean_watts < job_full.mean_watts


def test_a_cap_prices_a_job_from_the_published_figures():
    """A V100 job of one hour at 250 W, capped at 150 W: time and energy from the trace's rows."""
    points = published(
        "summary_power_v100.csv",
        {"dataset": "imagenet", "network": "resnet50", "batch_size": 256, "optimizer": "adadelta"},
    )
    (t150, w150), (t250, w250) = points[150], points[250]
    job = power_model("Tesla V100-PCIE-32GB").job_under_cap(3600, 150)
    assert job.duration_s == pytest.approx(3600 * t150 / t250, rel=1e-5)
    assert job.energy_j == pytest.approx(w150 * 3600 * t150 / t250, rel=1e-4)
    assert job.energy_j / job.full_power_energy_j == pytest.approx(
        (w150 * t150) / (w250 * t250), rel=1e-4
    )
    assert 0.77 < job.energy_j / job.full_power_energy_j < 0.78  # 22 % less energy, 18 % longer


def test_between_two_limits_is_linear_and_says_so():
    m = power_model("V100")
    lo, hi, mid = m.at(150), m.at(175), m.at(162.5)
    assert mid.interpolated and not lo.interpolated
    assert mid.watts == pytest.approx((lo.watts + hi.watts) / 2)
    assert mid.throughput == pytest.approx((lo.throughput + hi.throughput) / 2)


def test_outside_the_range_and_unknown_types_are_clear_errors():
    """A limit outside the model names the range; an unknown GPU names the known types; idle draw
    without a published figure asks for one instead of inventing it."""
    with pytest.raises(PowerModelError, match=r"limit_w: 90 W is outside .* 100-250 W"):
        power_model("V100").at(90)
    with pytest.raises(PowerModelError, match=r"limit_w: 800 W .* 233\.333-700 W"):
        power_model("H100").at(800)
    with pytest.raises(
        PowerModelError, match=r"gpu: no power model for 'NVIDIA GeForce RTX 2080.*H100"
    ):
        power_model("NVIDIA GeForce RTX 2080 SUPER")
    with pytest.raises(PowerModelError, match="idle_w: no published idle power for A100"):
        power_model("NVIDIA A100-SXM4-80GB").at(400, busy=False)
    assert power_model("A100").at(400, busy=False, idle_w=55.0).watts == 55.0
    with pytest.raises(PowerModelError, match="full_power_duration_s"):
        power_model("A100").job_under_cap(-1, 400)


def test_product_names_pick_their_type():
    assert power_model("Tesla V100-PCIE-32GB").gpu_type == "V100"
    assert power_model("NVIDIA A100-SXM4-80GB").gpu_type == "A100"
    assert power_model("NVIDIA H100 80GB HBM3").gpu_type == "H100"
    assert power_model("NVIDIA A40").gpu_type == "A40"
    with pytest.raises(PowerModelError):
        power_model("Tesla V100-SXM2-32GB")  # a 300 W card: the 250 W curve is not its own
