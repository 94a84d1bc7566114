"""`nightshift reproduce` in a shared install is done as the caller (issue 30). Real OS users and a
root daemon (the fixture of test_jobs_as_submitters.py): alice's job from a dirty tree of her own
repository, reproduced by alice on the daemon's socket, becomes a job of hers whose worktree is
hers, at the recorded commit with the kept diff applied, and it reaches the same final loss.
Before, the daemon ran `git worktree add` as root in her repository, which git refused ("dubious
ownership"), and made the worktree root's. bob may not reproduce her job (policy others-job-logs);
an admin the policy lets through reads her repository as their own account, and is refused by
name where that account cannot.

Needs root and useradd (skips otherwise, fails under CI=true), as test_multi_user.py."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from test_jobs_as_submitters import Shared, _log
from test_jobs_as_submitters import shared as shared  # the module's fixture, used here too
from test_provenance import PROGRAM, final_loss
from test_provenance_as_submitter import _as, _record, _repo

from nightshift.runtime.config import Settings
from nightshift.runtime.errors import SkillFailed
from nightshift.runtime.store.db import Attempt, Job, Store
from nightshift.runtime.training import provenance
from nightshift.skills.base import SkillContext
from nightshift.skills.reproduce_job import reproduce_job

from conftest import run_skill


def _git_as(s: Shared, who, folder: Path, *args: str) -> str:
    got = subprocess.run(
        ["git", "-C", str(folder), *args],
        user=who.uid,
        group=who.gid,
        extra_groups=[],
        env=who.env(),
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    return got.stdout


def _alices_dirty_job(s: Shared) -> tuple[int, Path, str]:
    """alice's repository with the tiny training program committed, a job of hers run from it
    with an uncommitted change that matters, and the tree made clean again."""
    repo = s.alice.home / "tiny"
    _repo(s.alice, repo)
    (repo / "train.py").write_text(PROGRAM)  # hers already: the file keeps its owner
    _as(s.alice, "git", "commit", "-qam", "the program", cwd=repo)
    commit = _git_as(s, s.alice, repo, "rev-parse", "HEAD").strip()
    (repo / "train.py").write_text(PROGRAM.replace("SCALE = 1.0", "SCALE = 2.0"))
    spec = {
        "name": "alice-tiny",
        "code": {"path": str(repo)},
        "command": [s.python, "train.py", "--seed", "{seed}", "--steps", "{steps}",
                    "--metrics-file", "{metrics_file}"],
        "parameters": {"seed": 7, "steps": 40},
        "metrics": {"file": "metrics.jsonl", "name": "loss", "mode": "min"},
        "seed": 7,
        "data": [{"path": "data.txt", "hash": True}],
        "resources": {"gpus": 0, "expected_duration_min": 1},
        "retries": 0,
    }  # fmt: skip
    path = s.root / "shared" / "alice-tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    path.chmod(0o644)
    r = s.run(s.alice, "submit", str(path), "--json")
    assert r.returncode == 0, (r.stdout, r.stderr, s.log.read_text())
    job = int(json.loads(r.stdout)["job_ids"][0])
    assert s.wait_state(job, ("succeeded", "failed")) == "succeeded", _log(s, job)
    _as(s.alice, "git", "checkout", "--", "train.py", cwd=repo)  # only the kept diff has it now
    end = time.monotonic() + 60  # the package list is read after the launch
    while _record(s, job)["python"].get("pending"):
        assert time.monotonic() < end, _record(s, job)["python"]
        time.sleep(0.2)
    return job, repo, commit


@pytest.fixture(scope="module")
def alices(shared: Shared) -> tuple[int, Path, str]:
    return _alices_dirty_job(shared)


def test_alice_reproduces_her_dirty_run_as_herself(shared: Shared, alices) -> None:
    s = shared
    job, repo, commit = alices
    assert _record(s, job)["git"]["commit"] == commit  # recorded as she reads it
    r = s.run(s.alice, "reproduce", str(job), "--json", "--yes")
    assert r.returncode == 0, (r.stdout, r.stderr, s.log.read_text())
    got = json.loads(r.stdout)
    new, wt = got["job_id"], Path(got["worktree"])
    assert s.job(new)["owner"] == s.alice.name and s.job(new)["reproduces"] == job
    assert got["commit"] == commit and got["diff_applied"], got
    assert got["warnings"] == [], (
        got["warnings"],
        _record(s, job)["python"],
    )  # her packages and data, read as her, unchanged
    # the worktree is hers, in the runs folder, at the commit, with the diff applied
    assert wt.is_relative_to(s.runs / "reproduce"), wt
    st = wt.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (s.alice.uid, s.alice.gid, 0o700)
    assert (wt / "train.py").stat().st_uid == s.alice.uid
    assert "SCALE = 2.0" in (wt / "train.py").read_text()
    assert _git_as(s, s.alice, wt, "rev-parse", "HEAD").strip() == commit
    assert str(wt) in _git_as(s, s.alice, repo, "worktree", "list")  # her repository knows it
    assert s.wait_state(new, ("succeeded", "failed")) == "succeeded", _log(s, new)
    first = final_loss(s.runs / f"job-{job}" / "metrics.jsonl")
    assert final_loss(s.runs / f"job-{new}" / "metrics.jsonl") == first
    rec = _record(s, new)  # the new job's own record: her worktree, read as her
    assert rec["read_as"] == s.alice.name and rec["git"]["commit"] == commit
    assert rec["git"]["diff_sha256"] == got["diff_applied"]


def test_bob_may_not_reproduce_alices_job(shared: Shared, alices) -> None:
    s = shared
    job, _, _ = alices
    before = sorted((s.runs / "reproduce").iterdir()) if (s.runs / "reproduce").exists() else []
    r = s.run(s.bob, "reproduce", str(job), "--json", "--yes")
    assert r.returncode != 0
    assert "others-job-logs" in r.stderr, r.stderr
    after = sorted((s.runs / "reproduce").iterdir()) if (s.runs / "reproduce").exists() else []
    assert after == before


def _ctx(tmp_path: Path, principal: str) -> SkillContext:
    """A shared install's settings (jobs run as their submitters) for the skill itself: the gate
    lets an admin past others-job-logs, and what the skill then does is what this calls."""
    return SkillContext(
        store=Store(f"sqlite:///{tmp_path}/s.db"),
        settings=Settings(
            home=str(tmp_path / "home"),
            executor={"run_as": "submitter", "runs_dir": str(tmp_path / "runs")},
        ),
        now=datetime(2026, 12, 5, 3, 0),
        principal=principal,
        call_id="c1",
    )


def _stored(ctx: SkillContext, rec: dict) -> int:
    spec = {"name": "x", "code": {"path": rec["code_dir"]}, "command": ["true"]}
    with ctx.store.write_session() as s:
        job = Job(name="x", spec=spec, params={}, owner="someone-else", created_at=ctx.now,
                  updated_at=ctx.now)  # fmt: skip
        s.add(job)
        s.flush()
        s.add(Attempt(job_id=job.id or 0, number=1, provenance=rec))
        job_id = job.id or 0
    return job_id


def test_an_admin_reads_the_repository_as_themselves_or_is_refused_by_name(
    shared: Shared, alices
) -> None:
    """bob standing for an admin: alice's repository, in her 0700 home, is not readable by him;
    one of hers he can read is refused by git as his (another account's repository config would
    run as him). Root's read is never used; no folder is made for him."""
    s = shared
    job, repo, commit = alices
    tmp_path = s.root / "skill"  # where alice may reach (pytest's own tmp is root's, 0700)
    tmp_path.mkdir(mode=0o755)
    ctx = _ctx(tmp_path, s.bob.name)
    rec = _record(s, job)
    with pytest.raises(SkillFailed, match=f"{repo} is not readable by {s.bob.name}"):
        run_skill(reproduce_job, ctx, {"job_id": _stored(ctx, rec)})
    open_repo = s.root / "shared" / "alice-open"
    open_commit = _repo(s.alice, open_repo)
    open_repo.chmod(0o755)
    opened = {"git": {"repo": str(open_repo), "commit": open_commit}, "code_dir": str(open_repo)}
    with pytest.raises(SkillFailed, match=f"git refuses the recorded repository {open_repo} as"):
        run_skill(reproduce_job, ctx, {"job_id": _stored(ctx, opened)})
    assert not (tmp_path / "runs" / "reproduce").exists() or not os.listdir(
        tmp_path / "runs" / "reproduce"
    )
    # alice herself, through the same skill: her repository, her folder
    (tmp_path / "a").mkdir(mode=0o755)
    mine = _ctx(tmp_path / "a", s.alice.name)
    done = run_skill(reproduce_job, mine, {"job_id": _stored(mine, opened)})
    assert done.commit == open_commit and Path(done.worktree or "").stat().st_uid == s.alice.uid


def test_what_reproduce_reads_and_makes_for_alice_is_hers(shared: Shared) -> None:
    """The drift check reads today's data as alice: a file only bob may read, whose fingerprint
    root would find unchanged, is a warning for her. A worktree she names is made by git as her
    (hers), and one in bob's home is refused with her own "permission denied"."""
    s = shared
    base = s.root / "mine"
    base.mkdir(mode=0o755)
    repo = s.root / "shared" / "alice-open2"
    commit = _repo(s.alice, repo)
    repo.chmod(0o755)
    secret = s.root / "shared" / "bob-only.txt"
    secret.write_text("bob's\n")
    os.chown(secret, s.bob.uid, s.bob.gid)
    secret.chmod(0o600)
    data = provenance.data_info([{"path": str(secret), "hash": True}], repo, provenance.Budget())
    assert data[0]["sha256"]  # as root reads it, then and now
    rec = {"git": {"repo": str(repo), "commit": commit}, "code_dir": str(repo), "data": data}
    ctx = _ctx(base, s.alice.name)
    named = s.alice.home / "named-wt"
    done = run_skill(reproduce_job, ctx, {"job_id": _stored(ctx, rec), "worktree": str(named)})
    assert f"data {secret}: its fingerprint differs from the recorded one" in done.warnings
    assert done.worktree == str(named) and named.stat().st_uid == s.alice.uid
    assert (named / "train.py").stat().st_uid == s.alice.uid
    # the same worktree again (a call repeated after a crash): kept as it is, read as her
    again = run_skill(
        reproduce_job, _ctx_call(ctx, "c3"), {"job_id": done.source_job_id, "worktree": str(named)}
    )
    assert again.worktree == str(named) and again.job_id != done.job_id
    theirs = s.bob.home / "wt"
    with pytest.raises(SkillFailed, match=f"could not check out {commit[:12]} into {theirs}: .*"
                       "Permission denied"):  # fmt: skip
        run_skill(
            reproduce_job,
            _ctx_call(ctx, "c2"),
            {"job_id": _stored(ctx, {**rec, "data": []}), "worktree": str(theirs)},
        )
    assert not theirs.exists()


def _ctx_call(ctx: SkillContext, call_id: str) -> SkillContext:
    from dataclasses import replace

    return replace(ctx, call_id=call_id)
