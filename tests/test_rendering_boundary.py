"""One rendering boundary (agent/doors/console.py): whatever a user typed, a job's spec or a store row
holds, a log says or a model answered reaches Rich as literal text, never as markup. `[/x]` is
shown as `[/x]` (before: a rich.errors.MarkupError traceback), `[bold]` as `[bold]` (before: eaten
and the rest of the line bold), and an install hint keeps its extra: `pip install
'nightshift[tui]'` (before: `pip install 'nightshift'`). Our own styling still works."""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text
from test_cli_errors import invoke, run_all

from nightshift.agent.doors.console import error, key_values, styled, table
from nightshift.runtime.store.db import Approval, Attempt, Job, utcnow

from conftest import REPO

NAME = "[bold]loud[/bold] job"
REASON = "stuck at [/x] and [red]step[/red] 12"
EVIDENCE = "loss [/] nan \\[escaped] [link=file:///etc]x[/link]"
LOG_LINES = ["[/x] a log line", "[bold]not bold[/bold]", "trailing backslash \\\\"]
HINT = "pip install 'nightshift[tui]'"


def _plain(renderable: object, width: int = 200) -> str:
    c = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    c.print(renderable)
    return c.export_text()


# --- the boundary's own functions -----------------------------------------------------------------
def test_error_prints_its_message_literally_after_a_red_prefix(capsys):
    error(f"{HINT} or {REASON} \\")
    err = capsys.readouterr().err
    assert err == f"error: {HINT} or {REASON} \\\n"


def test_styled_keeps_our_style_and_shows_values_literally():
    t = styled("[bold]job {}[/] {}: [green]{}[/]", 7, NAME, Text("ok", style="italic"))
    assert t.plain == f"job 7 {NAME}: ok"
    bold = [s for s in t.spans if s.style == "bold"]
    assert bold and bold[0].start == 0 and max(s.end for s in bold) == len("job 7")
    # The value inside [green]…[/] keeps its own italic over the template's green.
    at = len(f"job 7 {NAME}: ")
    over = [s.style for s in t.spans if s.start == at]
    assert over == ["green", "italic"]


MARKUPISH = st.lists(
    st.sampled_from(["[", "]", "[/", "\\[", "\\", "\\\\", "[/x]", "[bold]", "[/]", "{}", "x", " "]),
    max_size=10,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(MARKUPISH, MARKUPISH)
def test_styled_never_parses_a_value(a, b):
    """rich.markup.escape loses a backslash before a closing tag (`a\\\\` + `[/]`); styled does
    not escape, it inserts the values after parsing, so any text comes out as it went in."""
    assert styled("[bold]{}[/]\\[{}]", a, b).plain == f"{a}[{b}]"


def test_table_and_key_values_cells_are_literal_unless_ours():
    t = table(
        f"jobs of {NAME}", ["name", "[/x] why"], [[NAME, REASON], [Text("ours", "red"), None]]
    )
    shown = _plain(t)
    assert f"jobs of {NAME}" in shown and NAME in shown and REASON in shown and "[/x] why" in shown
    assert "ours" in shown
    kv = _plain(key_values(f"approval · {NAME}", [("args", EVIDENCE), ("n", 3), ("none", None)]))
    assert f"approval · {NAME}" in kv and EVIDENCE in kv


def test_a_goal_runs_progress_lines_show_model_and_policy_text_literally(capsys):
    """`nightshift run` prints the planner's reason (a model's words), the policy's reasons, an
    observation's error and the final summary: each literally."""
    from nightshift.agent.doors.console import progress_printer

    show = progress_printer()
    show("plan", {"kind": "call", "skill": "show_job", "why": REASON})
    show("verdict", {"verdict": {"decision": "deny", "rule": "[/rule]", "reasons": [NAME]}})
    show("observe", {"status": "error", "error": EVIDENCE, "kind": "call", "skill": "x"})
    show("finish", {"ok": False, "summary": HINT})
    out = capsys.readouterr().out
    for said in (REASON, "[/rule]", NAME, EVIDENCE, HINT):
        assert said in out, (said, out)


# --- the real CLI ---------------------------------------------------------------------------------
def test_a_markup_like_skill_name_is_one_error_line(home, tmp_path):
    """Before: `nightshift skill '[/x]'` printed a MarkupError traceback."""
    results = run_all(
        tmp_path, [["skill", "[/x]"], ["skill", "[bold]x"], ["run", "--resume", "[/x]"]]
    )
    for x, named in zip(results, ["'[/x]'", "'[bold]x'", "'[/x]'"], strict=True):
        assert x["code"] == 2, x
        assert x["err"].startswith("error: no ") and named in x["err"], x


@pytest.fixture
def hostile_job(home):
    """A job whose name, reason, evidence, cause and log say things that look like markup, and a
    pending approval whose arguments, requester and rule do (rows written straight to the store,
    as an older version or another client could have)."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.spec import load_spec

    w = Wiring.load()
    spec = load_spec(REPO / "examples/specs/quickstart.yaml").model_dump(mode="json")
    log = home / "attempt-1.log"
    log.write_text("".join(line + "\n" for line in LOG_LINES))
    with w.store.session() as s:
        job = Job(
            name=NAME, spec=spec, params={"lr": 0.1}, state="failed", owner=w.user, reason=REASON
        )
        s.add(job)
        s.commit()
        s.refresh(job)
        t0 = utcnow() - timedelta(hours=1)
        s.add(
            Attempt(
                job_id=job.id,
                number=1,
                state="exited",
                outcome="failed",
                params={"lr": 0.1},
                argv=["python", "train.py"],
                start_step=0,
                last_step=12,
                log_path=str(log),
                exit_code=1,
                evidence=EVIDENCE,
                cause="[/cause]",
                started_at=t0,
                ended_at=t0 + timedelta(minutes=5),
            )
        )
        s.add(
            Approval(
                call_id="c-hostile",
                skill="cancel_job",
                args={"job_id": job.id, "reason": REASON},
                requester="[bold]someone",
                rule="[/rule]",
                expires_at=utcnow() + timedelta(hours=1),
            )
        )
        s.commit()
        return job.id


def test_jobs_show_logs_status_report_print_store_rows_literally(hostile_job, tmp_path):
    """Before: `jobs`, `status` and `show` raised MarkupError on the reason's `[/x]`, `logs`
    printed the lines but `report` ate `[bold]` and `[red]`."""
    j = str(hostile_job)
    commands = [
        ["jobs"],
        ["status"],
        ["show", j],
        ["logs", j],
        ["report"],
        ["approvals", "list"],
        ["approvals", "show", "1"],
        ["skill", "list_jobs", "--arg", 'states=["[/x]"]'],  # its arguments are audited
        ["audit", "show", "--limit", "5"],
    ]
    results = run_all(tmp_path, commands)
    by = {" ".join(x["argv"][:2]): x for x in results}
    for x in results:
        assert x["code"] == 0, x
    for cmd in ("jobs", "status", "show " + j, "report"):
        assert NAME in by[cmd]["out"] and REASON in by[cmd]["out"], by[cmd]
    assert EVIDENCE in by["show " + j]["out"] and "[/cause]" in by["show " + j]["out"]
    assert by["logs " + j]["out"].splitlines() == LOG_LINES
    assert (
        "[/rule]" in by["approvals list"]["out"] and "[bold]someone" in by["approvals list"]["out"]
    )
    shown = by["approvals show"]["out"]
    assert "[/rule]" in shown and "[bold]someone" in shown and "[/x]" in shown
    assert "[/x]" in by["audit show"]["out"], by["audit show"]


def _blocked(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment in which importing these modules fails, as where they are not installed."""
    import os

    folder = tmp_path / "blocked"
    for m in modules:
        (folder / m).mkdir(parents=True)
        (folder / m / "__init__.py").write_text("raise ImportError('not installed here')\n")
    return {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def test_install_hints_keep_their_extra(home, tmp_path):
    """Before: `pip install 'nightshift'` — the `[tui]`, `[sweeps]` or `[report]` read as a tag."""
    env = _blocked(tmp_path, "textual", "optuna", "matplotlib")
    md = tmp_path / "night.md"
    results = run_all(
        tmp_path,
        [
            ["chat"],
            ["sweep", str(REPO / "examples/specs/sweep_numpy.yaml")],
            ["report", "--markdown", str(md)],
        ],
        env=env,
    )
    chat, sweep, report = results
    assert chat["code"] == 5 and "pip install 'nightshift[tui]'" in chat["err"], chat
    assert sweep["code"] == 5 and "pip install 'nightshift[sweeps]'" in sweep["err"], sweep
    assert report["code"] == 0 and "pip install 'nightshift[report]'" in report["out"], report


# --- fuzzing the free-text arguments, in this process (a subprocess each would take minutes) ---
SPEC = str(REPO / "examples/specs/quickstart.yaml")
FREE_TEXT = [
    lambda s: ["skill", s],
    lambda s: ["skill", "list_jobs", "--arg", f"limit={s}"],
    lambda s: ["skill", "show_job", "--arg", f"job_id={s}"],
    lambda s: ["submit", SPEC, "--param", f"lr={s}", "--json"],
    lambda s: ["jobs", "--state", s],
    lambda s: ["show", s],
    lambda s: ["diagnose", s],
    lambda s: ["validate", s],
    lambda s: ["tune-lr", s],
    lambda s: ["tune-lr", SPEC, "--mode", s],
    lambda s: ["sweep-stop", s],
    lambda s: ["report", "--sweep", s],
    lambda s: ["run", "--resume", s],
    lambda s: ["cancel", "1", "--reason", s],
]
FUZZ = st.one_of(
    MARKUPISH,
    st.text(alphabet="[]/\\ab =:{}*&,'\"", max_size=16),
)


@pytest.mark.parametrize("command", FREE_TEXT, ids=[" ".join(f("S")[:3]) for f in FREE_TEXT])
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=FUZZ)
def test_markup_like_arguments_never_make_a_traceback(home, command, text):
    argv = command(text)
    code, out, err, tb = invoke(argv)
    assert tb is None, (argv, tb)
    assert code in (0, 1, 2, 3, 4, 5), (argv, code, out, err)
    assert "Traceback" not in out + err, (argv, out, err)
