"""Paths confined: every host path a run touches (code folder, checkpoint folder, metrics file,
mounts) lies under the policy's allowed roots after symlinks are resolved, for every executor,
and a refused submit creates nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from nightshift.agent.doors.api import Client
from nightshift.policies.engine import check_limits
from nightshift.policies.model import Limits
from nightshift.runtime.errors import BadArguments, PolicyDenied
from nightshift.skills.base import Claims, HostPath, Launch

GOOD = {"name": "p", "command": ["{python}", "-c", "pass"]}
# Outside every shipped root (~ is /root or /home/..., /tmp, the examples); never created here.
OUTSIDE = Path("/etc/nightshift-test-never-created")


def jobs(home: Path) -> int:
    db = home / "nightshift.db"
    return sqlite3.connect(db).execute("select count(*) from job").fetchone()[0]


@pytest.fixture
def client(home):
    c = Client()
    c.submit(spec=GOOD)
    return c


@pytest.mark.parametrize(
    "field,extra",
    [
        ("checkpoint.dir", {"checkpoint": {"dir": str(OUTSIDE / "ck")}}),
        ("code.path", {"code": {"path": "/etc"}}),
        ("metrics.file", {"metrics": {"file": str(OUTSIDE / "m.jsonl")}}),
    ],
)
def test_paths_outside_the_roots_are_denied(client, home, field, extra):
    """The local executor's paths are judged like container mounts, and nothing is created."""
    before = jobs(home)
    with pytest.raises(PolicyDenied, match=f"limits.allowed_mount_roots.*{field}"):
        client.submit(spec={**GOOD, **extra})
    assert jobs(home) == before
    assert not OUTSIDE.exists()


def test_symlink_out_of_a_root_is_followed(client, home, tmp_path):
    """A link under /tmp (allowed) that points into /etc is judged by where it points."""
    link = tmp_path / "innocent"
    link.symlink_to("/etc")
    with pytest.raises(PolicyDenied, match="innocent"):
        client.submit(spec={**GOOD, "checkpoint": {"dir": str(link / "ck")}})
    with pytest.raises(PolicyDenied):
        client.submit(spec={**GOOD, "code": {"path": str(link)}})


def test_relative_escape_is_a_bad_argument(client, home):
    """`..` out of the job's folder is refused by the spec itself, before the policy."""
    with pytest.raises(BadArguments, match="leaves the job's folder"):
        client.submit(spec={**GOOD, "checkpoint": {"dir": "../../../etc/ck"}})


def test_allowed_folder_is_accepted_and_not_created(client, home, tmp_path):
    """Under a root the submit succeeds; the run, not the submit, creates the folder."""
    ck = tmp_path / "later" / "ck"
    client.submit(spec={**GOOD, "checkpoint": {"dir": str(ck)}, "code": {"path": str(tmp_path)}})
    assert not ck.exists() and not ck.parent.exists()


def test_spec_file_folder_is_the_code_folder(client, home, tmp_path):
    """A spec file's folder is where its run starts, so it is judged too."""
    link = tmp_path / "etc-link"
    link.symlink_to("/etc")
    spec = tmp_path / "s.yaml"
    spec.write_text("name: p\ncommand: [x]\ncode: {path: etc-link}\n")
    with pytest.raises(PolicyDenied, match="code.path"):
        client.submit(str(spec))


def test_limits_on_paths_for_any_executor_and_none_means_no_limit(tmp_path):
    """check_limits judges Launch.paths whatever the image; roots None leaves them alone."""
    claims = Claims(launches=[Launch(where="spec", paths=[HostPath(field="cwd", path="/etc")])])
    limited = Limits(allowed_mount_roots=[str(tmp_path)])
    [(rule, reason)] = check_limits(limited, claims)
    assert rule == "limits.allowed_mount_roots" and "cwd '/etc'" in reason
    assert check_limits(Limits(allowed_mount_roots=None), claims) == []
    inside = Claims(launches=[Launch(paths=[HostPath(field="cwd", path=str(tmp_path / "a"))])])
    assert check_limits(limited, inside) == []
