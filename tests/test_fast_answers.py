"""Fast answers: `nightshift jobs`, `status`, `show JOB` and `logs JOB` read one's own SQLite store
without the ORM (runtime/store/quick_read.py), pydantic or Typer (agent/doors/entry.py, quick.py)
and print a large table without Rich laying out every cell (console.print_table). Each must print
exactly what the full path prints, on a store that real runs filled; the full path is forced with
NIGHTSHIFT_FULL_READ_PATH. Before this, `jobs` imported SQLAlchemy and took ten seconds on 10,000
jobs, almost all of it Rich's layout, and `show` a second and a half through the gate. `status`
is a summary, no longer a second `jobs`. `jobs --watch` refreshes the table as `watch squeue`
does, until Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from served_daemon import served

from conftest import REPO, nightshift, store_row

FULL = {"NIGHTSHIFT_FULL_READ_PATH": "1"}


def _spec(tmp_path: Path, name: str, command: list[str], gpus: int = 0) -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"name": name, "command": command, "retries": 0, "resources": {"gpus": gpus}}
        )
    )
    return spec


def _submit(spec: Path) -> int:
    r = nightshift("submit", str(spec), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return int(json.loads(r.stdout)["job_ids"][0])


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> Path:
    """A home whose store real runs filled, the daemon stopped: a job that failed (`import
    torch` without torch: diagnosed import_or_env), one that succeeded, one running, one queued
    for a GPU this machine does not have (with the loop's hold reason)."""
    tmp = tmp_path_factory.mktemp("fast")
    home = tmp / "home"
    home.mkdir()
    env = {
        "NIGHTSHIFT_HOME": str(home),
        "NIGHTSHIFT_GPU__PROBE": "none",
        "NIGHTSHIFT_LOOP__POLL_INTERVAL_S": "0.1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    db = home / "nightshift.db"
    daemon = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "daemon"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        failed = _submit(_spec(tmp, "needs-torch", ["{python}", "-S", "-c", "import torch"]))
        store_row(db, f"select 1 from job where id = {failed} and state = 'failed'", proc=daemon)
        ok = _submit(_spec(tmp, "hello", ["{python}", "-c", "print('step 1 loss 0.5')"]))
        store_row(db, f"select 1 from job where id = {ok} and state = 'succeeded'", proc=daemon)
        running = _submit(_spec(tmp, "sleeper", ["{python}", "-c", "import time; time.sleep(60)"]))
        store_row(db, f"select 1 from job where id = {running} and state = 'running'", proc=daemon)
        held = _submit(_spec(tmp, "wants-gpu", ["{python}", "-c", "pass"], gpus=1))
        store_row(db, f"select 1 from job_hold where job_id = {held}", proc=daemon)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
    yield home
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    subprocess.run(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "cancel", str(running), "--yes"],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["jobs"],
        ["jobs", "--json"],
        ["jobs", "--state", "failed", "--state=queued"],
        ["status"],
        ["status", "--json"],
        ["show", "1"],
        ["show", "2"],
        ["logs", "1"],
        ["logs", "2", "-n", "1"],
        ["logs", "1", "--attempt", "1", "--tail=3"],
    ],
    ids=" ".join,
)
@pytest.mark.parametrize("columns", ["200", "60"])
def test_the_fast_path_prints_what_the_full_path_prints(filled, args, columns):
    """The second reader and the fast table are held to the full path's output, byte for byte,
    wide (the fast table) and narrow (Rich wraps: the fast table steps aside)."""
    fast = nightshift(*args, env={"COLUMNS": columns})
    full = _full_cli(*args, env={"COLUMNS": columns, **FULL})
    assert fast.returncode == full.returncode == 0, fast.stderr + full.stderr
    assert fast.stdout == full.stdout
    if args == ["jobs"] and columns == "200":  # the store really holds what the test is about
        for seen in ("failed", "import_or_env", "succeeded", "running", "queued", "GPU"):
            assert seen in fast.stdout, fast.stdout


def _full_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The full command line (Typer, cli.py), not the entry's fast answers."""
    return subprocess.run(
        [sys.executable, "-m", "nightshift.agent.doors.cli", *args],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )


def _modules_after(*args: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules a real `nightshift ARGS` (the installed entry point) had imported when it
    exited."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('\\n'.join(sorted(sys.modules)), file=sys.stderr))\n"
        f"sys.argv = ['nightshift', *{list(args)!r}]\n"
        "from nightshift.agent.doors.entry import main\n"
        "main()\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return set(r.stderr.split())


@pytest.mark.parametrize("args", [["jobs"], ["status"], ["show", "1"], ["logs", "1"]], ids=" ".join)
def test_the_everyday_reads_import_no_orm_pydantic_or_typer(filled, args):
    """The four everyday reads on one's own SQLite store answer without SQLAlchemy, SQLModel,
    Alembic, LangGraph, Textual, pydantic (settings, models) or Typer (which checks arguments
    through pydantic): their imports alone took longer than the whole answer should."""
    imported = {m.split(".")[0] for m in _modules_after(*args)}
    heavy = {"sqlalchemy", "sqlmodel", "alembic", "langgraph", "textual", "pydantic", "typer"}
    assert heavy & imported == set()


def test_a_gated_read_imports_its_own_skill_only(filled):
    """`show` through the gate (the full path) imports that skill's module (and the policy
    stack its reviewer, apply_policy), not every built-in's: the checkpoint search's NumPy, the
    sweeps' Optuna, the GPU probes."""
    skills = {
        m
        for m in _modules_after("show", "1", env={**os.environ, **FULL})
        if m.startswith("nightshift.skills.")
    }
    assert skills == {
        "nightshift.skills.base",
        "nightshift.skills.builtin",
        "nightshift.skills.registry",
        "nightshift.skills.apply_policy",
        "nightshift.skills.show_job",
    }


def test_status_is_a_summary(filled):
    """`status` says how things stand without listing every job: the count in each state, the
    running job with its attempt, the next queued one and why it waits, the newest failure and
    why it failed; and, while the kill switch is on, that it is, by whom and why."""
    out = nightshift("status").stdout
    assert out.startswith("4 jobs: 1 running, 1 queued, 1 failed, 1 succeeded"), out
    for table, row in (
        ("running", "sleeper"),
        ("next up", "wants-gpu"),
        ("newest failures", "needs-torch"),
    ):
        assert table in out and row in out, out
    assert "import_or_env" in out and "hello" not in out, out
    summary = json.loads(nightshift("status", "--json").stdout)
    assert summary["counts"] == {
        "running": 1,
        "queued": 1,
        "paused": 0,
        "failed": 1,
        "succeeded": 1,
        "cancelled": 0,
    }
    assert [r["name"] for r in summary["failed_newest"]] == ["needs-torch"]
    assert summary["paused"] is None
    r = nightshift("pause", "--reason", "disk swap tonight")
    assert r.returncode == 0, r.stderr
    try:
        fast = nightshift("status").stdout
        assert "PAUSED" in fast and "disk swap tonight" in fast, fast
        assert fast == _full_cli("status", env={"COLUMNS": "200", **FULL}).stdout
    finally:
        assert nightshift("resume").returncode == 0


def test_jobs_watch_refreshes_until_ctrl_c(filled):
    """`jobs --watch` prints the table again every interval, without a terminal one after
    the other; Ctrl-C ends it with exit 0 and no traceback."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nightshift.agent.doors.cli",
            "jobs",
            "--watch",
            "--interval",
            "0.2",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.stdout is not None
    seen, tables = [], 0
    end = time.monotonic() + 60
    while tables < 2 and time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        tables += line.startswith("jobs ")
    assert tables == 2, "".join(seen)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Aborted" not in err, err
    assert "every 0.2 s" in "".join(seen) and "needs-torch" in "".join(seen)


def test_watch_refuses_json(filled):
    """--watch prints tables for a person: with --json it is one clear line, exit 2."""
    r = nightshift("jobs", "--watch", "--json")
    assert r.returncode == 2
    assert "--watch and --json" in r.stderr


def test_a_client_of_the_daemon_imports_no_store(tmp_path):
    """A client of a shared daemon sends a JSON line and prints the answer: `jobs`, `status`,
    `show` and `logs` import neither SQLAlchemy nor the engine (the skills' result models are
    parsed without them)."""
    with served(tmp_path) as daemon:
        spec = _spec(tmp_path, "hello", ["{python}", "-c", "print('step 1 loss 0.5')"])
        r = daemon.run("submit", str(spec))
        assert r.returncode == 0, r.stderr
        env = daemon.env_for("client")
        for args in (["jobs"], ["status"], ["show", "1"], ["logs", "1"]):
            imported = _modules_after(*args, env=env)
            assert "sqlalchemy" not in imported and "nightshift.runtime.engine" not in imported, (
                args
            )
