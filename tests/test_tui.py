"""`nightshift chat`'s Textual app driven by Pilot, as a person would use it: a goal's tool cards,
an approval in the modal and the job it starts, the k9s-style job keys, an approval decided
elsewhere vanishing, the theme toggle and the command palette; and snapshots of the main screens
(a fixed clock, a declared GPU inventory, fixed jobs), kept in tests/__snapshots__/."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from textual.binding import Binding
from textual.command import CommandList
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Log

from nightshift.agent.brain.planner import Call, Finish
from nightshift.agent.brain.wiring import Wiring, local_now
from nightshift.agent.doors.tui import ChatApp
from nightshift.agent.doors.tui.screens import (
    ApprovalModal,
    AuditScreen,
    ConfirmModal,
    JobScreen,
    KeysScreen,
)
from nightshift.agent.doors.tui.widgets import ChatLog, GpuTable, JobsTable, ToolCardView
from nightshift.runtime.errors import ApprovalRequired
from nightshift.runtime.spec import load_spec
from nightshift.runtime.store.db import Attempt, Job, JobHold, MetricPoint

from conftest import REPO, write_spec

SIZE = (140, 40)
SMALL = (80, 24)
LARGE = (160, 48)
LONG_NAME = "llama3-8b-instruct-lora-r64-lr3e-4-seq4k"
LONG_WHY = "exited with code 1: ModuleNotFoundError: No module named 'torch'"
FIXED = datetime(2026, 12, 2, 3, 0)
INVENTORY = """\
gpus:
  - {name: NVIDIA H100 80GB HBM3, uuid: GPU-0, memory_total_mib: 81559, memory_used_mib: 62464,
     utilization_pct: 97, temperature_c: 71, power_w: 612, power_limit_w: 700}
  - {name: NVIDIA H100 80GB HBM3, uuid: GPU-1, memory_total_mib: 81559, memory_used_mib: 1024,
     utilization_pct: 0, temperature_c: 34, power_w: 71, power_limit_w: 700}
  - {name: NVIDIA H100 80GB HBM3, uuid: GPU-2, memory_total_mib: 81559, memory_used_mib: 80500,
     utilization_pct: 100, temperature_c: 86, power_w: 690, power_limit_w: 700}
"""


@pytest.fixture
def tui_home(home, monkeypatch) -> Path:
    """A home with a declared GPU inventory, no model endpoint, and the user called alice."""
    (home / "inv.yaml").write_text(INVENTORY)
    monkeypatch.setenv("NIGHTSHIFT_GPU__PROBE", "inventory")
    monkeypatch.setenv("NIGHTSHIFT_GPU__INVENTORY", "inv.yaml")
    monkeypatch.setattr("nightshift.agent.brain.wiring.os_user_name", lambda uid: "alice")
    return home


@pytest.fixture
def fixed_clock(monkeypatch) -> Callable[[], datetime]:
    """Every clock the screens show reads 2026-12-02 03:00 UTC."""
    monkeypatch.setattr("nightshift.agent.brain.wiring.local_now", lambda: FIXED)
    return lambda: FIXED


def run(app: ChatApp, test: Callable[[Pilot], Any], size: tuple[int, int] = SIZE) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await test(pilot)

    asyncio.run(main())


async def until(pilot: Pilot, cond: Callable[[], Any], timeout: float = 60.0, what: str = ""):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what or cond}")
        await pilot.pause(0.05)


async def say(pilot: Pilot, text: str) -> None:
    prompt = pilot.app.query_one("#prompt", Input)
    prompt.focus()
    prompt.value = text
    await pilot.press("enter")


def card_titles(app: ChatApp) -> list[str]:
    return [str(c._title.label) for c in app.query(ToolCardView)]


def answers(app: ChatApp) -> list[str]:
    return [str(s.render()) for s in app.query(".answer")]


class Scripted:
    """Preset actions, as a model's parsed tool calls would be."""

    name = "scripted"

    def __init__(self, script: list[Callable[[list], Any]]):
        self.script = script
        self.on_step: Callable[[dict], None] = lambda step: None

    def next(self, goal, history):
        self.on_step({"prompt_tokens": 120, "completion_tokens": 8, "latency_s": 0.4})
        if len(history) >= len(self.script):
            return Finish(ok=True, summary="done: " + ", ".join(o.skill for o in history))
        return self.script[len(history)](history)


def policy_with_launch_approval(home: Path, monkeypatch) -> None:
    """The shipped policy plus a rule: submit_job needs an approval (so the agent's submit asks)."""
    policy = yaml.safe_load((REPO / "policies" / "default.yaml").read_text())
    policy["approvals"].append({"id": "launch-needs-approval", "skills": ["submit_job"]})
    (home / "policy.yaml").write_text(yaml.safe_dump(policy))
    monkeypatch.setenv("NIGHTSHIFT_POLICY__FILE", str(home / "policy.yaml"))


# ------------------------------------------------------------------------------------ fixed data
def seed(w: Wiring, tmp_path: Path) -> dict[str, int]:
    """Four jobs with attempts, metrics and a log, stored as the loop would have left them, at
    fixed times (no process runs)."""
    spec = load_spec(write_spec(tmp_path, steps=2000)).model_dump(mode="json")
    t0 = datetime(2026, 12, 2, 1, 0)
    log = tmp_path / "job-1-attempt-2.log"
    log.write_text(
        "step 1800 loss 0.4121\nstep 1850 loss 0.3987\nstep 1900 loss nan\n"
        "RuntimeError: loss is nan at step 1900\n"
    )
    ids: dict[str, int] = {}
    with w.store.session() as s:
        for name, state, reason, hold in (
            ("resnet50-imagenet", "failed", "failed 2 time(s); retries exhausted", None),
            ("bert-finetune", "running", None, None),
            ("sweep-lr-0.003", "queued", None, "waiting for the valley tariff window (23:00)"),
            ("gpt2-small", "succeeded", "early stopped: no improvement in 5 evals", None),
        ):
            job = Job(
                name=name,
                spec=spec,
                state=state,
                owner="alice",
                reason=reason,
                max_attempts=2,
                created_at=t0,
                updated_at=t0,
            )
            s.add(job)
            s.flush()
            ids[name] = job.id
            if hold is not None:
                s.add(JobHold(job_id=job.id, reason=hold))
        attempts = [
            ("resnet50-imagenet", 1, "exited", "failed", 0, 1400, 1, "cuda_oom", None),
            ("resnet50-imagenet", 2, "exited", "diverged", 1250, 1900, None, "nan_loss", str(log)),
            ("bert-finetune", 1, "running", None, 0, 620, None, None, None),
            ("gpt2-small", 1, "exited", "succeeded", 0, 900, 0, None, None),
        ]
        for i, (name, number, st, outcome, start, last, code, cause, log_path) in enumerate(
            attempts
        ):
            att = Attempt(
                job_id=ids[name],
                number=number,
                state=st,
                outcome=outcome,
                start_step=start,
                last_step=last,
                exit_code=code,
                cause=cause,
                log_path=log_path,
                evidence="metrics diverged: loss is nan at step 1900"
                if cause == "nan_loss"
                else None,
                started_at=t0 + timedelta(minutes=10 * i),
                ended_at=None if st == "running" else t0 + timedelta(minutes=10 * i + 8),
            )
            s.add(att)
            s.flush()
            for k in range(24):
                step = start + k * max(1, (last - start) // 24)
                value = 2.0 * 0.9**k + 0.05 * (k % 3)
                if outcome == "diverged" and k == 23:
                    value = float("nan")
                s.add(
                    MetricPoint(
                        attempt_id=att.id, job_id=ids[name], step=step, name="loss", value=value
                    )
                )
    return ids


def agent_approval(w: Wiring, job_id: int) -> int:
    """A pending approval for the agent's cancel of a job, as the graph's call would open it."""
    try:
        w.gate.call(
            w.context("agent", "snap-cancel"), "cancel_job", {"job_id": job_id}, via="agent"
        )
    except ApprovalRequired as exc:
        return exc.approval_id
    raise AssertionError("cancel_job ran without an approval")


def wiring(clock: Callable[[], datetime] | None = None) -> Wiring:
    w = Wiring.load()
    if clock is not None:
        w.audit.clock = clock
    return w


# ------------------------------------------------------------------------------------ Pilot
@pytest.mark.slow
def test_goal_cards_approve_in_modal_and_the_job_starts(tui_home, tmp_path, monkeypatch):
    """Type a goal; the agent's calls appear as cards; its submit needs an approval, which pops
    up as a modal with the whole request; approving it runs the submit once, and this chat's
    loop starts the job and runs it to the end while the screen stays live."""
    policy_with_launch_approval(tui_home, monkeypatch)
    spec = write_spec(tmp_path, steps=30)
    planner = Scripted(
        [
            lambda h: Call(skill="gpu_health_check", args={}),
            lambda h: Call(skill="submit_job", args={"spec_path": str(spec)}),
        ]
    )
    w = wiring()

    def factory(on_step):
        planner.on_step = on_step
        return planner

    app = ChatApp(w, planner_factory=factory, refresh_s=0.2, approvals_poll_s=0.2)

    async def test(pilot: Pilot) -> None:
        await say(pilot, "train the quickstart tonight")
        await until(pilot, lambda: isinstance(app.screen, ApprovalModal), what="the modal")
        modal = app.screen
        assert isinstance(modal, ApprovalModal)
        text = str(modal.query_one("#request").render())
        for needle in (
            "action     submit_job",
            "requester  agent",
            "launch-needs-approval",
            "0 of 1 approved",
            "expires",
            str(spec),
        ):
            assert needle in text, needle
        titles = card_titles(app)
        assert titles[0].startswith("✓ agent: gpu_health_check {}")
        assert titles[1].startswith("? agent: submit_job") and "needs_approval" in titles[1]
        assert w.store.job(1) is None  # nothing ran before the approval
        await pilot.press("a")
        await until(pilot, lambda: w.store.job(1) is not None, what="the submit")
        await until(
            pilot,
            lambda: w.store.job(1).state == "succeeded" and answers(app)[-1].startswith("done"),
            what="the run",
        )
        table = app.query_one(JobsTable)
        await until(pilot, lambda: str(table.get_cell("1", "state")) == "succeeded")
        assert any(t.startswith("✓ agent: submit_job") for t in card_titles(app))
        votes = w.audit.events(action="approval.vote")
        assert [(e.actor, e.payload["approve"]) for e in votes] == [("alice", True)]
        stats = [str(s.render()) for s in app.query(".stats")]
        assert stats[0] == "model step 1: 120 in / 8 out tokens · 0.40 s"
        assert stats[-1] == "model: 3 step(s) · 360 in / 24 out tokens · 1.20 s"

    run(app, test)


def test_reject_in_modal_with_a_reason(tui_home, tmp_path):
    """Rejecting in the modal with a reason stops the agent's cancel; the reason is audited."""
    w = wiring()
    job = w.gate.call(
        w.context("alice"), "submit_job", {"spec_path": str(write_spec(tmp_path, steps=30))}
    )
    planner = Scripted([lambda h: Call(skill="cancel_job", args={"job_id": job.job_id})])
    app = ChatApp(w, planner_factory=lambda on_step: planner, run_loop=False, approvals_poll_s=0.2)

    async def test(pilot: Pilot) -> None:
        await say(pilot, "tidy up the queue")
        await until(pilot, lambda: isinstance(app.screen, ApprovalModal), what="the modal")
        await pilot.click("#reason")
        await pilot.press(*"keep it")
        await pilot.click("#reject")
        await until(pilot, lambda: any("rejected" in t for t in card_titles(app)))
        await until(pilot, lambda: bool(w.audit.events(action="approval.reason")))
        (reason,) = w.audit.events(action="approval.reason")
        assert reason.payload["reason"] == "keep it" and not reason.payload["approve"]
        assert w.store.job(job.job_id).state == "queued"
        assert not isinstance(app.screen, ApprovalModal)

    run(app, test)


def test_job_view_keys(tui_home, tmp_path):
    """k9s style on the jobs table: s shows attempts and causes, l follows the log as it grows,
    r retries a failed job, c on a queued job asks in a modal and cancels on y, p on a job that
    is not running says so; each change is a gated call shown as a card."""
    w = wiring()
    ids = seed(w, tmp_path)
    failed, queued = ids["resnet50-imagenet"], ids["sweep-lr-0.003"]
    app = ChatApp(w, live=False, run_loop=False)

    async def test(pilot: Pilot) -> None:
        table = app.query_one(JobsTable)
        await pilot.press("f4")
        assert app.focused is table
        table.move_cursor(row=table.get_row_index(str(failed)))
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, JobScreen))
        attempts = app.screen.query_one("#attempts", DataTable)
        await until(pilot, lambda: attempts.row_count == 2, what="the attempts")
        assert "nan_loss" in str(attempts.get_row_at(1)[5])
        await pilot.press("l")
        log = app.screen.query_one("#logs", Log)
        await until(pilot, lambda: any("loss nan" in line for line in log.lines), what="the log")
        path = Path(w.store.attempts(failed)[-1].log_path)
        with path.open("a") as f:
            f.write("a line written after the view opened\n")
        await until(pilot, lambda: "a line written after the view opened" in log.lines)
        await pilot.press("escape")
        assert not isinstance(app.screen, JobScreen)

        await pilot.press("f4", "r")
        await until(pilot, lambda: w.store.job(failed).state == "queued", what="the retry")
        table.move_cursor(row=table.get_row_index(str(queued)))
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the confirmation")
        assert w.store.job(queued).state == "queued"
        await pilot.press("y")
        await until(pilot, lambda: w.store.job(queued).state == "cancelled", what="the cancel")
        await pilot.press("f4", "p")
        await until(
            pilot, lambda: any("only a queued or running job pauses" in a for a in answers(app))
        )
        skills = [t.split(" ")[1] for t in card_titles(app)]
        assert skills == ["retry_job", "cancel_job", "pause_job"]

    run(app, test)


def test_approval_decided_elsewhere_disappears(tui_home, tmp_path):
    """A pending approval pops up; decided in another shell, its modal closes by itself."""
    w = wiring()
    ids = seed(w, tmp_path)
    approval_id = agent_approval(w, ids["sweep-lr-0.003"])
    app = ChatApp(w, run_loop=False, refresh_s=5, approvals_poll_s=0.1)

    async def test(pilot: Pilot) -> None:
        await until(pilot, lambda: isinstance(app.screen, ApprovalModal), what="the modal")
        assert app.screen.approval_id == approval_id and app.pending_approvals == [approval_id]
        w.approvals.vote(approval_id, "bob", False, local_now())
        await until(pilot, lambda: not isinstance(app.screen, ApprovalModal), what="it to close")
        await until(pilot, lambda: app.pending_approvals == [])
        assert w.store.job(ids["sweep-lr-0.003"]).state == "queued"

    run(app, test)


def test_theme_toggle_and_palette(tui_home):
    """ctrl+t switches dark and light themes (the screen's colours change); the command palette
    finds a skill and puts it on the input line."""
    app = ChatApp(wiring(), live=False, run_loop=False)

    async def test(pilot: Pilot) -> None:
        dark = app.screen.styles.background
        assert app.theme == "textual-dark"
        await pilot.press("ctrl+t")
        assert app.theme == "textual-light" and app.screen.styles.background != dark
        await pilot.press("ctrl+t")
        assert app.theme == "textual-dark"
        await pilot.press("ctrl+p")
        await pilot.press(*"cancel_job")
        hits = app.screen.query_one(CommandList)
        await until(pilot, lambda: hits.option_count > 0, what="the palette's hits")
        await pilot.press("down", "enter")
        prompt = app.query_one("#prompt", Input)
        await until(pilot, lambda: prompt.value == "skill cancel_job ", what="the palette")

    run(app, test)


def test_help_key_and_audit_view(tui_home):
    """F1 lists the keys (every binding the app and the jobs table declare, with its key), not
    the chat's commands; `help` typed in the chat lists those. F2 shows the audit, newest first,
    with the events of the call just made."""
    app = ChatApp(wiring(), live=False, run_loop=False)

    async def test(pilot: Pilot) -> None:
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, KeysScreen), what="the keys")
        text = str(app.screen.query_one("#keys").render())
        declared = [*ChatApp.BINDINGS, *JobsTable.BINDINGS, *JobScreen.BINDINGS]
        for binding in Binding.make_bindings(declared):
            line = next((x for x in text.splitlines() if x.endswith(f" {binding.description}")), "")
            assert app.get_key_display(binding) in line, (binding, text)
        assert "Direct commands" not in text and not answers(app)
        await pilot.press("escape")
        assert not isinstance(app.screen, KeysScreen)
        await say(pilot, "help")
        await until(pilot, lambda: any("Direct commands" in a for a in answers(app)))
        await say(pilot, "status")
        await until(pilot, lambda: len(answers(app)) == 2, what="the status answer")
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, AuditScreen))
        table = app.screen.query_one("#audit", DataTable)
        await until(pilot, lambda: table.row_count >= 3, what="the audit rows")
        newest = [str(c) for c in table.get_row_at(0)]
        assert newest[2:5] == ["alice", "skill.result", "list_jobs"]
        await pilot.press("escape")
        assert not isinstance(app.screen, AuditScreen)

    run(app, test)


# ------------------------------------------------------------------------------------ small and large terminals
def seen(widget: Any) -> bool:
    """On screen, wholly inside the terminal, and not empty."""
    region = widget.region
    return bool(region.area) and widget.screen.region.contains_region(region)


def long_job(w: Wiring, tmp_path: Path) -> int:
    """A failed job with a long name and a long reason, as a user's would be."""
    spec = load_spec(write_spec(tmp_path, steps=10)).model_dump(mode="json")
    t0 = datetime(2026, 12, 2, 2, 0)
    with w.store.session() as s:
        job = Job(
            name=LONG_NAME,
            spec=spec,
            state="failed",
            owner="alice",
            reason=LONG_WHY,
            max_attempts=1,
            created_at=t0,
            updated_at=t0,
        )
        s.add(job)
        s.flush()
        assert job.id is not None
        return job.id


def test_small_terminal_reaches_every_pane(tui_home, tmp_path):
    """At 80x24 one pane shows at a time, picked with F4 (jobs), F5 (GPUs), F6 (chat) or a click
    on the tab bar; each is wholly on screen when picked, the jobs table fits the width (no
    sideways scrolling), and the approvals (F3) fit too."""
    w = wiring()
    ids = seed(w, tmp_path)
    approval_id = agent_approval(w, ids["sweep-lr-0.003"])
    app = ChatApp(w, live=False, run_loop=False)

    async def test(pilot: Pilot) -> None:
        await until(pilot, lambda: isinstance(app.screen, ApprovalModal), what="the approval")
        assert seen(app.screen.query_one("#dialog")) and seen(app.screen.query_one("#approve"))
        await pilot.press("escape")
        await pilot.pause()
        jobs, gpus = app.query_one(JobsTable), app.query_one(GpuTable)
        log, prompt = app.query_one(ChatLog), app.query_one("#prompt", Input)
        assert seen(log) and seen(prompt) and not seen(jobs) and not seen(gpus)
        await pilot.press("f4")
        await pilot.pause()
        assert seen(jobs) and app.focused is jobs and not seen(log) and not seen(gpus)
        assert jobs.row_count == 4 and jobs.max_scroll_x == 0
        await pilot.press("f5")
        await pilot.pause()
        assert seen(gpus) and gpus.row_count == 3 and not seen(jobs) and not seen(log)
        await pilot.press("f6")
        await pilot.pause()
        assert seen(log) and seen(prompt) and app.focused is prompt and not seen(gpus)
        await pilot.click("#show-jobs")
        await pilot.pause()
        assert seen(jobs) and app.focused is jobs and not seen(log)
        await pilot.press("f3")
        await until(pilot, lambda: isinstance(app.screen, ApprovalModal), what="F3's approval")
        assert app.screen.approval_id == approval_id
        assert seen(app.screen.query_one("#dialog")) and seen(app.screen.query_one("#reject"))

    run(app, test, SMALL)


def test_keys_do_nothing_on_a_hidden_jobs_table(tui_home, tmp_path):
    """At 80x24 with the chat shown, the jobs table is hidden: even with the focus left on it,
    `c` asks nothing and cancels nothing, and enter opens no job; it says F4 shows the jobs.
    Shown again with F4, the same `c` asks about the highlighted job (no, here)."""
    w = wiring()
    queued = seed(w, tmp_path)["sweep-lr-0.003"]
    app = ChatApp(w, live=False, run_loop=False)

    async def test(pilot: Pilot) -> None:
        table = app.query_one(JobsTable)
        await pilot.press("f4")
        table.move_cursor(row=table.get_row_index(str(queued)))
        await pilot.press("f6")
        table.focus()  # the focus left behind on the hidden table
        await pilot.pause()
        await pilot.press("c")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, ConfirmModal)
        await pilot.press("y", "enter")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, ConfirmModal | JobScreen)
        assert w.store.job(queued).state == "queued"
        assert not w.audit.events(action="skill.request") and not card_titles(app)
        assert any("F4 shows it" in str(n.message) for n in app._notifications)
        await pilot.press("f4")  # shown, the same key asks, in a dialog that fits
        await pilot.pause()
        assert seen(table) and table.selected_job() == queued
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the confirmation")
        assert seen(app.screen.query_one("#yes")) and seen(app.screen.query_one("#no"))
        await pilot.press("n")
        await until(pilot, lambda: any("cancel_job" in t for t in card_titles(app)))
        assert w.store.job(queued).state == "queued"

    run(app, test, SMALL)


def test_long_names_and_reasons_whole_on_a_large_terminal(tui_home, tmp_path):
    """At 160x48 a long job name and its long reason are shown whole, beside the chat and the
    GPUs, in a table that needs no sideways scrolling; the terminal shrunk to 80x24, the jobs
    pane (F4) still fits by ending both in an ellipsis; grown back, both are whole again."""
    w = wiring()
    seed(w, tmp_path)
    job = str(long_job(w, tmp_path))
    app = ChatApp(w, live=False, run_loop=False)

    def cells(table: JobsTable) -> tuple[str, str]:
        return str(table.get_cell(job, "name")), str(table.get_cell(job, "why"))

    async def test(pilot: Pilot) -> None:
        table = app.query_one(JobsTable)
        assert seen(table) and seen(app.query_one(ChatLog)) and seen(app.query_one(GpuTable))
        assert cells(table) == (LONG_NAME, LONG_WHY) and table.max_scroll_x == 0
        await pilot.resize_terminal(*SMALL)
        await pilot.press("f4")
        await pilot.pause()
        name, why = cells(table)
        assert seen(table) and table.max_scroll_x == 0
        assert name.endswith("…") and LONG_NAME.startswith(name[:-1])
        assert why.endswith("…") and LONG_WHY.startswith(why[:-1])
        await pilot.resize_terminal(*LARGE)
        await pilot.pause()
        assert cells(table) == (LONG_NAME, LONG_WHY) and table.max_scroll_x == 0

    run(app, test, LARGE)


# ------------------------------------------------------------------------------------ snapshots
def status_asked(app: ChatApp) -> Callable[[Pilot], Any]:
    async def before(pilot: Pilot) -> None:
        app.query_one("#prompt", Input).cursor_blink = False  # a steady cursor: one picture
        await say(pilot, "status")
        await until(pilot, lambda: bool(answers(app)), what="the answer")
        await app.workers.wait_for_complete()
        await pilot.pause()

    return before


def test_snapshot_main_screen(tui_home, tmp_path, fixed_clock, snap_compare):
    """The main screen: chat with a card and an answer, GPUs (one WARNING), the jobs with their
    sparklines and why each waits or stopped."""
    w = wiring(fixed_clock)
    seed(w, tmp_path)
    app = ChatApp(w, clock=fixed_clock, live=False, run_loop=False)
    assert snap_compare(app, terminal_size=SIZE, run_before=status_asked(app))


def test_snapshot_main_screen_light(tui_home, tmp_path, fixed_clock, snap_compare):
    """The same screen in the light theme."""
    w = wiring(fixed_clock)
    seed(w, tmp_path)
    app = ChatApp(w, clock=fixed_clock, live=False, run_loop=False)

    async def before(pilot: Pilot) -> None:
        await status_asked(app)(pilot)
        await pilot.press("ctrl+t")

    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_snapshot_approval_modal(tui_home, tmp_path, fixed_clock, snap_compare):
    """An agent's cancel waiting for approval: the whole request in the modal."""
    w = wiring(fixed_clock)
    ids = seed(w, tmp_path)
    agent_approval(w, ids["sweep-lr-0.003"])
    app = ChatApp(w, clock=fixed_clock, live=False, run_loop=False)
    assert snap_compare(app, terminal_size=SIZE)


def test_snapshot_job_view(tui_home, tmp_path, fixed_clock, snap_compare):
    """The job view of a failed job: its attempts, causes and the steps lost."""
    w = wiring(fixed_clock)
    ids = seed(w, tmp_path)
    app = ChatApp(w, clock=fixed_clock, live=False, run_loop=False)

    async def before(pilot: Pilot) -> None:
        table = app.query_one(JobsTable)
        await pilot.press("f4")
        table.move_cursor(row=table.get_row_index(str(ids["resnet50-imagenet"])))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, JobScreen))
        attempts = app.screen.query_one("#attempts", DataTable)
        await until(pilot, lambda: attempts.row_count == 2)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_snapshot_small_terminal_chat(tui_home, tmp_path, fixed_clock, snap_compare):
    """80x24: the tab bar and the chat alone, with a card and an answer."""
    w = wiring(fixed_clock)
    seed(w, tmp_path)
    app = ChatApp(w, clock=fixed_clock, live=False, run_loop=False)
    assert snap_compare(app, terminal_size=SMALL, run_before=status_asked(app))


def test_snapshot_small_terminal_jobs(tui_home, tmp_path, fixed_clock, snap_compare):
    """80x24 after F4: the jobs alone, fitting the width, a long name and reason ending in …"""
    w = wiring(fixed_clock)
    seed(w, tmp_path)
    long_job(w, tmp_path)
    app = ChatApp(w, clock=fixed_clock, live=False, run_loop=False)

    async def before(pilot: Pilot) -> None:
        await pilot.press("f4")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SMALL, run_before=before)


def test_snapshot_small_terminal_keys(tui_home, fixed_clock, snap_compare):
    """80x24 after F1: the keys, grouped by where they work."""
    app = ChatApp(wiring(fixed_clock), clock=fixed_clock, live=False, run_loop=False)

    async def before(pilot: Pilot) -> None:
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, KeysScreen))
        await pilot.pause()

    assert snap_compare(app, terminal_size=SMALL, run_before=before)


def test_snapshot_large_terminal(tui_home, tmp_path, fixed_clock, snap_compare):
    """160x48: the chat and the GPUs side by side, the jobs across the width with a long name
    and its reason whole."""
    w = wiring(fixed_clock)
    seed(w, tmp_path)
    long_job(w, tmp_path)
    app = ChatApp(w, clock=fixed_clock, live=False, run_loop=False)
    assert snap_compare(app, terminal_size=LARGE, run_before=status_asked(app))
