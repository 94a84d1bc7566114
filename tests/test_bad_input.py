"""Bad input gets one clear error naming the field (and line) and exit code 2, and nothing already
stored is lost or half-written."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from conftest import REPO, nightshift, use_home


@pytest.fixture(scope="module")
def stored_home(tmp_path_factory) -> Path:
    """A home with one job and some audit events in it, made once for the module by the real CLI
    (`skill submit_job`) in the environment `home` sets up; nothing in it names the folder it
    was made in, so each test's copy is that store."""
    made = tmp_path_factory.mktemp("stored") / "home"
    made.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        use_home(mp, made)
        res = nightshift(
            "skill", "submit_job", "--arg", f"spec_path={REPO / 'examples/specs/quickstart.yaml'}"
        )
    assert res.returncode == 0, res.stdout + res.stderr
    return made


@pytest.fixture
def stored(home, stored_home):
    """A store with one job and some audit events already in it: each test's own copy of the
    module's (its key and audit anchor too), so what one test does never reaches another."""
    shutil.copytree(stored_home, home, dirs_exist_ok=True)
    return home / "nightshift.db"


def snapshot(db):
    con = sqlite3.connect(db)
    return (
        con.execute("select id, state, params from job").fetchall(),
        con.execute("select count(*) from auditevent where action like 'job.%'").fetchone(),
    )


def assert_untouched(db, before):
    assert snapshot(db) == before
    assert nightshift("audit", "verify").returncode == 0


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_malformed_goal_yaml_names_the_line(stored, tmp_path):
    """A YAML syntax error points at its line."""
    before = snapshot(stored)
    goal = write(tmp_path, "g.yaml", "name: x\ngoal: train\nspec: [unclosed\n")
    res = nightshift("run", str(goal))
    assert res.returncode == 2
    assert "g.yaml:" in res.stderr and "not valid YAML" in res.stderr
    assert_untouched(stored, before)


def test_goal_with_unknown_field_names_field_and_line(stored, tmp_path):
    """A misspelt key is named with its line, not silently ignored."""
    before = snapshot(stored)
    goal = write(tmp_path, "g.yaml", "name: x\ngoal: train\nspec: s.yaml\nretires: 3\n")
    write(tmp_path, "s.yaml", "name: s\ncommand: [python, t.py]\n")
    res = nightshift("run", str(goal))
    assert res.returncode == 2
    assert "g.yaml:4" in res.stderr and "retires" in res.stderr
    assert_untouched(stored, before)


def test_goal_naming_a_missing_spec_file(stored, tmp_path):
    """A spec path that does not exist is named, relative to the goal file."""
    goal = write(tmp_path, "g.yaml", "name: x\ngoal: train\nspec: nowhere.yaml\n")
    res = nightshift("run", str(goal))
    assert res.returncode == 2 and "nowhere.yaml" in res.stderr and "'spec'" in res.stderr


def test_unknown_skill(stored):
    """An unknown skill name lists the ones that exist."""
    before = snapshot(stored)
    res = nightshift("skill", "delete_everything")
    assert res.returncode == 2
    assert "no skill named 'delete_everything'" in res.stderr and "cancel_job" in res.stderr
    assert_untouched(stored, before)


def test_arguments_failing_the_input_model(stored):
    """Arguments that fail the skill's input model name the field; nothing runs."""
    before = snapshot(stored)
    res = nightshift("skill", "cancel_job", "--arg", "job_id=abc")
    assert res.returncode == 2 and "job_id" in res.stderr
    assert_untouched(stored, before)


def test_goal_step_with_bad_arguments_exits_2(stored, tmp_path):
    """The same through a goal file: the step's error is reported and the run exits 2."""
    before = snapshot(stored)
    goal = write(
        tmp_path,
        "g.yaml",
        yaml.safe_dump({"name": "x", "steps": [{"skill": "list_jobs", "args": {"limit": "many"}}]}),
    )
    res = nightshift("run", str(goal))
    assert res.returncode == 2 and "limit" in res.stdout
    assert_untouched(stored, before)


def test_checkpoint_dir_that_cannot_be_written(stored, tmp_path):
    """A checkpoint folder nobody can write is refused at submit, naming checkpoint.dir (a file
    stands where its parent folder should be: root cannot write there either; a folder outside
    the policy's roots, such as /proc, is denied by the policy: test_paths_confined)."""
    before = snapshot(stored)
    spec = yaml.safe_load((REPO / "examples/specs/quickstart.yaml").read_text())
    spec["code"]["path"] = str(REPO / "examples")
    write(tmp_path, "blocker", "a file, not a folder")
    spec["checkpoint"]["dir"] = str(tmp_path / "blocker" / "ckpt")
    path = write(tmp_path, "s.yaml", yaml.safe_dump(spec))
    res = nightshift("skill", "submit_job", "--arg", f"spec_path={path}")
    assert res.returncode == 2
    assert "checkpoint.dir" in res.stderr and "blocker" in res.stderr
    assert_untouched(stored, before)


def test_missing_training_script_is_caught_before_launch(stored, tmp_path):
    """A command naming a script that does not exist fails validation, before anything launches."""
    before = snapshot(stored)
    spec = yaml.safe_load((REPO / "examples/specs/quickstart.yaml").read_text())
    spec["code"]["path"] = str(REPO / "examples")
    spec["command"][1] = "trian_numpy.py"
    spec_path = write(tmp_path, "s.yaml", yaml.safe_dump(spec))
    goal = write(tmp_path, "g.yaml", f"name: x\ngoal: train\nspec: {spec_path}\n")
    res = nightshift("run", str(goal))
    assert res.returncode == 2
    assert "trian_numpy.py" in res.stdout and "command" in res.stdout
    assert_untouched(stored, before)


def test_store_locked_by_another_process(stored, tmp_path):
    """A store another process keeps locked gives a clear error after the busy timeout, not a hang
    or a traceback, and the submission is not half-written."""
    import subprocess
    import sys
    import time

    before = snapshot(stored)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                f"import sqlite3, time; c = sqlite3.connect(r'{stored}', isolation_level=None); "
                "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(30)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        start = time.monotonic()
        res = nightshift(
            "skill",
            "submit_job",
            "--arg",
            f"spec_path={REPO / 'examples/specs/quickstart.yaml'}",
            env={"NIGHTSHIFT_STORE__BUSY_TIMEOUT_S": "1"},
        )
        assert time.monotonic() - start < 20
    finally:
        holder.kill()
        holder.wait()
    assert res.returncode == 5, res.stdout + res.stderr  # the operator's to fix, not bad input
    assert "locked by another process" in res.stderr
    assert_untouched(stored, before)


def test_job_whose_script_vanished(home, tmp_path):
    """A script deleted after submit: the attempt fails, is diagnosed file_missing, not retried."""
    import shutil
    import sqlite3

    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(REPO / "examples" / "train_numpy.py", code / "train_numpy.py")
    spec = yaml.safe_load((REPO / "examples/specs/quickstart.yaml").read_text())
    spec["code"]["path"] = str(code)
    spec["environment"]["env"] = {}
    path = write(tmp_path, "s.yaml", yaml.safe_dump(spec))
    assert nightshift("submit", str(path)).returncode == 0
    (code / "train_numpy.py").unlink()
    assert nightshift("daemon", "--max-ticks", "30").returncode == 0
    con = sqlite3.connect(home / "nightshift.db")
    assert con.execute("select state from job").fetchone()[0] == "failed"
    assert con.execute("select count(*), max(cause) from attempt").fetchone() == (1, "file_missing")
