"""An attempt's provenance is read as the person who submitted the job (issue 30). A shared install
with real OS users (the fixture of test_jobs_as_submitters.py: a root daemon, alice and bob on its
socket): alice's job from her own git repository, owned by her, records its commit and dirty
diff — git run as the daemon refused it as "dubious ownership" and the record lost its commit —
and a job of alice's that names bob's folders as its code or data records that she cannot read
them, and nothing of what is in them: before, root read bob's repository and fingerprinted his
files into alice's record.

Needs root and useradd (skips otherwise, fails under CI=true), as test_multi_user.py."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

from test_jobs_as_submitters import Shared, _log
from test_jobs_as_submitters import shared as shared  # the module's fixture, used here too
from test_multi_user import Account


def _as(who: Account, *argv: str, cwd: Path) -> None:
    subprocess.run(
        list(argv),
        cwd=cwd,
        user=who.uid,
        group=who.gid,
        extra_groups=[],
        env={**who.env(), "GIT_AUTHOR_NAME": who.name, "GIT_AUTHOR_EMAIL": "a@example.com",
             "GIT_COMMITTER_NAME": who.name, "GIT_COMMITTER_EMAIL": "a@example.com"},
        check=True,
        capture_output=True,
    )  # fmt: skip


def _repo(who: Account, folder: Path) -> str:
    """A git repository of `who`'s (made by them, so every file is theirs), one commit; returns
    the commit."""
    folder.mkdir(mode=0o700)
    os.chown(folder, who.uid, who.gid)
    _as(who, "git", "init", "-q", "-b", "main", cwd=folder)
    (folder / "train.py").write_text("print('step 1 loss 0.5')\n")
    (folder / "data.txt").write_text("a b c\n")
    for p in folder.iterdir():
        if p.is_file():
            os.chown(p, who.uid, who.gid)
    _as(who, "git", "add", ".", cwd=folder)
    _as(who, "git", "commit", "-qm", "first", cwd=folder)
    head = subprocess.run(
        ["git", "-c", f"safe.directory={folder}", "-C", str(folder), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    )
    return head.stdout.strip()


def _submit(s: Shared, who: Account, name: str, code: Path, data: list[dict[str, Any]]) -> int:
    return s.submit(who, name, [s.python, "-c", "print('step 1 loss 0.5')"], code=code, data=data)


def _record(s: Shared, job_id: int) -> dict[str, Any]:
    con = sqlite3.connect(s.state / "nightshift.db")
    (text,) = con.execute(
        "select provenance from attempt where job_id = ? order by number", (job_id,)
    ).fetchone()
    return json.loads(text)


def test_alices_job_records_her_repository_as_she_reads_it(shared: Shared) -> None:
    s = shared
    repo = s.alice.home / "code"
    commit = _repo(s.alice, repo)
    (repo / "train.py").write_text("print('step 1 loss 0.25')\n")  # dirty, not committed
    # Her data folder, holding a folder and a file of bob's that she may not read: left out.
    mixed = s.alice.home / "mixed"
    (mixed / "bobs").mkdir(parents=True)
    (mixed / "a.txt").write_text("alice\n")
    (mixed / "bobs" / "b.txt").write_text("bob\n")
    (mixed / "locked.txt").write_text("bob\n")
    for p, who, mode in (
        (mixed, s.alice, 0o755),
        (mixed / "a.txt", s.alice, 0o644),
        (mixed / "bobs", s.bob, 0o700),
        (mixed / "bobs" / "b.txt", s.bob, 0o600),
        (mixed / "locked.txt", s.bob, 0o600),
    ):
        os.chown(p, who.uid, who.gid)
        p.chmod(mode)
    job = _submit(
        s,
        s.alice,
        "alice-prov",
        repo,
        [{"path": "data.txt", "hash": True}, {"path": str(mixed), "hash": True}],
    )
    assert s.wait_state(job, ("succeeded", "failed")) == "succeeded", _log(s, job)
    rec = _record(s, job)
    git = rec["git"]
    assert git["commit"] == commit and git["branch"] == "main", git
    assert git["dirty"] is True and git["diff_files"] == 1, git
    diff = (s.state / "provenance" / git["diff_sha256"][:2] / git["diff_sha256"]).read_bytes()
    assert b"+print('step 1 loss 0.25')" in diff
    data, part = rec["data"]
    assert data["files"] == 1 and data["sha256"] and data["fingerprint"], data
    assert part["files"] == 1 and part["bytes"] == len("alice\n") and part["unreadable"] == 2
    assert part["note"] == f"2 file(s) or folder(s) not readable by {s.alice.name}, left out"
    assert rec["read_as"] == s.alice.name
    show = s.run(s.alice, "show", str(job))
    assert f"@ {commit[:12]} (branch main), DIRTY: diff" in show.stdout, show.stdout + show.stderr
    assert f"1 file(s), 6 bytes, fingerprint {part['fingerprint'][:12]}" in show.stdout
    assert f"{part['note']}" in show.stdout


def test_a_folder_only_bob_can_read_is_not_read_into_alices_record(shared: Shared) -> None:
    s = shared
    bob_repo = s.bob.home / "private"
    _repo(s.bob, bob_repo)
    secret = s.root / "shared" / "bob-only.bin"  # in a folder alice can list: she may stat it
    secret.write_bytes(b"bob's data\n")
    os.chown(secret, s.bob.uid, s.bob.gid)
    secret.chmod(0o600)
    job = _submit(
        s,
        s.alice,
        "alice-peeks",
        bob_repo,
        [
            {"path": str(bob_repo / "data.txt"), "hash": True},
            {"path": str(bob_repo)},
            {"path": str(secret), "hash": True},
        ],
    )
    s.wait_state(job, ("succeeded", "failed"))  # she cannot even start in bob's folder
    rec = _record(s, job)
    for item in rec["data"]:
        assert not {"files", "bytes", "fingerprint", "sha256", "newest_mtime"} & set(item), item
        assert item["note"] == f"not readable by {s.alice.name}", item
    assert rec["git"] == {"repo": None, "note": f"{bob_repo}: not readable by {s.alice.name}"}
    assert not list((s.state / "provenance").glob("*/*")) or all(
        b"bob's data" not in p.read_bytes() for p in (s.state / "provenance").glob("*/*")
    )
