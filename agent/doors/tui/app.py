"""`nightshift chat`: the chat with the GPUs beside it and the jobs across the bottom, approvals
as they come; on a terminal under 120 columns one pane at a time, picked from a tab bar (or F4
jobs, F5 GPUs, F6 chat), so every pane can be seen whole.

Nothing blocks the screen: each message runs in a thread worker (a model step, a skill, a goal
that watches its job for an hour), the panels and the approvals are read in workers too, and
every widget update goes through `call_from_thread`. A worker that needs the person — the
confirmation of their own destructive call — pushes a modal and waits for its answer."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Footer, Header, Input, Label, Tab, Tabs
from textual.worker import Worker, WorkerState

from nightshift.agent.doors.chat import (
    Answer,
    ApprovalClosed,
    ApprovalNeeded,
    ApprovalView,
    ChatSession,
    PlannerFactory,
    ToolCard,
    approval_view,
    endpoint_label,
)
from nightshift.agent.doors.tui.commands import SkillsProvider
from nightshift.agent.doors.tui.data import GpuRow, JobRow, gpu_rows, job_rows
from nightshift.agent.doors.tui.screens import (
    ApprovalModal,
    AuditScreen,
    ConfirmModal,
    Decision,
    JobScreen,
    KeysScreen,
)
from nightshift.agent.doors.tui.widgets import ChatLog, GpuTable, JobsTable

if TYPE_CHECKING:
    from nightshift.agent.brain.wiring import Wiring

THEMES = ("textual-dark", "textual-light")
WIDE = 120  # columns from which the chat, the GPUs and the jobs are all on screen at once
TALL = 32  # rows from which a dialog keeps its margins
PANES = {"chat": "Chat F6", "jobs": "Jobs F4", "gpus": "GPUs F5"}


class ChatApp(App[None]):
    """The chat TUI over one Wiring. `live=False` (tests, snapshots) reads the panels once at
    start and polls nothing; `run_loop=False` leaves the scheduler loop alone."""

    CSS_PATH = "chat.tcss"
    TITLE = "nightshift chat"
    COMMANDS = App.COMMANDS | {SkillsProvider}
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (TALL, "-tall")]
    BINDINGS = [
        Binding("f1", "help", "Keys"),
        Binding("f2", "audit", "Audit"),
        Binding("f3", "approvals", "Approvals"),
        Binding("f4", "show_pane('jobs')", "Jobs"),
        Binding("f5", "show_pane('gpus')", "GPUs"),
        Binding("f6", "show_pane('chat')", "Chat"),
        Binding("ctrl+t", "toggle_theme", "Theme"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        w: Wiring,
        *,
        use_model: bool = True,
        planner_factory: PlannerFactory | None = None,
        clock: Callable[[], datetime] | None = None,
        live: bool = True,
        run_loop: bool = True,
        refresh_s: float = 2.0,
        approvals_poll_s: float = 1.0,
    ):
        super().__init__()
        from nightshift.agent.brain.wiring import local_now

        self.w = w
        self.clock = clock or local_now
        self.live = live
        self.run_loop = run_loop
        self.refresh_s = refresh_s
        self.approvals_poll_s = approvals_poll_s
        self.session = ChatSession(
            w,
            emit=self._emit,
            confirm=self._confirm,
            planner_factory=planner_factory,
            use_model=use_model,
            spawn=self._spawn,
        )
        self._main = threading.get_ident()
        self._closing = False
        self._waits: set[threading.Event] = set()
        self._queue: list[tuple[ApprovalView, bool]] = []
        self._showing: int | None = None  # the approval whose modal is open
        self._closed_elsewhere: int | None = None
        self._later: set[int] = set()
        self._last_error = ""
        self.pending_approvals: list[int] = []

    # Layout --------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="☾")
        yield Tabs(*(Tab(label, id=f"show-{pane}") for pane, label in PANES.items()), id="panes")
        with Vertical(id="main", classes="-pane-chat"):
            with Horizontal(id="top"):
                with Vertical(id="chat-pane"):
                    yield ChatLog(id="chat-log")
                    yield Input(
                        placeholder="status · submit FILE · logs 3 · why did job 3 fail · help",
                        id="prompt",
                    )
                with Vertical(id="gpu-pane"):
                    yield Label("GPUs", classes="panel-title", id="gpu-title")
                    yield GpuTable(id="gpus")
            with Vertical(id="jobs-pane"):
                yield Label("Jobs", classes="panel-title", id="jobs-title")
                yield JobsTable(id="jobs")
        yield Footer()

    def on_mount(self) -> None:
        self._main = threading.get_ident()
        self.theme = THEMES[0]
        owner = self.session.start_loop() if self.run_loop else "none"
        model = endpoint_label(self.w) if self.session.has_model else None
        loop = {
            "chat": "this chat runs its jobs",
            "daemon": "the daemon runs the jobs",
            "none": "jobs wait for a daemon",
        }[owner]
        self.sub_title = f"as {self.session.user} · model: {model or 'none'} · {loop}"
        log = self.query_one(ChatLog)
        log.add_note(
            "Type a direct command (`help` lists them)"
            + (", or ask in your own words." if self.session.has_model else ".")
            + " F1 keys · F4 jobs (enter, l, s, c, r, p) · F5 GPUs · F3 approvals · F2 audit"
            + " · ctrl+p commands"
        )
        if not self.session.has_model:
            log.add_note(
                "No model endpoint: free-form requests need OPENAI_BASE_URL and "
                "NIGHTSHIFT_MODEL (`nightshift doctor` checks them).",
                "note -warn",
            )
        # The first read is here, before the first frame: the screen opens filled.
        self._show_panels(*self._read_panels_now())
        self._sync_approvals(self._pending_views())
        if self.live:
            self.set_interval(self.refresh_s, self.refresh_panels)
            self.set_interval(self.approvals_poll_s, self.poll_approvals)
        self.query_one("#prompt", Input).focus()

    def on_unmount(self) -> None:
        self._closing = True
        for done in list(self._waits):
            done.set()
        if self.run_loop:
            self.session.stop_loop()

    # Threads -------------------------------------------------------------------------------------
    def _on_main(self) -> bool:
        return threading.get_ident() == self._main

    def _later_on_main(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run fn on the app's thread (now, if this is it)."""
        if self._closing:
            return
        if self._on_main():
            fn(*args)
            return
        try:
            self.call_from_thread(fn, *args)
        except RuntimeError:  # the app has stopped
            pass

    def _emit(self, event: Any) -> None:
        self._later_on_main(self._on_event, event)

    def _spawn(self, fn: Callable[[], None]) -> None:
        self._later_on_main(self._run_in_thread, fn)

    def _run_in_thread(self, fn: Callable[[], None], name: str = "chat") -> None:
        """The session's work in a daemon thread of its own, not a Textual worker: a goal may
        watch its job for hours, and quitting must not wait for it (the run goes on; its call
        ids make a later resume do nothing twice)."""

        def main() -> None:
            try:
                fn()
            except Exception as exc:  # a bug, not a person's mistake: said, and the app goes on
                self._later_on_main(self._internal_error, exc)

        threading.Thread(target=main, name=f"nightshift-{name}", daemon=True).start()

    def _internal_error(self, exc: BaseException) -> None:
        from nightshift.runtime.errors import NightshiftError

        text = (
            str(exc)  # a store fault and the like: what to fix
            if isinstance(exc, NightshiftError)
            else f"internal error (a bug; please report it): {type(exc).__name__}: {exc}"
        )
        if text != self._last_error:
            self._last_error = text
            self.query_one(ChatLog).add_note(text, "note -error")

    def _confirm(self, request: dict[str, Any]) -> bool:
        """The gate asks the person to confirm their own call: a modal, answered on the app's
        thread while this worker waits. Quitting the app answers no."""
        done = threading.Event()
        answer = [False]

        def got(yes: bool | None) -> None:
            answer[0] = bool(yes)
            done.set()
            self._show_next()

        self._waits.add(done)
        try:
            self._later_on_main(lambda: self.push_screen(ConfirmModal(request), got))
            while not done.wait(0.2):
                if self._closing:
                    return False
        finally:
            self._waits.discard(done)
        return answer[0]

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A panel or approvals read that failed (a store fault): said once in the chat."""
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            self._internal_error(event.worker.error)

    # Chat ----------------------------------------------------------------------------------------
    @on(Input.Submitted, "#prompt")
    def _submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        event.input.value = ""
        if text:
            self.send_text(text)

    def send_text(self, text: str) -> None:
        """Show the message and hand it to the session in a worker."""
        self.query_one(ChatLog).add_user(text)
        self._run_in_thread(partial(self.session.send, text))

    def prefill(self, text: str) -> None:
        prompt = self.query_one("#prompt", Input)
        prompt.value = text
        prompt.cursor_position = len(text)
        prompt.focus()

    def _on_event(self, event: Any) -> None:
        self.query_one(ChatLog).add_event(event)
        if isinstance(event, ApprovalNeeded):
            self.poll_approvals()
        elif isinstance(event, ApprovalClosed):
            self._close_modal_of(event.approval_id)
        elif isinstance(event, Answer) or (isinstance(event, ToolCard) and event.status == "ok"):
            self.refresh_panels()

    # Panels --------------------------------------------------------------------------------------
    def _read_panels_now(self) -> tuple[list[GpuRow], str, list[JobRow]]:
        gpus, note = gpu_rows(self.w)
        return gpus, note, job_rows(self.w)

    def refresh_panels(self) -> None:
        self.run_worker(
            self._read_panels, thread=True, group="panels", exclusive=True, exit_on_error=False
        )

    def _read_panels(self) -> None:
        data = self._read_panels_now()
        self._later_on_main(self._show_panels, *data)

    def _show_panels(self, gpus: list[GpuRow], note: str, jobs: list[JobRow]) -> None:
        self.query_one(GpuTable).show(gpus)
        self.query_one("#gpu-title", Label).update(Content(f"GPUs · {note}"[:80]))
        self.query_one(JobsTable).show(jobs)
        running = sum(1 for j in jobs if j.state == "running")
        queued = sum(1 for j in jobs if j.state == "queued")
        self.query_one("#jobs-title", Label).update(
            Content(f"Jobs · {running} running · {queued} queued")
        )

    # Approvals -----------------------------------------------------------------------------------
    def _pending_views(self) -> list[tuple[ApprovalView, bool]]:
        rows = self.w.approvals.pending(self.clock())
        return [(approval_view(self.w, r), self.session.can_vote(r)) for r in rows]

    def poll_approvals(self) -> None:
        self.run_worker(
            self._poll_approvals,
            thread=True,
            group="approvals",
            exclusive=True,
            exit_on_error=False,
        )

    def _poll_approvals(self) -> None:
        self.session.poll()
        self._later_on_main(self._sync_approvals, self._pending_views())

    def _sync_approvals(self, views: list[tuple[ApprovalView, bool]]) -> None:
        """Queue the pending approvals this person may vote on; close what was decided
        elsewhere (another shell, a channel, the daemon)."""
        pending = {v.id: (v, can) for v, can in views}
        self.pending_approvals = sorted(pending)
        if self._showing is not None and self._showing not in pending:
            self._close_modal_of(self._showing)
        self._queue = [(v, can) for v, can in self._queue if v.id in pending]
        queued = {v.id for v, _ in self._queue}
        for aid, (view, can) in pending.items():
            if can and aid not in self._later and aid not in queued and aid != self._showing:
                self._queue.append((view, can))
        self._later &= set(pending)
        n = len(pending)
        self.title = f"nightshift chat · {n} pending approval(s) (F3)" if n else "nightshift chat"
        self._show_next()

    def _show_next(self) -> None:
        if self._closing or self._showing is not None or isinstance(self.screen, ModalScreen):
            return
        if not self._queue:
            return
        view, can = self._queue.pop(0)
        self._showing = view.id
        self.push_screen(
            ApprovalModal(view, can_vote=can, now=self.clock()),
            partial(self._decided, view),
        )

    def _close_modal_of(self, approval_id: int) -> None:
        screen = self.screen
        if isinstance(screen, ApprovalModal) and screen.approval_id == approval_id:
            self._closed_elsewhere = approval_id
            screen.dismiss(None)
            self.notify(f"approval {approval_id} was decided", title="approvals")
        self._queue = [(v, c) for v, c in self._queue if v.id != approval_id]

    def _decided(self, view: ApprovalView, result: Decision | None) -> None:
        self._showing = None
        if result is None:
            if self._closed_elsewhere == view.id:
                self._closed_elsewhere = None
            else:
                self._later.add(view.id)
        else:
            approve, reason = result
            self.query_one(ChatLog).add_user(
                f"{'approve' if approve else 'reject'} {view.id}" + (f" {reason}" if reason else "")
            )
            self._run_in_thread(partial(self.session.decide, view.id, approve, reason))
        self._show_next()

    # Actions -------------------------------------------------------------------------------------
    def action_help(self) -> None:
        """The keys, not the chat's commands (`help` in the chat lists those)."""
        if not isinstance(self.screen, KeysScreen):
            self.push_screen(KeysScreen())

    def action_audit(self) -> None:
        self.push_screen(AuditScreen())

    def action_approvals(self) -> None:
        """Every pending approval again, those put off and those you may not vote on too."""
        self._run_in_thread(
            lambda: self._later_on_main(self._show_all, self._pending_views()), "approvals"
        )

    def _show_all(self, views: list[tuple[ApprovalView, bool]]) -> None:
        self._later.clear()
        shown = {v.id for v, _ in self._queue} | ({self._showing} if self._showing else set())
        self._queue += [(v, can) for v, can in views if v.id not in shown]
        if not views:
            self.notify("no pending approvals", title="approvals")
        self._show_next()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The pane keys work on the main screen only (the footer hides them elsewhere): over a
        job's view or a dialog they would change what nobody sees."""
        if action == "show_pane":
            return self.screen is self.screen_stack[0]
        return True

    def action_show_pane(self, pane: str) -> None:
        tabs = self.query_one("#panes", Tabs)
        if tabs.active == f"show-{pane}":
            self._show_pane(pane)
        else:
            tabs.active = f"show-{pane}"  # its TabActivated shows the pane

    @on(Tabs.TabActivated, "#panes")
    def _tab_activated(self, event: Tabs.TabActivated) -> None:
        if event.tab.id:
            self._show_pane(event.tab.id.removeprefix("show-"))

    def _show_pane(self, pane: str) -> None:
        """Show the pane (the CSS hides the others on a narrow terminal) and move the focus
        into it, so a key goes to what is on screen."""
        main = self.query_one("#main")
        for name in PANES:
            main.set_class(name == pane, f"-pane-{name}")
        target = {"chat": "#prompt", "jobs": "#jobs", "gpus": "#gpus"}[pane]
        self.query_one(target).focus()

    def action_toggle_theme(self) -> None:
        self.theme = THEMES[1] if self.theme == THEMES[0] else THEMES[0]

    @on(JobsTable.JobAction)
    def _job_action(self, event: JobsTable.JobAction) -> None:
        self.job_action(event.job_id, event.action)

    def job_action(self, job_id: int, action: str) -> None:
        """A key on a job: views open here; changes are chat commands through the gate (so they
        show as cards, and cancel asks for confirmation)."""
        if action in ("logs", "attempts"):
            if isinstance(self.screen, JobScreen) and self.screen.job_id == job_id:
                if action == "logs":
                    self.screen.action_logs()
                else:
                    self.screen.action_attempts()
                return
            self.push_screen(JobScreen(job_id, action))
            return
        self.send_text(f"{action} {job_id}")
