"""The wheel installs everything under `nightshift.*` (nothing bare named `agent` or `skills` lands
in site-packages) and ships the default policy, prompts and example goal as package data."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow


def test_wheel_layout(tmp_path):
    """Build the real wheel and look inside it."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("nightshift-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "nightshift",
        wheel.name.split("-py3")[0] + ".dist-info",
    }
    for pkg in ("agent", "skills", "policies", "runtime", "prompts"):
        assert f"nightshift/{pkg}/__init__.py" in names
    assert "nightshift/policies/default.yaml" in names
    assert "nightshift/examples/goals/quickstart.yaml" in names
    assert "nightshift/runtime/scheduling/power_model.yaml" in names  # the power model's figures
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert (
        "nightshift = nightshift.agent.doors.entry:main"
        in zipfile.ZipFile(wheel).read(entry).decode()
    )
