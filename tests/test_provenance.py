"""Provenance per attempt, `reproduce` and `compare` (issue 30): what an attempt records as it
starts, read from a real git tree and a real interpreter; a run from a dirty tree reproduced from
a clean worktree of its commit with the kept diff applied, reaching the same final loss."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nightshift.runtime.training import provenance

from conftest import nightshift, reproduce_goal

# A small deterministic program: its loss depends on its seed and on SCALE, which the test edits
# without committing (the change that matters).
PROGRAM = """\
import argparse, json, os, random

SCALE = 1.0

p = argparse.ArgumentParser()
p.add_argument("--seed", type=int, required=True)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--metrics-file", required=True)
a = p.parse_args()
rng = random.Random(a.seed)
data = open(os.path.join(os.path.dirname(__file__), "data.txt")).read().split()
target = float(len(data)) * SCALE
w = 0.0
with open(a.metrics_file, "a") as out:
    for step in range(1, a.steps + 1):
        x = 0.5 + rng.random()
        grad = 2 * x * (w * x - target * x)
        w -= 0.05 * grad
        loss = (w * x - target * x) ** 2
        out.write(json.dumps({"step": step, "loss": loss}) + "\\n")
print("final", loss)
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "code"
    r.mkdir()
    (r / "train.py").write_text(PROGRAM)
    (r / "data.txt").write_text("a b c\n")
    git(r, "init", "-q", "-b", "main")
    git(r, "-c", "user.name=t", "-c", "user.email=t@example.com", "add", ".")
    git(r, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "tiny")
    return r


def final_loss(metrics: Path) -> float:
    return [json.loads(line) for line in metrics.read_text().splitlines()][-1]["loss"]


def test_capture_reads_a_dirty_tree_and_keeps_its_diff_once(repo, tmp_path):
    """The commit, branch, dirty state, the diff as a blob named by its sha256 (kept once), the
    untracked files, the interpreter's package list, the seed and a data fingerprint; no GPU is
    invented where the run uses none."""
    (repo / "train.py").write_text(PROGRAM.replace("SCALE = 1.0", "SCALE = 2.0"))
    (repo / "notes.txt").write_text("scratch\n")
    home = tmp_path / "home"
    inp = provenance.Inputs(
        code_dir=repo,
        argv=[sys.executable, "train.py"],
        params={"seed": 7},
        spec_seed=3,
        env={"MODE": "a"},
        data=[{"path": "data.txt", "hash": True}, {"path": "missing.bin"}],
        interpreter=sys.executable,
    )
    rec = provenance.capture(inp, home)
    g = rec["git"]
    assert g["commit"] == git(repo, "rev-parse", "HEAD").strip()
    assert g["branch"] == "main" and g["dirty"] is True
    assert g["untracked"] == ["notes.txt"] and g["untracked_count"] == 1
    blobs = provenance.blobs_of(home)
    diff = blobs.get(g["diff_sha256"])
    assert diff is not None and b"+SCALE = 2.0" in diff
    assert rec["seed"] == 7 and rec["seed_from"] == "params.seed"
    assert rec["env"] == {"MODE": "a"}
    py = rec["python"]
    listed = provenance.packages_text(blobs, py["packages_sha256"])
    assert listed is not None and "pydantic==" in listed.lower()
    data = {d["path"]: d for d in rec["data"]}
    assert data["data.txt"]["bytes"] == 6 and len(data["data.txt"]["sha256"]) == 64
    assert data["missing.bin"]["note"] == "not found"
    assert rec["gpu"] == {"devices": [], "note": "the run uses no GPU"}
    assert rec["image"] is None
    # the same diff and list again: stored once, the package list read from the cache
    again = provenance.capture(inp, home)
    assert again["git"]["diff_sha256"] == g["diff_sha256"]
    assert again["python"].get("cached") is True
    assert len(list((home / "provenance").glob("*/*"))) == 2  # one diff, one package list
    assert provenance.changes(rec, again) == [
        f"dirty tree (diff {g['diff_sha256'][:12]}), 1 untracked"
    ]


def test_capture_is_bounded_and_never_raises(repo, tmp_path):
    """A budget of zero runs no command: each part says so, and the launch goes on."""
    inp = provenance.Inputs(
        code_dir=repo,
        argv=["x"],
        params={},
        spec_seed=None,
        env={},
        data=[],
        interpreter=sys.executable,
        image="pytorch/pytorch:2.3.0",
        gpus=[0],
    )
    rec = provenance.capture(inp, tmp_path / "home", budget_s=0)
    assert rec["git"]["repo"] is None and "spent" in rec["git"]["note"]
    assert rec["image"]["digest"] is None and "spent" in rec["image"]["note"]
    assert rec["gpu"]["devices"] == [{"index": 0, "note": "no health probe reading recorded"}]
    assert rec["seed"] is None and rec["capture_s"] < 1


def test_image_digest_is_resolved_never_a_tag(tmp_path, monkeypatch):
    """`docker image inspect` gives the repo digest (or the local id): the record pins that."""
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho '[\"pytorch/pytorch@sha256:" + "a" * 64 + '"] sha256:' + "b" * 64 + "'\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    got = provenance.image_info("pytorch/pytorch:2.3.0", provenance.Budget())
    assert got["pinned"] == "pytorch/pytorch@sha256:" + "a" * 64
    assert got["digest"] == "sha256:" + "a" * 64
    pinned = provenance.image_info("python@sha256:" + "c" * 64, provenance.Budget())
    assert pinned["digest"] == "sha256:" + "c" * 64


def test_changes_flag_another_commit_driver_and_packages():
    """`show` flags what changed between two attempts of one job."""
    a = {
        "git": {"commit": "1" * 40, "dirty": False},
        "python": {"packages_sha256": "a" * 64},
        "gpu": {"devices": [{"index": 0, "name": "H100", "driver_version": "550.54"}]},
        "host": "n1",
    }
    b = {
        "git": {"commit": "2" * 40, "dirty": False},
        "python": {"packages_sha256": "b" * 64},
        "gpu": {"devices": [{"index": 0, "name": "H100", "driver_version": "560.28"}]},
        "host": "n1",
    }
    flags = provenance.changes(a, b)
    assert any(f.startswith("commit: 1111111111 → 2222222222") for f in flags)
    assert any(f.startswith("packages:") for f in flags)
    assert any(f.startswith("driver:") and "560.28" in f for f in flags)
    assert not any(f.startswith("host") for f in flags)


def _spec(tmp_path: Path, repo: Path) -> Path:
    spec = {
        "name": "tiny",
        "code": {"path": str(repo)},
        "environment": {"env": {"TINY_MODE": "a"}},
        "command": [
            "{python}",
            "train.py",
            "--seed",
            "{seed}",
            "--steps",
            "{steps}",
            "--metrics-file",
            "{metrics_file}",
        ],
        "parameters": {"seed": 7, "steps": 40},
        "metrics": {"file": "metrics.jsonl", "name": "loss", "mode": "min"},
        "seed": 7,
        "data": [{"path": "data.txt", "hash": True}],
        "retries": 0,
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
def test_dirty_run_reproduced_from_a_clean_worktree_reaches_the_same_loss(home, repo, tmp_path):
    """Done means (issue 30): a job trained from a dirty tree, reproduced from a worktree of the
    same commit with the kept diff applied, reaches the same final loss; the clean commit alone
    would not; `show` prints the provenance, `compare` shows the two, `--strict` refuses once the
    data changed."""
    (repo / "train.py").write_text(PROGRAM.replace("SCALE = 1.0", "SCALE = 2.0"))
    goal = tmp_path / "train.yaml"
    goal.write_text(
        yaml.safe_dump({"name": "tiny", "goal": "train", "spec": str(_spec(tmp_path, repo))})
    )
    res = nightshift("run", str(goal))
    assert res.returncode == 0, res.stdout + res.stderr
    # the tree is made clean again: only the kept diff can bring the change back
    git(repo, "checkout", "--", "train.py")

    show = nightshift("show", "1")
    assert show.returncode == 0, show.stderr
    commit = git(repo, "rev-parse", "HEAD").strip()
    assert f"@ {commit[:12]} (branch main), DIRTY: diff" in show.stdout
    assert "seed    7 (params.seed)" in show.stdout
    assert "gpus    none (the run uses no GPU)" in show.stdout

    res = nightshift("run", str(reproduce_goal(tmp_path, 1)))
    assert res.returncode == 0, res.stdout + res.stderr

    db = sqlite3.connect(home / "nightshift.db")
    states = dict(db.execute("select id, state from job"))
    assert states == {1: "succeeded", 2: "succeeded"}
    (spec2,) = db.execute("select spec from job where id = 2").fetchone()
    code2 = Path(json.loads(spec2)["code"]["path"])
    assert code2 != repo and code2.is_relative_to(home / "runs" / "reproduce")
    assert git(code2, "rev-parse", "HEAD").strip() == commit  # a detached worktree of the commit
    assert "SCALE = 2.0" in (code2 / "train.py").read_text()  # with the diff applied
    runs = home / "runs"
    first, second = (
        final_loss(runs / "job-1" / "metrics.jsonl"),
        final_loss(runs / "job-2" / "metrics.jsonl"),
    )
    assert second == first
    shown = nightshift("show", "2")
    assert "reproduces job 1 (nightshift compare 1 2)" in shown.stdout, shown.stdout
    clean = tmp_path / "clean.jsonl"
    subprocess.run(
        [
            sys.executable,
            str(repo / "train.py"),
            "--seed",
            "7",
            "--steps",
            "40",
            "--metrics-file",
            str(clean),
        ],
        check=True,
        capture_output=True,
    )
    assert final_loss(clean) != first  # the uncommitted change mattered
    rec2 = json.loads(db.execute("select provenance from attempt where job_id = 2").fetchone()[0])
    rec1 = json.loads(db.execute("select provenance from attempt where job_id = 1").fetchone()[0])
    assert (
        rec2["git"]["commit"] == commit and rec2["git"]["diff_sha256"] == rec1["git"]["diff_sha256"]
    )

    plot = tmp_path / "cmp.png"
    cmp = nightshift("compare", "1", "2", "--json", "--plot", str(plot))
    assert cmp.returncode == 0, cmp.stderr
    out = json.loads(cmp.stdout)
    assert [j["final"] for j in out["jobs"]] == [first, first]
    assert out["plot"] == str(plot) and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fields = {d["field"] for d in out["jobs"][1]["differences"]}
    assert "commit" not in fields and "diff" not in fields and "packages" not in fields
    text = nightshift("compare", "1", "2", "--plot", str(tmp_path / "c2.png"))
    assert text.returncode == 0 and f"curves overlaid: {tmp_path / 'c2.png'}" in text.stdout

    # the data changed since: a strict reproduction refuses (exit 2), a plain one warns
    (repo / "data.txt").write_text("a b c d\n")
    strict = nightshift("reproduce", "1", "--strict")
    assert strict.returncode == 2, strict.stdout + strict.stderr
    assert "data data.txt: its fingerprint differs" in strict.stdout + strict.stderr
    loose = nightshift("reproduce", "1", "--json")
    assert loose.returncode == 0, loose.stderr
    got = json.loads(loose.stdout)
    assert got["job_id"] == 3 and any("data.txt" in w for w in got["warnings"])


def test_reproduction_pins_the_image_digest_and_keeps_seed_and_params():
    """The new job's spec: the recorded digest instead of the tag, the image's own interpreter,
    the attempt's parameters and the spec's seed; no dependencies or start time again."""
    from types import SimpleNamespace

    from nightshift.skills.reproduce_job import _spec

    job = SimpleNamespace(
        spec={
            "name": "img",
            "environment": {"image": "pytorch/pytorch:2.3.0", "env": {"A": "1"}},
            "command": ["python3", "train.py", "--lr", "{lr}"],
            "parameters": {"lr": 0.1},
            "depends_on": ["prep"],
            "begin": "23:00",
            "seed": 5,
        },
        params={"lr": 0.1},
    )
    digest = "sha256:" + "d" * 64
    rec = {
        "image": {
            "ref": "pytorch/pytorch:2.3.0",
            "digest": digest,
            "pinned": f"pytorch/pytorch@{digest}",
        },
        "python": {"note": "the run's interpreter is the image's"},
        "params": {"lr": 0.05},
        "seed": 5,
        "seed_from": "spec",
        "env": {"A": "1"},
    }
    warnings: list[str] = []
    spec, image, python = _spec(job, rec, "/wt/code", warnings)  # type: ignore[arg-type]
    assert image == f"pytorch/pytorch@{digest}" and python is None and not warnings
    assert spec["environment"]["image"] == image and "python" not in spec["environment"]
    assert spec["code"]["path"] == "/wt/code" and spec["parameters"] == {"lr": 0.05}
    assert spec["seed"] == 5 and "depends_on" not in spec and "begin" not in spec
    # an image whose digest could not be resolved runs by tag, with a warning
    rec["image"] = {"ref": "pytorch/pytorch:2.3.0", "digest": None, "note": "docker: not found"}
    spec, image, _ = _spec(job, rec, "/wt/code", warnings)  # type: ignore[arg-type]
    assert image == "pytorch/pytorch:2.3.0" and "no recorded digest" in warnings[0]


def test_show_prints_the_first_record_and_flags_what_changed(capsys):
    """`show`: the first attempt's provenance in full, then what changed in the next one."""
    from types import SimpleNamespace

    from nightshift.agent.doors.job_views import print_provenance

    first = {
        "host": "n1",
        "capture_s": 0.05,
        "git": {"repo": "/r", "commit": "1" * 40, "branch": "main", "dirty": False},
        "python": {
            "interpreter": "/v/bin/python",
            "version": "3.11.7",
            "manager": "pip",
            "packages_sha256": "a" * 64,
            "packages_count": 3,
        },
        "seed": 0,
        "seed_from": "spec",
        "argv": ["python", "t.py"],
        "gpu": {
            "devices": [{"index": 0, "name": "NVIDIA H100", "driver_version": None}],
            "note": provenance.GPU_NOTE,
        },
    }
    second = {**first, "git": {**first["git"], "commit": "2" * 40, "dirty": True}}
    attempts = [
        SimpleNamespace(number=1, provenance=first, provenance_changes=[]),
        SimpleNamespace(
            number=2, provenance=second, provenance_changes=provenance.changes(first, second)
        ),
    ]
    print_provenance(attempts)
    out = capsys.readouterr().out
    assert "/r @ 111111111111 (branch main), clean" in out
    assert "gpu 0   NVIDIA H100, driver not read, CUDA not read" in out
    assert "attempt 2 changed: dirty tree; commit: 1111111111 → 2222222222" in out
