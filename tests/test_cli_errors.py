"""Every command, given a config file that does not exist, answers with one error line naming it
and exit code 5, the operator's (health: 3, its UNKNOWN in the Nagios convention its exit codes
follow); none prints a traceback and none touches the store."""

from __future__ import annotations

import pytest

from conftest import REPO, nightshift

COMMANDS = [
    ["run", str(REPO / "examples/goals/quickstart.yaml")], ["skill", "list_jobs"],
    ["submit", str(REPO / "examples/specs/quickstart.yaml")], ["daemon", "--max-ticks", "1"],
    ["jobs"], ["status"], ["show", "1"], ["logs", "1"], ["cancel", "1"], ["retry", "1"],
    ["approve", "1"], ["reject", "1"], ["pause"], ["resume"], ["report"], ["approvals", "list"],
    ["audit", "verify"], ["audit", "show"], ["config", "show"], ["health"],
    ["validate", str(REPO / "examples/specs/quickstart.yaml")],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a[:2]).replace(str(REPO) + "/", "")
                                               for a in COMMANDS])
def test_a_missing_config_file_is_one_line_and_exit_5(argv, home):
    r = nightshift(*argv, "--config", "/nonexistent/nightshift.yaml", timeout=60)
    assert r.returncode == (3 if argv[0] == "health" else 5), (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == [
        "error: --config /nonexistent/nightshift.yaml: file not found"], r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert not (home / "nightshift.db").exists()
