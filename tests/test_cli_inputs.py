"""What a person hands the CLI on the command line — a `k=v` value parsed as YAML, a path to a
file — is checked at the door: a bad one is one error line naming the argument and the fix, exit
2 (health: 3, its UNKNOWN), never a traceback and never a hang.

Before: `--param 'lr=[1, {a: *b}]'` printed a YAML ComposerError traceback, and `tune-lr`,
`diagnose`, `health --from`, `sweep --lr-range-test` and `audit verify --against` given a named
pipe blocked for ever (a device such as /dev/zero: read until memory ran out)."""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_errors import DRIVER, invoke

from nightshift.runtime import user_files
from nightshift.runtime.errors import BadArguments

from conftest import REPO

SPEC = str(REPO / "examples/specs/quickstart.yaml")
SWEEP_SPEC = str(REPO / "examples/specs/sweep_numpy.yaml")
CURVE = str(REPO / "tests/fixtures/curves/lr0.1.jsonl")
UNDEFINED_ALIAS = "[1, {a: *b}]"


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) >= 1 and lines[0].startswith("error: "), err
    return " ".join(err.split())  # the console wraps at its width: judge the words


# --- YAML values on the command line -----------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "option", "key"),
    [
        (["submit", SPEC, "--param", f"lr={UNDEFINED_ALIAS}"], "--param", "lr"),
        (["submit", SPEC, "--param", "lr=[1, 2"], "--param", "lr"),
        (["skill", "list_jobs", "--arg", f"limit={UNDEFINED_ALIAS}"], "--arg", "limit"),
        (["tune-lr", CURVE, "--arg", "window=a: b: c"], "--arg", "window"),
    ],
    ids=["param-alias", "param-unclosed", "skill-arg-alias", "tune-arg-mapping"],
)
def test_a_value_that_is_not_yaml_is_bad_arguments_naming_it(home, argv, option, key):
    code, out, err, tb = invoke(argv)
    assert tb is None, tb
    assert code == 2, (code, out, err)
    said = _one_error_line(err)
    assert f"{option} '{key}=" in said and "the value is not YAML" in said, said
    assert "quote it" in said and "write valid YAML" in said, said
    db = home / "nightshift.db"
    assert not db.exists() or sqlite3.connect(db).execute(
        "select count(*) from job"
    ).fetchone() == (0,)


def test_yaml_values_still_parse(home):
    """The ordinary values keep their types: a list, a number, text."""
    from nightshift.agent.doors.shell import parse_key_values

    assert parse_key_values(["gpus=[0, 1]", "lr=0.001", "name=run a", "empty="]) == {
        "gpus": [0, 1],
        "lr": 0.001,
        "name": "run a",
        "empty": "",
    }


# --- files that are not regular files ----------------------------------------------------------
@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "pipe.jsonl"
    os.mkfifo(path)
    return path


FIFO_CASES = [
    (lambda p: ["tune-lr", p], "METRICS", 2),
    (lambda p: ["diagnose", p], "LOGFILE", 2),
    (lambda p: ["validate", p], "FILE", 2),
    (lambda p: ["health", "--from", p], "--from", 3),
    (lambda p: ["sweep", SWEEP_SPEC, "--lr-range-test", p], "--lr-range-test", 2),
    (lambda p: ["run", p], "GOAL_FILE", 2),
    (lambda p: ["submit", p], "SPEC", 2),
    (lambda p: ["audit", "verify", "--against", p], "--against", 2),
]
IDS = ["tune-lr", "diagnose", "validate", "health", "sweep", "run", "submit", "audit-verify"]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("command", "argument", "exit_code"), FIFO_CASES, ids=IDS)
def test_a_named_pipe_is_refused_before_it_is_opened(home, fifo, command, argument, exit_code):
    code, out, err, tb = invoke(command(str(fifo)))
    assert tb is None, tb
    assert code == exit_code, (code, out, err)
    said = _one_error_line(err)
    assert f"{argument}: {fifo} is a named pipe (FIFO), not a regular file" in said, said
    assert "save what it carries to a file" in said, said


DEVICE_CASES = [
    (["tune-lr", "/dev/zero"], "METRICS", 2),
    (["diagnose", "/dev/zero"], "LOGFILE", 2),
    (["validate", "/dev/zero"], "FILE", 2),
    (["health", "--from", "/dev/zero"], "--from", 3),
]


@pytest.mark.timeout(60)
def test_a_device_is_refused(home, tmp_path):
    """/dev/zero never ends: a reader that takes it reads until memory runs out (a timeout cannot
    stop one C-level read), so these run in a child with its address space capped at 4 GiB."""
    listing = tmp_path / "commands.jsonl"
    listing.write_text("".join(json.dumps(argv) + "\n" for argv, _, _ in DEVICE_CASES))

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    r = subprocess.run(
        [sys.executable, "-c", DRIVER, str(listing)],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=50,
        preexec_fn=cap,
    )
    results = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(results) == len(DEVICE_CASES), r.stderr[-3000:]
    for x, (_, argument, exit_code) in zip(results, DEVICE_CASES, strict=True):
        assert x["tb"] is None and x["code"] == exit_code, x
        assert f"{argument}: /dev/zero is a character device" in _one_error_line(x["err"]), x


@pytest.mark.timeout(10)
def test_a_folder_is_refused_naming_the_argument(home, tmp_path):
    code, _, err, tb = invoke(["tune-lr", str(tmp_path)])
    assert tb is None and code == 2
    assert f"METRICS: {tmp_path} is a folder, not a file" in _one_error_line(err)


# --- files read whole have a limit, and the error says it ---------------------------------------
@pytest.mark.timeout(20)
def test_a_metrics_file_over_the_limit_is_refused_saying_the_limit(home, tmp_path):
    from nightshift.skills.tune_lr import MAX_METRICS_BYTES

    big = tmp_path / "huge.jsonl"
    with big.open("wb") as f:
        f.truncate(MAX_METRICS_BYTES + 1)  # sparse: nothing is written
    code, _, err, tb = invoke(["tune-lr", str(big)])
    assert tb is None and code == 2, err
    said = _one_error_line(err)
    assert f"METRICS: {big} is larger than 64 MiB" in said and "tail -n" in said, said


@pytest.mark.timeout(10)
def test_a_config_over_the_limit_is_refused_before_the_skill_reads_it(home, tmp_path):
    """config_validator reads a JSON config whole: the command refuses one over the limit the
    YAML reader keeps (1 MiB), before the call."""
    big = tmp_path / "ds_config.json"
    with big.open("wb") as f:
        f.truncate((1 << 20) + 1)
    code, _, err, tb = invoke(["validate", str(big)])
    assert tb is None and code == 2, err
    assert f"FILE: {big} is larger than 1 MiB" in _one_error_line(err)
    db = home / "nightshift.db"
    assert not db.exists() or sqlite3.connect(db).execute(
        "select count(*) from auditevent where skill = 'config_validator'"
    ).fetchone() == (0,)


# --- the helper itself ---------------------------------------------------------------------------
@pytest.mark.timeout(10)
def test_open_regular_refuses_a_fifo_swapped_in_after_the_check(fifo, monkeypatch):
    """Between the check and the open the path may change: the open does not block on a FIFO
    (O_NONBLOCK) and the descriptor is checked again."""
    monkeypatch.setattr(user_files, "regular_file", lambda path, argument: Path(path))
    with pytest.raises(BadArguments, match="named pipe"):
        user_files.open_regular(fifo, "METRICS")


@pytest.mark.timeout(10)
def test_read_limited_reads_a_regular_file_and_a_link_to_one(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_bytes(b"abc")
    link = tmp_path / "link.jsonl"
    link.symlink_to(f)
    assert user_files.read_limited(link, "METRICS", 3, "") == b"abc"
    with pytest.raises(BadArguments, match="larger than 2 bytes"):
        user_files.read_limited(f, "METRICS", 2, "")
