"""A queued job whose spec names an image runs in a container through the same loop, with its
code read-only, its workspace writable at the same path, and a data mount from the spec."""

from __future__ import annotations

import os
import shutil

import pytest
import yaml

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.api import Client

from conftest import REPO, write_spec

# One worker runs every test of the group: the service starts once (pytest-xdist, loadgroup).
pytestmark = [pytest.mark.service, pytest.mark.xdist_group("docker")]
pytest_plugins = ["docker_service"]


@pytest.mark.timeout(1200)  # a cold image cache runs debootstrap first
def test_job_with_an_image_runs_in_a_container(
    home, tmp_path, monkeypatch, docker_engine, python_image, digits_csv
):
    """Submit → the loop starts a container → metrics and checkpoints land in the job's folder."""
    pylib = tmp_path / "pylib"
    (pylib / "sklearn" / "datasets" / "data").mkdir(parents=True)
    shutil.copy(digits_csv, pylib / "sklearn" / "datasets" / "data" / "digits.csv.gz")
    spec_path = write_spec(tmp_path, steps=60)
    spec = yaml.safe_load(spec_path.read_text())
    spec["environment"] = {
        "image": python_image,
        "env": {"PYTHONPATH": "/pylib"},
        "mounts": [{"source": str(pylib), "target": "/pylib"}],
    }
    spec_path.write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("NIGHTSHIFT_EXECUTOR__KIND", "docker")
    monkeypatch.setenv("NIGHTSHIFT_EXECUTOR__DOCKER_URL", docker_engine.base_url)
    # The test image is a local build: allow it for this test's policy (the shipped one lists
    # public images only), and run as this user so the written files stay ours.
    policy = yaml.safe_load((REPO / "policies" / "default.yaml").read_text())
    policy["limits"]["allowed_images"].append(python_image.split(":")[0] + ":*")
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    monkeypatch.setenv("NIGHTSHIFT_POLICY__FILE", str(tmp_path / "policy.yaml"))
    w = Wiring.load()
    job = Client(w).submit(str(spec_path))
    states = w.engine.run_until_settled([job])
    log = w.executor.logs(w.store.attempts(job)[0].handle, tail=50)
    assert states[job] == "succeeded", log
    att = w.store.attempts(job)[0]
    assert att.executor == "docker" and att.last_step == 60
    ckpts = sorted(p.name for p in (home / "runs" / f"job-{job}" / "checkpoints").iterdir())
    assert ckpts == ["step_00000025.npz", "step_00000050.npz", "step_00000060.npz"]
    assert os.path.getsize(home / "runs" / f"job-{job}" / "metrics.jsonl") > 0
