"""Why a job failed, at a glance: the loop keeps a diagnosis with each failed attempt as it ends
(category, the evidence line and its number, a summary, the fix), and `jobs`, `show`, `why` and
`diagnose JOB` say it. Before this, `jobs` said "attempt 1 exited with code 1", `show` had no
evidence for a crash or an import failure, and `diagnose` took only a log path."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from alembic import command
from alembic.config import Config

from nightshift.runtime.config import Settings
from nightshift.runtime.store.db import Attempt, Job, Store
from nightshift.runtime.store.migrations import SCRIPT_LOCATION

from conftest import REPO, nightshift, store_row, use_home

# `-S`: no site-packages, so `import torch` fails for real, wherever torch is installed.
NEEDS_TORCH = ["{python}", "-S", "-c", "print('loading the model'); import torch"]
RAISES = ["{python}", "-c", "print('step 1'); raise ValueError('bad shape (3, 4)')"]
EXITS_3 = ["{python}", "-c", "import sys; print('working'); sys.exit(3)"]
MODULE_LINE = "ModuleNotFoundError: No module named 'torch'"


def run_jobs(tmp_path, *commands: list[str]) -> str:
    """Submit one job per command and watch them all end, with `nightshift run` and a goal of
    plain steps: no recovery, no agent diagnosis, so what is shown is the loop's own."""
    steps: list[dict] = []
    for i, cmd in enumerate(commands, 1):
        spec = tmp_path / f"spec{i}.yaml"
        spec.write_text(yaml.safe_dump({"name": f"job{i}", "command": cmd, "retries": 0}))
        steps.append({"skill": "submit_job", "args": {"spec_path": str(spec)}})
    steps += [{"watch": i} for i in range(1, len(commands) + 1)]
    goal = tmp_path / "goal.yaml"
    goal.write_text(yaml.safe_dump({"name": "fail", "steps": steps}))
    return nightshift("run", str(goal), timeout=120).stdout


def jobs_json() -> dict[int, dict]:
    r = nightshift("jobs", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return {row["id"]: row for row in json.loads(r.stdout)}


# The job a program that swaps its log for a link to `secret` (a file it may not read) runs.
SWAPS_ITS_LOG = [
    "{python}",
    "-c",
    "import os, sys; log = os.path.join(sys.argv[1], 'attempt-1.log'); os.remove(log); "
    "os.symlink(sys.argv[2], log); sys.exit(1)",
    "{run_dir}",
]


@dataclass
class Failed:
    """A home where one `nightshift run` watched four failing jobs end: 1 needs torch, 2 raises,
    3 exits 3 saying nothing, 4 swapped its log for a link to a secret; `ran` is what it
    printed."""

    home: Path
    ran: str
    secret: Path


@pytest.fixture(scope="module")
def failed_home(tmp_path_factory) -> Failed:
    """The four failures run once for the module (each test read them from a run of its own,
    the same program in the same loop): the tests only read the store and the logs."""
    tmp = tmp_path_factory.mktemp("why")
    home = tmp / "home"
    home.mkdir()
    secret = tmp / "secret.txt"
    secret.write_text("ModuleNotFoundError: No module named 'root_only_secret'\n")
    with pytest.MonkeyPatch.context() as mp:
        use_home(mp, home)
        ran = run_jobs(tmp, NEEDS_TORCH, RAISES, EXITS_3, [*SWAPS_ITS_LOG, str(secret)])
    return Failed(home, ran, secret)


@pytest.fixture
def failed(home, monkeypatch, failed_home) -> Failed:
    """This test's commands read the module's home of four failed jobs."""
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(failed_home.home))
    return failed_home


def test_a_missing_package_is_named_by_jobs_show_why_and_diagnose(failed):
    """The newcomer's first failure: `import torch` in an environment without it."""
    ran, home = failed.ran, failed.home
    # No step was recorded: the run's lines say nothing of one rather than "step None".
    assert "job 1 failed after attempt 1 (exit 1)" in ran and "None" not in ran, ran
    row = jobs_json()[1]
    assert row["state"] == "failed"
    assert row["why"] == f"import_or_env: {MODULE_LINE}"
    listed = nightshift("jobs")
    assert "import_or_env" in listed.stdout and "No module named" in listed.stdout

    show = nightshift("show", "1")
    assert show.returncode == 0, show.stderr
    # the log: "loading the model", "Traceback ...", "  File ...", then the error on line 4
    assert f"line 4 of {home / 'runs/job-1/attempt-1.log'}: {MODULE_LINE}" in show.stdout
    assert "fix: the environment is broken" in show.stdout
    shown = json.loads(nightshift("show", "1", "--json").stdout)
    diagnosis = shown["attempts"][0]["diagnosis"]
    assert (diagnosis["category"], diagnosis["line_no"], diagnosis["evidence"]) == (
        "import_or_env",
        4,
        MODULE_LINE,
    )
    assert diagnosis["retryable"] is False and diagnosis["action"] == "stop"

    why = nightshift("why", "1")
    assert why.returncode == 0, why.stderr
    out = why.stdout
    assert "import_or_env" in out and "a retry will not help" in out
    assert "line 4" in out and MODULE_LINE in out
    assert "a Python package is missing" in out  # the summary
    assert "fix: the environment is broken" in out and "virtual environment" in out

    diagnose = nightshift("diagnose", "1", "--json")
    assert diagnose.returncode == 0, diagnose.stdout + diagnose.stderr
    result = json.loads(diagnose.stdout)
    assert result["category"] == "import_or_env"
    assert {"line_no": 4, "text": MODULE_LINE, "source": "log"} in result["evidence"]
    assert "exited with status 1" in result["reasoning"]  # the recorded exit code was used
    # a file path still works, and a number that names a file here is that file
    log = home / "runs/job-1/attempt-1.log"
    assert json.loads(nightshift("diagnose", str(log), "--json").stdout)["category"] == (
        "import_or_env"
    )
    missing = nightshift("diagnose", "7")
    assert missing.returncode != 0 and "7" in missing.stderr + missing.stdout
    assert "Traceback" not in missing.stderr + missing.stdout


def test_an_exception_and_a_bare_exit_code_read_sensibly(failed):
    """A crash names its exception line; an exit code with nothing in the log says just that,
    never a guess (jobs 2 and 3 of the module's run)."""
    rows = jobs_json()
    assert rows[2]["why"] == "crashed: ValueError: bad shape (3, 4)"
    assert rows[3]["why"].startswith("unknown: the process exited with status 3")
    assert rows[3]["diagnosis"]["evidence"] is None

    crashed = nightshift("why", "2").stdout
    assert "crashed" in crashed and "line 4" in crashed and "ValueError: bad shape" in crashed
    assert "a retry can help" in crashed and "resume once from the last checkpoint" in crashed
    bare = nightshift("why", "3").stdout
    assert "unknown" in bare and "exited with status 3, and nothing in the log" in bare
    assert "read the full log" in bare  # the fix
    assert "None" not in bare

    show = nightshift("show", "3").stdout
    assert "summary: the process exited with status 3" in show
    assert "next attempt resumes" not in show and "None" not in show


def test_a_store_from_before_0012_still_lists_and_says_what_to_do(home, tmp_path):
    """Attempts that failed before diagnoses were kept have none: listings go on, and `why`
    points to `diagnose`, which reads the log now."""
    db = home / "nightshift.db"
    store = Store(f"sqlite:///{db}")
    log = home / "runs/job-1/attempt-1.log"
    log.parent.mkdir(parents=True)
    log.write_text(f"Traceback (most recent call last):\n  File 'x', line 1\n{MODULE_LINE}\n")
    with store.session() as s:
        s.add(Job(name="old", spec={"name": "old", "command": ["true"]}, state="failed"))
        s.flush()
        s.add(
            Attempt(
                job_id=1,
                number=1,
                state="exited",
                outcome="failed",
                exit_code=1,
                log_path=str(log),
            )
        )
    store.engine.dispose()
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.set_main_option("sqlalchemy.url", f"sqlite:///{db}")
    command.downgrade(cfg, "0011_approval_approvers")
    columns = [c[1] for c in sqlite3.connect(db).execute("pragma table_info(attempt)")]
    assert "diagnosis" not in columns

    row = jobs_json()[1]  # opening the store upgrades it
    assert row["state"] == "failed" and row["diagnosis"] is None
    assert row["why"] is None
    assert nightshift("show", "1").returncode == 0
    why = nightshift("why", "1")
    assert why.returncode == 0, why.stderr
    assert "no diagnosis was kept" in why.stdout and "nightshift diagnose 1" in why.stdout
    assert json.loads(nightshift("diagnose", "1", "--json").stdout)["category"] == "import_or_env"


@pytest.mark.slow
def test_a_client_of_the_daemon_gets_the_diagnosis_through_the_skills(home, tmp_path):
    """Over the daemon's socket `jobs` and `why` read list_jobs and show_job, not the store."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "torch", "command": NEEDS_TORCH, "retries": 0}))
    daemon = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "daemon"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    client = {"NIGHTSHIFT_API__MODE": "client"}  # every command asks the daemon
    socket = Settings(home=home).api_socket
    try:
        end = time.monotonic() + 60
        while not socket.exists():
            assert daemon.poll() is None and time.monotonic() < end, "the daemon did not serve"
            time.sleep(0.1)
        r = nightshift("submit", str(spec), env=client)
        assert r.returncode == 0, r.stdout + r.stderr
        store_row(
            home / "nightshift.db",
            "select 1 from attempt where job_id=1 and diagnosis is not null",
            proc=daemon,
        )
        listed = nightshift("jobs", "--json", env=client)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        assert json.loads(listed.stdout)[0]["why"] == f"import_or_env: {MODULE_LINE}"
        why = nightshift("why", "1", env=client)
        assert why.returncode == 0, why.stderr
        assert "line 4" in why.stdout and MODULE_LINE in why.stdout and "fix:" in why.stdout
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


def test_show_and_status_print_no_none_and_no_resume_for_a_finished_job(home, tmp_path):
    """The quickstart's job crashed, resumed from step 125 and succeeded: `show` told of a "next
    attempt" it would never have, `status` read "0→None" for an attempt with no step yet (now a
    summary: the running job without a step)."""
    store = Store(f"sqlite:///{home / 'nightshift.db'}")
    ckpt = str(home / "runs/job-1/checkpoints/step-125.pt")
    spec = {"name": "x", "command": ["true"]}
    with store.session() as s:
        s.add(Job(name="done", spec=spec, state="succeeded", resume_from=ckpt, resume_step=125))
        s.add(Job(name="broke", spec=spec, state="failed", resume_from=ckpt, resume_step=125))
        s.add(Job(name="fresh", spec=spec, state="running"))
        s.flush()
        s.add(Attempt(job_id=1, number=1, state="exited", outcome="failed", last_step=140))
        s.add(Attempt(job_id=1, number=2, state="exited", outcome="succeeded", start_step=125))
        s.add(Attempt(job_id=2, number=1, state="exited", outcome="failed", exit_code=1))
        s.add(Attempt(job_id=3, number=1, state="running"))
    done = nightshift("show", "1")
    assert done.returncode == 0, done.stderr
    assert "resumes" not in done.stdout and "None" not in done.stdout
    broke = nightshift("show", "2").stdout
    assert f"`nightshift retry 2` resumes from {ckpt} (step 125)" in broke
    status = nightshift("status").stdout
    assert "fresh" in status and "None" not in status  # the running job, no step yet


def test_a_log_the_job_replaced_with_a_link_is_not_read_into_the_diagnosis(failed):
    """The job's folder is its submitter's: a program that swaps its log for a link to a file it
    may not read must not get that file's lines back as the daemon's evidence (job 4 of the
    module's run)."""
    assert (failed.home / "runs/job-4/attempt-1.log").resolve() == failed.secret  # it swapped
    row = jobs_json()[4]
    assert row["state"] == "failed"
    assert "root_only_secret" not in json.dumps(row)
    assert row["diagnosis"]["category"] == "unknown"
    assert "the log was not read" in row["diagnosis"]["summary"]


def test_a_diagnosis_that_fails_never_keeps_the_loop_from_recording_the_end(tmp_path):
    """The diagnosis is a nicety: a classifier that raises leaves the attempt's end recorded
    (failed, no diagnosis) and is reported, and the loop goes on."""
    from nightshift.runtime.engine import Engine
    from nightshift.runtime.executors.executor import RunStatus

    class ExitsOne:
        kind = "local"

        def start(self, req):
            return {"kind": "local"}

        def poll(self, handle):
            return RunStatus(state="exited", exit_code=1)

        def cleanup(self, handle, grace_s=0):
            return []

    def broken(run):
        raise RuntimeError("classifier exploded")

    events: list[tuple[str, dict]] = []
    store = Store(f"sqlite:///{tmp_path / 'n.db'}")
    engine = Engine(
        store,
        ExitsOne(),  # type: ignore[arg-type]
        Settings(home=str(tmp_path)),
        on_event=lambda a, p: events.append((a, p)),
        diagnose=broken,
    )
    with store.session() as s:
        s.add(Job(name="j", spec={"name": "j", "command": ["true"]}))
    engine.tick()  # starts it
    engine.tick()  # sees it exit 1
    att = store.attempts(1)[0]
    assert (store.job(1).state, att.outcome, att.diagnosis) == ("failed", "failed", None)
    assert [p["error"] for a, p in events if a == "diagnosis.failed"] == [
        "RuntimeError: classifier exploded"
    ]


def test_the_tui_jobs_table_shows_the_same_why(failed):
    """The TUI's jobs table (agent/doors/tui/data.py) read only the job's reason ("exited with
    code 1"): it shows the diagnosis first, as `nightshift jobs` does."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.tui.data import job_rows

    rows = {r.id: r for r in job_rows(Wiring.load())}
    assert sorted((r.id, r.state, r.attempts) for r in rows.values()) == [
        (i, "failed", 1) for i in (1, 2, 3, 4)
    ]
    assert rows[1].why == f"import_or_env: {MODULE_LINE}"
    assert {i: r.why for i, r in rows.items()} == {i: j["why"] for i, j in jobs_json().items()}
