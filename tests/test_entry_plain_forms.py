"""The entry point answers the four everyday reads in their plain forms before Typer is imported
(agent/doors/entry.py). Its grammar is a second reading of those commands' arguments, so it is
held to Typer's: every argument list it takes is one Typer parses to the same values, and what it
does not take (help, an option it does not know, a bad value) goes on to Typer."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

from nightshift.agent.doors.cli import app
from nightshift.agent.doors.entry import OPTIONS, plain

# the entry's names → the Typer command's parameter names
PARAM = {"state": "state", "json": "as_json", "config": "config", "job": "job_id"}
PARAM.update(tail="tail", attempt="attempt")

WORDS = st.sampled_from(
    [
        "--state", "--state=failed", "queued", "running", "bogus", "--json", "--config",
        "--config=c.yaml", "c.yaml", "7", "007", "-1", "x", "--tail", "-n", "--tail=3", "0",
        "5001", "12", "--attempt", "--attempt=2", "-f", "--follow", "--help", "--", "--watch",
        "--jso", "-n3", "99999999999999999999",
    ]
)  # fmt: skip


def _typer_values(argv: list[str]) -> dict[str, Any] | None:
    """What Typer parses argv to (its command's parameters), or None when it refuses it."""
    group = typer.main.get_command(app)
    command = group.commands[argv[0]]  # type: ignore[attr-defined]
    try:
        ctx = command.make_context(argv[0], list(argv[1:]))
    except (Exception, SystemExit):
        return None
    return dict(ctx.params)


@settings(max_examples=400, deadline=None)
@given(command=st.sampled_from(sorted(OPTIONS)), words=st.lists(WORDS, max_size=6))
def test_a_plain_form_is_what_typer_parses(command, words):
    argv = [command, *words]
    found = plain(argv)
    if found is None:
        return
    _, got = found
    parsed = _typer_values(argv)
    assert parsed is not None, argv
    for name, value in got.items():
        assert parsed[PARAM[name]] == value, (argv, name)
    # what the entry does not set is Typer's default, and never an option it would act on
    assert not parsed.get("watch") and not parsed.get("follow"), argv
    if command == "show":
        assert not parsed["as_json"], argv  # --json is the model's dump: the full path's


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs", "--help"],
        ["jobs", "--watch"],
        ["jobs", "--state", "bogus"],
        ["show", "1", "--json"],
        ["show"],
        ["logs", "1", "-f"],
        ["logs", "1", "-n", "0"],
        ["logs", "1", "-n3"],
        ["status", "--json", "--json"],
        ["submit", "spec.yaml"],
        [],
    ],
)
def test_anything_else_goes_to_typer(argv):
    assert plain(argv) is None
