"""The daemon (root in a shared install) reads a job's folder, which is the submitter's: a link the
job's program plants there (metrics, log, checkpoint folder) is refused, never followed, so no
file outside the folder is read, copied or shown back; `..` cannot climb out; plain files read
exactly as before."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from nightshift.runtime.config import Settings
from nightshift.runtime.engine import job_workspace
from nightshift.runtime.errors import SkillFailed
from nightshift.runtime.spec import MetricSpec
from nightshift.runtime.store.db import Attempt, Job
from nightshift.runtime.training import job_files, keeper
from nightshift.runtime.training import metric_sources as ms
from nightshift.skills.base import SkillContext
from nightshift.skills.diagnose_failure import diagnose_failure
from nightshift.skills.job_logs import job_logs

from conftest import empty_store, need, run_skill

SECRET = "SECRET-KEY-3f9a"


@pytest.fixture
def secret(tmp_path) -> Path:
    p = tmp_path / "outside" / "audit.key"
    p.parent.mkdir()
    p.write_text(f'{{"step": 1, "loss": 0.5}}\nstep 2 loss 0.25 {SECRET}\n')
    return p


@pytest.fixture
def ctx(tmp_path) -> SkillContext:
    return SkillContext(
        store=empty_store(tmp_path / "s.db"),
        settings=Settings(home=str(tmp_path / "home")),
        now=datetime(2026, 12, 2, 3, 0),
    )


def job_with_log(ctx: SkillContext) -> tuple[Path, Path]:
    """A job and one attempt whose log is runs/job-N/attempt-1.log (not written yet)."""
    spec = {"name": "t", "command": ["python", "train.py"]}
    with ctx.store.session() as s:
        job = Job(name="t", spec=spec, params={}, state="running", owner="me")
        s.add(job)
        s.commit()
        s.refresh(job)
        ws = job_workspace(ctx.settings, job.id)
        ws.mkdir(parents=True)
        log = ws / "attempt-1.log"
        s.add(Attempt(job_id=job.id, number=1, state="running", log_path=str(log)))
        s.commit()
        return Path(str(job.id)), log


def metrics(tmp: Path, spec: MetricSpec, cursor: dict | None = None) -> ms.Read:
    kw = dict(log_path=tmp / "attempt-1.log", metrics_file=tmp / "m.jsonl", search_roots=[tmp])
    cur = cursor if cursor is not None else {"log": 0, "files": {}, "kind": None}
    return ms.read_new(spec, cursor=cur, **kw)  # type: ignore[arg-type]


# (a) metrics ------------------------------------------------------------------------------------
def test_a_metrics_file_linked_to_a_secret_yields_nothing(tmp_path, secret):
    ws = tmp_path / "job-7"
    ws.mkdir()
    (ws / "m.jsonl").symlink_to(secret)
    got = metrics(ws, MetricSpec(source="jsonl"))
    assert got.points == []
    (ws / "attempt-1.log").symlink_to(secret)
    got = metrics(ws, MetricSpec(source="log", regex=[r"step (?P<step>\d+) loss (?P<loss>\S+)"]))
    assert got.points == [] and got.output_bytes == 0
    assert SECRET not in json.dumps(got.cursor)


def test_a_metrics_folder_linked_elsewhere_is_not_read(tmp_path, secret):
    ws = tmp_path / "job-7"
    ws.mkdir()
    (ws / "logs").symlink_to(secret.parent, target_is_directory=True)
    (secret.parent / "m.jsonl").write_text('{"step": 3, "loss": 0.1}\n')
    got = ms.read_new(
        MetricSpec(source="jsonl"),
        log_path=ws / "attempt-1.log",
        metrics_file=ws / "logs" / "m.jsonl",
        search_roots=[ws],
        cursor={"log": 0, "files": {}, "kind": None},
    )
    assert got.points == []


# (b) logs ---------------------------------------------------------------------------------------
def test_job_logs_refuses_a_log_linked_to_a_secret(ctx, secret):
    job_id, log = job_with_log(ctx)
    log.symlink_to(secret)
    with pytest.raises(SkillFailed) as err:
        run_skill(job_logs, ctx, {"job_id": int(str(job_id))})
    assert "symbolic link" in str(err.value) and SECRET not in str(err.value)
    assert str(secret) not in str(err.value)


def test_diagnose_failure_does_not_read_a_job_log_linked_to_a_secret(ctx, secret):
    _, log = job_with_log(ctx)
    log.symlink_to(secret)
    d = run_skill(diagnose_failure, ctx, {"log_path": str(log), "exit_code": 1})
    assert SECRET not in d.model_dump_json()
    assert "symbolic link" in d.model_dump_json()


# (c) checkpoints --------------------------------------------------------------------------------
def test_keeper_does_not_copy_from_a_linked_checkpoint_folder(tmp_path):
    torch = need("torch", "checkpoints written with torch.save")
    from nightshift.runtime.training import checkpoints

    elsewhere = tmp_path / "root-only"
    elsewhere.mkdir()
    torch.save({"model": {"w": torch.ones(4)}, "iter_num": 50}, elsewhere / "ckpt.pt")
    ws = tmp_path / "job-7"
    ws.mkdir()
    (ws / "out").symlink_to(elsewhere, target_is_directory=True)
    (found,) = checkpoints.scan(ws / "out")
    assert keeper.keep(found, ws / "out", ws) is None
    assert keeper.kept(ws) == [] and not list(ws.rglob("ckpt.pt"))[1:]


def test_keeper_does_not_copy_a_linked_checkpoint_file(tmp_path, secret):
    torch = need("torch", "checkpoints written with torch.save")
    from nightshift.runtime.training import checkpoints

    ws, out = tmp_path / "job-7", tmp_path / "job-7" / "out"
    out.mkdir(parents=True)
    torch.save({"model": {"w": torch.ones(4)}, "iter_num": 50}, out / "ckpt.pt")
    (found,) = checkpoints.scan(out)
    (out / "ckpt.pt").unlink()
    (out / "ckpt.pt").symlink_to(secret)
    assert keeper.keep(found, out, ws) is None
    assert not (ws / keeper.GOOD_DIR).exists() or not any(
        SECRET in p.read_text(errors="replace")
        for p in (ws / keeper.GOOD_DIR).rglob("*")
        if p.is_file()
    )


def test_restore_puts_back_nothing_when_a_kept_file_is_a_link(tmp_path, secret):
    """The kept folder is in the job's folder, so the job can add a file to its manifest and
    make it a link to a secret: a resume from the copy puts nothing back (and copies no secret
    next to the program's checkpoint)."""
    torch = need("torch", "checkpoints written with torch.save")
    from nightshift.runtime.training import checkpoints

    ws, out = tmp_path / "job-7", tmp_path / "job-7" / "out"
    out.mkdir(parents=True)
    torch.save({"model": {"w": torch.ones(4)}, "iter_num": 50}, out / "ckpt.pt")
    (found,) = checkpoints.scan(out)
    copy = keeper.keep(found, out, ws)
    assert copy is not None
    manifest = copy.parent / keeper.MANIFEST
    meta = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**meta, "files": [*meta["files"], "extra.bin"]}))
    (copy.parent / "extra.bin").symlink_to(secret)
    assert keeper.restore(str(copy), ws, attempt=2) == str(copy)  # nothing put back
    assert not (out / "extra.bin").exists()
    made = [p for p in ws.rglob("*") if p.is_file() and not p.is_symlink()]
    assert not any(SECRET in p.read_text(errors="replace") for p in made)


# (d) escapes ------------------------------------------------------------------------------------
def test_dot_dot_and_paths_elsewhere_are_refused(tmp_path, secret):
    ws = tmp_path / "job-7"
    ws.mkdir()
    for path in ("../outside/audit.key", ws / ".." / "outside" / "audit.key", secret):
        with pytest.raises(job_files.JobFileRefused):
            job_files.open_file(ws, path)
    got = ms.read_new(
        MetricSpec(source="jsonl"),
        log_path=ws / "attempt-1.log",
        metrics_file=ws / ".." / "outside" / "audit.key",
        search_roots=[ws],
        cursor={"log": 0, "files": {}, "kind": None},
    )
    assert got.points == []
    with pytest.raises(job_files.JobFileRefused, match="symbolic link"):
        (ws / "d").symlink_to(secret.parent, target_is_directory=True)
        job_files.open_file(ws, "d/audit.key")


# (e) plain files --------------------------------------------------------------------------------
def test_plain_files_read_as_before(ctx, tmp_path):
    job_id, log = job_with_log(ctx)
    log.write_text("".join(f"step {i} loss {1 / (i + 1):.4f}\n" for i in range(50)) + "partial")
    r = run_skill(job_logs, ctx, {"job_id": int(str(job_id)), "tail": 3})
    assert r.lines == ["step 47 loss 0.0208", "step 48 loss 0.0204", "step 49 loss 0.0200"]
    assert r.end_offset == log.stat().st_size - len("partial")
    ws = log.parent
    (ws / "m.jsonl").write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n{"ste')
    got = metrics(ws, MetricSpec(source="jsonl"))
    assert [(p.step, p.value) for p in got.points] == [(1, 0.5), (2, 0.25)]
    assert got.cursor["files"][str(ws / "m.jsonl")]["offset"] == len(
        '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n'
    )
    d = run_skill(diagnose_failure, ctx, {"log_path": str(log), "exit_code": 1})
    assert "symbolic link" not in d.model_dump_json()
    with job_files.open_file(ws, "m.jsonl") as f:
        assert f.read().startswith(b'{"step": 1')


def test_restore_writes_nowhere_a_rewritten_manifest_names(tmp_path):
    """Why: the kept copy's manifest lies in the job's folder, which a job running as its
    submitter can rewrite; with `root: /etc/cron.d` the daemon (root) copied the kept files
    there. Only the spec's checkpoint folder is taken, and a root outside the job's folder only
    where no privilege is crossed."""
    torch = need("torch", "checkpoints written with torch.save")
    from nightshift.runtime.training import checkpoints

    ws, out = tmp_path / "job-7", tmp_path / "job-7" / "out"
    out.mkdir(parents=True)
    torch.save({"model": {"w": torch.ones(4)}, "iter_num": 50}, out / "ckpt.pt")
    (found,) = checkpoints.scan(out)
    copy = keeper.keep(found, out, ws)
    assert copy is not None
    target = tmp_path / "cron.d"
    target.mkdir()
    manifest = copy.parent / keeper.MANIFEST
    meta = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**meta, "root": str(target)}))
    got = keeper.restore(str(copy), ws, attempt=2, checkpoint_dir=out, outside_ok=False)
    assert got == str(copy) and list(target.iterdir()) == []
    got = keeper.restore(str(copy), ws, attempt=2, checkpoint_dir=out)  # not the spec's folder
    assert got == str(copy) and list(target.iterdir()) == []
    manifest.write_text(json.dumps(meta))  # as kept: put back where the program wrote it
    (out / "ckpt.pt").unlink()
    assert keeper.restore(str(copy), ws, attempt=2, checkpoint_dir=out) == str(out / "ckpt.pt")
    assert (out / "ckpt.pt").exists()
