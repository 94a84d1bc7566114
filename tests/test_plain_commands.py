"""`nightshift submit [options] -- CMD ARGS…` queues a command line as `sbatch --wrap` does: no
YAML, the current folder, the job named after its program, its step and loss read from what it
prints, `--after JOB` waiting on another job; through the daemon's socket and gate like a spec.
Bad options are one line naming the option, before anything is queued."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from served_daemon import Daemon, served

from conftest import nightshift, write_spec


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Daemon]:
    with served(tmp_path_factory.mktemp("plain")) as d:
        yield d


def _show(daemon: Daemon, job_id: int) -> dict:
    r = daemon.run("show", str(job_id), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_plain_command_runs_where_it_was_submitted(daemon: Daemon, tmp_path: Path) -> None:
    """The program runs in the folder `submit` was typed in, named after its script, and its
    printed steps and losses are the job's metrics."""
    (tmp_path / "data.txt").write_text("from the user's folder\n")
    (tmp_path / "train.py").write_text(
        "import pathlib, sys\n"
        "print(pathlib.Path('data.txt').read_text().strip(), sys.argv[1:])\n"
        "for step in (10, 20, 30):\n"
        "    print(f'step {step} loss {1 / step:.3f}', flush=True)\n"
    )
    r = daemon.run(
        "submit", "--watch", "--json", "--", sys.executable, "train.py", "{lr}", "--x",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    first, *stream = r.stdout.splitlines()
    (job_id,) = json.loads(first)["job_ids"]
    assert "from the user's folder ['{lr}', '--x']" in stream  # braces and options as typed
    job = _show(daemon, job_id)
    assert job["name"] == "train" and job["state"] == "succeeded"
    (attempt,) = job["attempts"]
    assert (attempt["last_step"], attempt["last_loss"]) == (30, pytest.approx(0.033))


def test_the_program_is_the_one_the_users_shell_finds(daemon: Daemon, tmp_path: Path) -> None:
    """A program on the submitter's PATH (a virtualenv's, their own bin) and not on the
    daemon's still runs: `submit` names it by the path its shell finds."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "my-tool"
    tool.write_text('#!/bin/sh\necho "my tool says $1"\n')
    tool.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{daemon.env['PATH']}"
    r = daemon.run("submit", "--watch", "--", "my-tool", "hi", cwd=tmp_path, env={"PATH": path})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "my tool says hi" in r.stdout.splitlines()


def test_after_waits_for_the_other_job(daemon: Daemon, tmp_path: Path) -> None:
    """`--after A`: B waits while A runs (the hold says on what), then starts and sees what A
    wrote. A runs until the test has seen B held (it writes `go`; A gives up waiting after 60 s
    and writes anyway), not for a fixed 8 s: B is held for as long as A runs either way."""
    first = daemon.run(
        "submit", "--json", "--name", "writer", "--", sys.executable, "-c",
        "import time, pathlib\n"
        "end = time.monotonic() + 60\n"
        "while not pathlib.Path('go').exists() and time.monotonic() < end: time.sleep(0.05)\n"
        "pathlib.Path('made-by-a').write_text('a')",
        cwd=tmp_path,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    (a,) = json.loads(first.stdout)["job_ids"]
    second = daemon.run(
        "submit", "--json", "--after", str(a), "--", sys.executable, "-c",
        "import pathlib; print(pathlib.Path('made-by-a').read_text())",
        cwd=tmp_path,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    (b,) = json.loads(second.stdout)["job_ids"]
    end = time.monotonic() + 60
    reasons = set()
    while "waiting on writer" not in reasons:
        job = _show(daemon, b)
        assert job["state"] == "queued" and not job["attempts"], job  # A has not ended
        reasons.add(job["reason"])
        assert time.monotonic() < end, reasons
        time.sleep(0.3)
    (tmp_path / "go").write_text("")  # now A writes and ends
    follow = daemon.run("logs", str(b), "-f", timeout=120)
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert _show(daemon, a)["state"] == "succeeded"
    assert follow.stdout.splitlines()[-1] == "a"


def test_at_and_cheap_keep_a_command_back(daemon: Daemon, tmp_path: Path) -> None:
    """`--at` is the spec's begin: the job waits queued, and `jobs` says until when; `--cheap`
    makes it cost_sensitive."""
    later = (datetime.now() + timedelta(hours=2)).replace(second=0, microsecond=0)
    r = daemon.run(
        "submit", "--json", "--at", later.isoformat(), "--cheap", "--name", "later", "--",
        sys.executable, "-c", "print('too soon')",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (job_id,) = json.loads(r.stdout)["job_ids"]
    end = time.monotonic() + 60
    while not (job := _show(daemon, job_id))["reason"]:
        assert time.monotonic() < end, job
        time.sleep(0.3)
    assert job["state"] == "queued" and job["reason"].startswith("not before"), job
    assert later.strftime("%H:%M") in job["reason"]
    (row,) = [j for j in json.loads(daemon.run("jobs", "--json").stdout) if j["id"] == job_id]
    assert row["cost_class"] == "cost_sensitive"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gpus", "-1", "--", "python", "t.py"], "--gpus -1: give a number of GPUs"),
        (["--name", "my job", "--", "python", "t.py"], "--name 'my job': use letters"),
        (["--", "python train.py --lr 1"], "is one argument with spaces"),
        (["--"], "-- CMD: give the command after `--`"),
        (["spec.yaml", "--", "python"], "give a SPEC or a command after `--`, not both"),
        (["--cheap", "--cost", "urgent", "--", "python"], "--cheap and --cost urgent"),
        (["--after", "999", "--", "python", "t.py"], "--after 999: no job 999"),
        (["--at", "25:00", "--", "python", "t.py"], "--at '25:00': write HH:MM"),
        ([], "give one SPEC (a YAML file), or a command after `--`"),
    ],
)
def test_a_bad_option_is_one_line_naming_it(home: Path, args: list[str], says: str) -> None:
    r = nightshift("submit", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in " ".join(r.stderr.split()) and "Traceback" not in r.stderr
    assert nightshift("jobs", "--json").stdout.strip() == "[]"


def test_command_options_with_a_spec_are_refused(home: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, steps=10)
    r = nightshift("submit", str(spec), "--gpus", "1")
    assert r.returncode == 2 and "--gpus is for a plain command" in r.stderr, r.stderr


def test_a_search_section_is_not_silently_ignored(home: Path, tmp_path: Path) -> None:
    """A spec with `search:` is a sweep's: submit says so instead of running the defaults once."""
    spec = write_spec(
        tmp_path, steps=10, search={"lr": {"type": "log_uniform", "low": 1e-4, "high": 0.1}}
    )
    r = nightshift("submit", str(spec))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"nightshift sweep {spec}" in " ".join(r.stderr.split())
    assert nightshift("jobs", "--json").stdout.strip() == "[]"
