"""A container job's provenance against a real, private dockerd: the image is recorded by what
`docker image inspect` says it is (here a local build: its image id), never by its tag, and a
reproduction runs that id."""

from __future__ import annotations

import pytest
import yaml

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.api import Client
from nightshift.runtime.training import provenance

from conftest import REPO

# One worker runs every test of the group: the service starts once (pytest-xdist, loadgroup).
pytestmark = [pytest.mark.service, pytest.mark.xdist_group("docker")]
pytest_plugins = ["docker_service"]


@pytest.mark.timeout(300)
def test_a_container_job_records_the_image_id_and_is_reproduced_by_it(
    home, tmp_path, monkeypatch, docker_engine, busybox_image
):
    """Tag in the spec, id in the record; the reproduction's spec names the id."""
    image_id = docker_engine.client.images.get(busybox_image).id
    got = provenance.image_info(busybox_image, provenance.Budget(), docker_engine.base_url)
    assert got["digest"] == image_id and got["pinned"] is None and "local image" in got["note"]

    monkeypatch.setenv("NIGHTSHIFT_EXECUTOR__KIND", "docker")
    monkeypatch.setenv("NIGHTSHIFT_EXECUTOR__DOCKER_URL", docker_engine.base_url)
    policy = yaml.safe_load((REPO / "policies" / "default.yaml").read_text())
    policy["limits"]["allowed_images"].append(busybox_image.split(":")[0] + ":*")
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    monkeypatch.setenv("NIGHTSHIFT_POLICY__FILE", str(tmp_path / "policy.yaml"))
    code = tmp_path / "code"
    code.mkdir()
    w = Wiring.load()
    client = Client(w)
    job = client.submit(
        spec={
            "name": "boxed",
            "code": {"path": str(code)},
            "environment": {"image": busybox_image},
            "command": ["sh", "-c", "echo hi"],
            "seed": 3,
            "retries": 0,
        }
    )
    assert w.engine.run_until_settled([job])[job] == "succeeded"
    rec = w.store.attempts(job)[0].provenance
    assert rec["image"]["ref"] == busybox_image and rec["image"]["digest"] == image_id
    assert rec["python"] == {
        "note": "the run's interpreter is the image's: the image digest pins it"
    }
    assert rec["seed"] == 3 and rec["git"]["repo"] is None

    again = client.call("reproduce_job", {"job_id": job})
    assert again.image == image_id
    assert any("not recorded in git" in x for x in again.warnings)
    assert w.store.job(again.job_id).spec["environment"]["image"] == image_id
    assert w.engine.run_until_settled([again.job_id])[again.job_id] == "succeeded"
    assert w.store.attempts(again.job_id)[0].provenance["image"]["digest"] == image_id
