"""Every command, given a config file that does not exist or a store that cannot be opened, answers
with one error line naming it and exit code 5, the operator's (health: 3, its UNKNOWN in the Nagios
convention its exit codes follow); an unknown job, approval or a bad argument is exit 2, the
caller's to fix. None prints a traceback and none loses anything stored."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import REPO, nightshift

COMMANDS = [
    ["run", str(REPO / "examples/goals/quickstart.yaml")],
    ["skill", "list_jobs"],
    ["submit", str(REPO / "examples/specs/quickstart.yaml")],
    ["daemon", "--max-ticks", "1"],
    ["jobs"],
    ["status"],
    ["show", "1"],
    ["logs", "1"],
    ["cancel", "1"],
    ["retry", "1"],
    ["approve", "1"],
    ["reject", "1"],
    ["pause"],
    ["resume"],
    ["report"],
    ["approvals", "list"],
    ["audit", "verify"],
    ["audit", "show"],
    ["config", "show"],
    ["health"],
    ["validate", str(REPO / "examples/specs/quickstart.yaml")],
]


@pytest.mark.parametrize(
    "argv", COMMANDS, ids=[" ".join(a[:2]).replace(str(REPO) + "/", "") for a in COMMANDS]
)
def test_a_missing_config_file_is_one_line_and_exit_5(argv, home):
    r = nightshift(*argv, "--config", "/nonexistent/nightshift.yaml", timeout=60)
    assert r.returncode == (3 if argv[0] == "health" else 5), (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == [
        "error: --config /nonexistent/nightshift.yaml: file not found"
    ], r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert not (home / "nightshift.db").exists()


# The commands below run in one process each scenario (as `nightshift ARGV` would, through the
# same main()): a subprocess per command would cost the suite a minute and a half.
DRIVER = textwrap.dedent("""
    import contextlib, io, json, sys, traceback
    from nightshift.agent.doors import cli
    for line in open(sys.argv[1]):
        argv = json.loads(line)
        out, err, code, tb = io.StringIO(), io.StringIO(), 0, None
        sys.argv = ["nightshift", *argv]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (exc.code is not None)
            except BaseException:
                code, tb = 1, traceback.format_exc()
        print(json.dumps({"argv": argv, "code": code, "out": out.getvalue(),
                          "err": err.getvalue(), "tb": tb}), flush=True)
""")


def run_all(
    tmp_path: Path, commands: list[list[str]], env: dict[str, str] | None = None
) -> list[dict]:
    listing = tmp_path / "commands.jsonl"
    listing.write_text("".join(json.dumps(c) + "\n" for c in commands))
    r = subprocess.run(
        [sys.executable, "-c", DRIVER, str(listing)],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    results = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["argv"] for x in results] == commands
    for x in results:
        assert x["tb"] is None and "Traceback" not in x["out"] + x["err"], x
    return results


def invoke(argv: list[str]) -> tuple[int, str, str, str | None]:
    """`nightshift ARGV` in this process, through the CLI's own main() (as DRIVER runs each
    line): exit code, stdout, stderr and a traceback if one escaped. For tests that run many
    commands (fuzzing) or must be stopped by a timeout if a command hangs."""
    import contextlib
    import io
    import traceback

    from nightshift.agent.doors import cli

    out, err, code, tb = io.StringIO(), io.StringIO(), 0, None
    saved = sys.argv
    sys.argv = ["nightshift", *argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:
            code, tb = -1, traceback.format_exc()
        finally:
            sys.argv = saved
    return code, out.getvalue(), err.getvalue(), tb


def test_a_store_that_cannot_be_opened_is_one_line_and_exit_5(home, tmp_path):
    """store.url under a regular file (even root cannot create that folder): every command that
    needs the store says which and where, exit 5; the ones that need none still work."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    url = f"sqlite:///{blocker}/nightshift.db"
    needs_store = [c for c in COMMANDS if c[0] != "config"]
    results = run_all(
        tmp_path, [*needs_store, ["config", "show"], ["skills"]], env={"NIGHTSHIFT_STORE__URL": url}
    )
    for x in results[: len(needs_store)]:
        assert x["code"] == (3 if x["argv"][0] == "health" else 5), x
        assert x["err"].startswith("error: ") and str(blocker) in x["err"], x
        assert len(x["err"].strip().splitlines()) == 1, x
    assert [x["code"] for x in results[len(needs_store) :]] == [0, 0]


def test_unknown_jobs_and_approvals_are_bad_arguments_exit_2(home, tmp_path):
    """A fresh store: every command naming job 99 or approval 99 says there is none, exit 2
    (the caller retries with another id) — nothing is parked for approval, nothing is written
    but the audit of the refused call."""
    goal = tmp_path / "cancel-missing.yaml"
    goal.write_text(
        yaml.safe_dump(
            {"name": "cancel-missing", "steps": [{"skill": "cancel_job", "args": {"job_id": 99}}]}
        )
    )
    commands = [
        ["show", "99"],
        ["logs", "99"],
        ["cancel", "99"],
        ["retry", "99"],
        ["skill", "cancel_job", "--arg", "job_id=99"],
        ["skill", "show_job", "--arg", "job_id=99"],
        ["approvals", "show", "99"],
        ["approve", "99"],
        ["reject", "99"],
    ]
    results = run_all(tmp_path, [*commands, ["run", str(goal)]])
    for x in results[:-1]:
        assert x["code"] == 2, x
        assert x["err"].startswith("error: no ") and "99" in x["err"], x
    goal_run = results[-1]
    assert goal_run["code"] == 2 and "no job 99" in goal_run["out"], goal_run
    db = home / "nightshift.db"
    con = sqlite3.connect(db)
    assert con.execute("select count(*) from approval").fetchone() == (0,)
    assert con.execute("select count(*) from job").fetchone() == (0,)


def test_bad_arguments_name_the_field_and_exit_2(home, tmp_path):
    unknown_skill = tmp_path / "unknown-skill.yaml"
    unknown_skill.write_text(
        yaml.safe_dump({"name": "bad", "steps": [{"skill": "no_such_skill", "args": {}}]})
    )
    cases = [
        (["skill", "no_such_skill"], "no_such_skill"),
        (["skill", "list_jobs", "--arg", "limit=abc"], "limit"),
        (["skill", "list_jobs", "--arg", "nokeyvalue"], "--arg 'nokeyvalue'"),
        (["submit", "/nonexistent/spec.yaml"], "/nonexistent/spec.yaml"),
        (
            ["submit", str(REPO / "examples/specs/quickstart.yaml"), "--priority", "urgentest"],
            "--priority",
        ),
        (["run", "--resume", "no-such-thread"], "no-such-thread"),
        (["run"], "GOAL_FILE"),
        (["jobs", "--state", "bogus"], "--state 'bogus'"),
        (["report", "--hours", "-5"], "--hours"),
        (["audit", "show", "--limit", "0"], "--limit"),
        (["show", "abc"], "job_id"),
        (["validate", "/nonexistent.yaml"], "/nonexistent.yaml"),
        (["tune-lr", str(unknown_skill), "--mode", "bogus"], "--mode 'bogus'"),
        (["diagnose", "/nonexistent.log"], "/nonexistent.log"),
        (["run", str(unknown_skill)], "no_such_skill"),
    ]
    results = run_all(tmp_path, [argv for argv, _ in cases])
    for x, (_, named) in zip(results, cases, strict=True):
        assert x["code"] == 2, x
        assert named in x["err"] + x["out"], x
    assert not (home / "nightshift.db").exists() or sqlite3.connect(home / "nightshift.db").execute(
        "select count(*) from job"
    ).fetchone() == (0,)


def test_validate_help_names_every_format_the_readers_know():
    """`--help` lists the formats without importing the readers; this keeps the two the same."""
    from nightshift.agent.doors.commands.validate import FORMAT_NAMES
    from nightshift.runtime.training.training_configs import FORMATS

    assert FORMAT_NAMES.split(", ") == list(FORMATS)
