"""A new user's first week, the small things (issue 28): the first install brings what the
everyday commands use, an install hint names its extra, `--version` and shell completion exist,
`config show` leaves no value blank, a typo in a goal's params stops before anything runs, Ctrl-C
in `nightshift run` says what it leaves running, and the daemon's log says what it serves and
when each attempt starts and ends. Each drives the real CLI, as a user would."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from conftest import REPO, nightshift, store_row, write_spec

README = (REPO / "README.md").read_text(encoding="utf-8")
NIGHTSHIFT = Path(sys.executable).parent / "nightshift"  # the installed script, as a shell runs it


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_first_install_brings_what_the_everyday_commands_import():
    """README's first command installs the package with the extras it names; that must bring the
    libraries `chat` (Textual, and openai for free text), `report` (matplotlib) and `sweep`
    (Optuna) import, and scikit-learn for the quickstart itself."""
    first = next(line for line in README.splitlines() if "nightshift run examples/goals" in line)
    extras = re.search(r"pip install -e '\.\[([\w,]+)\]'", first)
    assert extras is not None, first
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    installed = _requirement_names(project["dependencies"])
    for extra in extras.group(1).split(","):
        installed |= _requirement_names(project["optional-dependencies"][extra])
    assert {"textual", "openai", "matplotlib", "optuna", "scikit-learn"} <= installed


def test_every_install_hint_names_an_extra_of_nightshift():
    """A hint printed for a missing library says `pip install 'nightshift[EXTRA]'` with an extra
    that exists, so it installs a version nightshift was tested with (not `ray[default]`)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    hints = []
    for folder in ("agent", "runtime", "skills", "evals"):
        for path in (REPO / folder).rglob("*.py"):
            for hint in re.findall(r"pip install '([^']+)'", path.read_text(encoding="utf-8")):
                hints.append((path.relative_to(REPO), hint))
    assert hints
    for path, hint in hints:
        named = re.fullmatch(r"nightshift\[(\w+)\]", hint)
        assert named is not None and named.group(1) in extras, f"{path}: pip install '{hint}'"


def test_a_missing_model_client_is_named_with_its_extra(home, tmp_path):
    """With a model endpoint configured but no openai package, free text in the chat says which
    extra to install, the `[llm]` literally there (not eaten as markup), with exit 5 — not an
    internal error."""
    fake = tmp_path / "no_openai" / "openai"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('openai is not installed here')\n")
    paths = [str(fake.parent), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    r = nightshift(
        "chat",
        "--once",
        "how are my jobs doing tonight",
        env={
            "PYTHONPATH": os.pathsep.join(p for p in paths if p),
            "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
            "NIGHTSHIFT_MODEL": "m",
        },
    )
    assert r.returncode == 5, r.stdout + r.stderr
    assert "pip install 'nightshift[llm]'" in r.stdout + r.stderr
    assert "internal error" not in r.stdout + r.stderr


def test_version_prints_the_installed_version():
    """`nightshift --version` prints what pip installed, and exits 0."""
    r = subprocess.run([NIGHTSHIFT, "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"nightshift {version('nightshift')}"


def test_shell_completion_is_offered_and_completes(home):
    """`--show-completion bash` prints the script `--install-completion` installs, and the
    script's request completes a command name and a command's options."""
    r = subprocess.run(
        [NIGHTSHIFT, "--show-completion", "bash"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert "_NIGHTSHIFT_COMPLETE=complete_bash" in r.stdout
    assert "--install-completion" in nightshift("--help").stdout

    def complete(words: str, cword: int) -> list[str]:
        env = {
            **os.environ,
            "_NIGHTSHIFT_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(cword),
        }
        done = subprocess.run([NIGHTSHIFT], capture_output=True, text=True, env=env, timeout=60)
        return done.stdout.split()

    assert complete("nightshift jo", 1) == ["jobs"]
    assert "--follow" in complete("nightshift logs --", 2)


def _config_rows(out: str) -> dict[str, str]:
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 3 and cells[0]:
            rows[cells[0]] = cells[1]
    return rows


def test_config_show_prints_the_computed_values_and_masks_secrets(home):
    """The store URL, socket, runs folder, audit key file and home are shown as used, never blank;
    a password in the store URL and a token are masked, in the table and in --json."""
    env = {
        "COLUMNS": "250",
        "NIGHTSHIFT_STORE__URL": "postgresql+psycopg://ann:hunter2@127.0.0.1:5432/ns",
        "OPENAI_API_KEY": "sk-very-secret",
    }
    r = nightshift("config", "show", env=env)
    assert r.returncode == 0, r.stderr
    rows = _config_rows(r.stdout)
    assert rows["home"] == str(home)
    assert rows["store.url"] == "postgresql+psycopg://ann:***@127.0.0.1:5432/ns"
    assert rows["api.socket"] == str(home / "api.sock")
    assert rows["executor.runs_dir"] == str(home / "runs")
    assert rows["audit.key_file"] == str(home / "keys" / "audit.key")
    assert rows["loop.node"]
    assert all(value for value in rows.values()), [k for k, v in rows.items() if not v]
    assert "hunter2" not in r.stdout and "sk-very-secret" not in r.stdout

    r = nightshift("config", "show", "--json", env=env)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["api.socket"] == {
        "value": str(home / "api.sock"),
        "from": "default: $NIGHTSHIFT_HOME/api.sock",
    }
    assert "hunter2" not in r.stdout and "sk-very-secret" not in r.stdout


def test_a_goal_param_the_spec_lacks_stops_before_anything_runs(home, tmp_path):
    """`params: {lrr: …}` on the quickstart spec (whose parameter is `lr`) exits 2 naming the
    field, its line and the fix, before the health check or any store is opened."""
    spec = write_spec(tmp_path, steps=50)
    goal = tmp_path / "goal.yaml"
    goal.write_text(f"name: typo\ngoal: train\nspec: {spec}\nparams:\n  lr: 0.01\n  lrr: 0.005\n")
    r = nightshift("run", str(goal))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{goal}:6: field 'params.lrr'" in r.stderr
    assert "did you mean 'lr'?" in r.stderr
    assert "gpu_health_check" not in r.stdout
    assert not (home / "nightshift.db").exists()  # no store, so no audit record of anything


def test_ctrl_c_in_run_says_what_keeps_running_and_how_to_stop_it(home, tmp_path):
    """SIGINT to `nightshift run` once its job runs: exit 130, no traceback, and the job it leaves
    running named with the commands to cancel or follow it; the job is indeed still running."""
    spec = write_spec(tmp_path, steps=10_000_000, name="long")
    goal = tmp_path / "goal.yaml"
    goal.write_text(f"name: long\ngoal: train\nspec: {spec}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "run", str(goal)],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    db = home / "nightshift.db"
    try:
        store_row(db, "select id from attempt where state = 'running'", proc=proc)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, out
        assert "Traceback" not in out
        assert re.search(r"job 1 \(long\) keeps running \(attempt 1 under the local executor", out)
        assert "`nightshift cancel 1` to stop it, `nightshift logs 1 -f` to follow it" in out
        assert "nightshift run --resume long-" in out
        state = sqlite3.connect(db).execute("select state from job where id = 1").fetchone()
        assert state == ("running",)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        nightshift("cancel", "1", "--yes")


@pytest.mark.slow
def test_the_daemon_log_says_what_it_serves_and_each_attempt(home, tmp_path):
    """At start, a line each for home, store, socket, executor, policy file and whose account
    jobs run as; then a line when job 1's attempt starts and one when it ends."""
    res = nightshift("submit", str(write_spec(tmp_path, steps=30, name="short")), "--json")
    assert res.returncode == 0, res.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "nightshift.agent.doors.cli", "daemon"],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "300"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        store_row(home / "nightshift.db", "select id from job where state = 'succeeded'", proc=proc)
        store_row(  # the attempt lines come after the tick that recorded the end
            home / "nightshift.db", "select id from attempt where state = 'exited'", proc=proc
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    lines = out.splitlines()
    assert f"home: {home}" in lines
    assert f"store: sqlite:///{home / 'nightshift.db'}" in lines
    assert any(line.startswith(f"socket: {home / 'api.sock'}") for line in lines)
    assert f"executor: local, runs in {home / 'runs'}" in lines
    assert "policy file: the shipped default (policies/default.yaml)" in lines
    assert any(line.startswith("jobs run as this daemon's user") for line in lines), out
    # Each attempt's line says when, in local time: a log kept in a file says it too.
    timed = [line[11:] for line in lines if re.match(r"\[\d\d:\d\d:\d\d\] job ", line)]
    assert "job 1 (short) attempt 1 started: local executor, no GPU" in timed, out
    assert "job 1 (short) attempt 1 ended: succeeded (exit 0, last step 30)" in timed, out


def test_the_daemons_line_for_a_failed_attempt_says_why():
    """The operator reading the daemon's log sees why an attempt failed, not only its exit code."""
    from datetime import datetime

    from nightshift.agent.doors.daemon_log import _ended
    from nightshift.runtime.store.db import Attempt

    att = Attempt(
        job_id=3,
        number=1,
        state="exited",
        outcome="failed",
        exit_code=1,
        ended_at=datetime(2026, 12, 5, 3, 0),
        diagnosis={
            "category": "import_or_env",
            "evidence": "ModuleNotFoundError: No module named 'torch'",
            "summary": "a Python package is missing",
            "confidence": "high",
            "retryable": False,
            "line_no": 4,
            "action": "stop",
            "fix": "fix the environment, then resubmit",
        },
    )
    line = _ended(att, "train")
    assert re.fullmatch(
        r"\[\d\d:\d\d:\d\d\] job 3 \(train\) attempt 1 ended: failed \(exit 1\) — "
        r"import_or_env: ModuleNotFoundError: No module named 'torch'",
        line,
    ), line
