"""The screens over the main one: the confirmation of a destructive call, an approval's whole
request, a job (k9s style: attempts and a followed log), the audit and the keys (F1)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, ContentSwitcher, DataTable, Footer, Input, Label, Log, Static

from nightshift.agent.doors.chat import ApprovalView, printable
from nightshift.agent.doors.tui.widgets import JobsTable, pretty

if TYPE_CHECKING:
    from nightshift.agent.doors.tui.app import ChatApp

FOLLOW_POLL_S = 0.5
LOG_TAIL = 200


def _when(at: datetime | None, now: datetime) -> str:
    if at is None:
        return "never"
    left = (at - now).total_seconds()
    rel = f"in {left / 60:.0f} min" if left >= 0 else f"{-left / 60:.0f} min ago"
    return f"{at:%Y-%m-%d %H:%M} UTC ({rel})"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    h, rest = divmod(s, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


# ------------------------------------------------------------------------------------ confirm
class ConfirmModal(ModalScreen[bool]):
    """Your own destructive call, shown whole: y runs it, n (or escape) does not."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes, run it"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, request: dict[str, Any]):
        super().__init__(classes="modal")
        self.request = request

    def compose(self) -> ComposeResult:
        r = self.request
        lines = [
            f"{r['skill']} needs your confirmation (rule {r.get('rule')}, approval "
            f"{r.get('approval_id')})",
            "",
            "arguments " + pretty(r.get("args") or {}).replace("\n", "\n          "),
        ]
        for path, digest in (r.get("files") or {}).items():
            lines.append(f"file      {path} (sha256 {digest[:16]}…)")
        for reason in r.get("reasons") or []:
            lines.append(f"policy    {reason}")
        with Vertical(id="dialog"):
            yield Label(Content("Run this?"), classes="dialog-title")
            yield Static(Content(printable("\n".join(lines))), id="request")
            with Horizontal(classes="buttons"):
                yield Button("Yes, run it (y)", variant="error", id="yes")
                yield Button("No (n)", variant="primary", id="no")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


# ------------------------------------------------------------------------------------ approval
Decision = tuple[bool, str]


class ApprovalModal(ModalScreen[Decision | None]):
    """A pending approval with the whole request: approve, or reject with a reason; escape
    leaves it pending (F3 shows it again)."""

    BINDINGS = [
        Binding("escape", "later", "Later"),
        Binding("a", "approve", "Approve"),
        Binding("x", "reject", "Reject"),
    ]

    def __init__(self, view: ApprovalView, *, can_vote: bool, now: datetime):
        super().__init__(classes="modal")
        self.view = view
        self.can_vote = can_vote
        self.now = now

    @property
    def approval_id(self) -> int:
        return self.view.id

    def compose(self) -> ComposeResult:
        a = self.view
        lines = [
            f"action     {a.skill}",
            "arguments  " + pretty(a.args).replace("\n", "\n           "),
            f"requester  {a.requester} (via {a.requested_via})",
            f"rule       {a.rule}",
            f"quorum     {len(a.approvers)} of {a.quorum} approved"
            + (f": {', '.join(a.approvers)}" if a.approvers else ""),
            f"expires    {_when(a.expires_at, self.now)}",
        ]
        for reason in a.reasons:
            lines.append(f"policy     {reason}")
        for key, value in a.claims.items():
            lines.append(f"claims     {key}: {json.dumps(value, default=str)}")
        for job in a.jobs:
            lines.append(
                f"job        {job['id']} {job['name']}: {job['state']}, owner {job['owner']}, "
                f"priority {job['priority']}" + (f" — {job['reason']}" if job.get("reason") else "")
            )
        for path, digest in a.files.items():
            lines.append(f"file       {path} (sha256 {digest[:16]}…)")
        for v in a.votes:
            lines.append(
                f"vote       {v['principal']}: {'yes' if v.get('approve') else 'no'} at {v.get('at')}"
            )
        with Vertical(id="dialog"):
            yield Label(Content(f"Approval {a.id} · {a.state}"), classes="dialog-title")
            with VerticalScroll(id="request-scroll"):
                yield Static(Content(printable("\n".join(lines))), id="request")
            if not self.can_vote:
                yield Static(
                    Content(
                        "You requested it, or may not vote on it: other principals decide it. "
                        "You may still reject (withdraw) it."
                    ),
                    classes="hint",
                )
            yield Input(placeholder="reason (recorded in the audit)", id="reason")
            with Horizontal(classes="buttons"):
                yield Button(
                    "Approve (a)", variant="success", id="approve", disabled=not self.can_vote
                )
                yield Button("Reject (x)", variant="error", id="reject")
                yield Button("Later (esc)", id="later")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#approve" if self.can_vote else "#reject", Button).focus()

    def _reason(self) -> str:
        return self.query_one("#reason", Input).value.strip()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "approve":
            self.action_approve()
        elif event.button.id == "reject":
            self.action_reject()
        else:
            self.action_later()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one("#reject" if not self.can_vote else "#approve", Button).focus()

    def action_approve(self) -> None:
        if self.can_vote:
            self.dismiss((True, self._reason()))

    def action_reject(self) -> None:
        self.dismiss((False, self._reason()))

    def action_later(self) -> None:
        self.dismiss(None)


# ------------------------------------------------------------------------------------ job view
class JobScreen(Screen[None]):
    """One job, k9s style: `s` its attempts and their causes, `l` its log followed as it grows;
    `c` cancel, `r` retry, `p` pause go through the gate as chat commands (cancel asks first)."""

    BINDINGS = [
        Binding("escape,q", "app.pop_screen", "Back"),
        Binding("s", "attempts", "Attempts"),
        Binding("l", "logs", "Logs"),
        Binding("c", "job('cancel')", "Cancel"),
        Binding("r", "job('retry')", "Retry"),
        Binding("p", "job('pause')", "Pause"),
        Binding("ctrl+r", "reload", "Reload"),
    ]

    def __init__(self, job_id: int, mode: str = "attempts"):
        super().__init__()
        self.job_id = job_id
        self.mode = mode
        self._log_path: Path | None = None
        self._offset = 0
        self._pending = b""
        self._follow: Any = None

    @property
    def chat(self) -> ChatApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Static(Content(f"job {self.job_id}"), id="job-summary")
        with ContentSwitcher(initial=self.mode, id="job-body"):
            yield DataTable(id="attempts", cursor_type="row")
            yield Log(id="logs", max_lines=5000, highlight=False)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#attempts", DataTable)
        table.add_columns("#", "started", "ran", "steps", "ended", "cause", "lost", "changed")
        self.load_attempts()
        if self.mode == "logs":
            self.action_logs()

    def action_attempts(self) -> None:
        self.query_one(ContentSwitcher).current = "attempts"
        self.load_attempts()
        self.query_one("#attempts").focus()

    def action_logs(self) -> None:
        self.query_one(ContentSwitcher).current = "logs"
        self.query_one("#logs").focus()
        if self._follow is None:
            self.start_log()

    def action_reload(self) -> None:
        self.load_attempts()

    def action_job(self, action: str) -> None:
        self.chat.job_action(self.job_id, action)

    @work(thread=True, exclusive=True, group="job-attempts")
    def load_attempts(self) -> None:
        try:
            r = self.chat.session.read("show_job", {"job_id": self.job_id})
        except Exception as exc:  # an unknown job, a store fault: said on the screen
            self.app.call_from_thread(self._show_error, str(exc))
            return
        self.app.call_from_thread(self._show_attempts, r)

    def _show_error(self, text: str) -> None:
        self.query_one("#job-summary", Static).update(Content(printable(text)))

    def _show_attempts(self, r: Any) -> None:
        head = f"job {r.job_id} {r.name}: {r.state}" + (f" — {r.reason}" if r.reason else "")
        head += (
            f"\nowner {r.owner} · priority {r.priority} · {len(r.attempts)} of at most "
            f"{r.max_attempts} attempt(s) · steps lost {r.steps_lost_total}"
        )
        if r.resume_from:
            head += f" · next resumes at step {r.resume_step}"
        self.query_one("#job-summary", Static).update(Content(printable(head)))
        table = self.query_one("#attempts", DataTable)
        table.clear()
        for a in r.attempts:
            how = a.outcome or a.state
            if a.signal:
                how += f" (signal {a.signal})"
            elif a.exit_code not in (None, 0):
                how += f" (exit {a.exit_code})"
            changes = ", ".join(f"{k} {c.before}→{c.after}" for k, c in a.param_changes.items())
            table.add_row(
                Text(str(a.number)),
                Text(f"{a.started_at:%m-%d %H:%M:%S}"),
                Text(_duration(a.duration_s)),
                Text(f"{a.start_step}→{'?' if a.last_step is None else a.last_step}"),
                Text(how),
                Text(
                    printable(a.cause or "") + (f" — {printable(a.evidence)}" if a.evidence else "")
                ),
                Text("" if a.steps_lost is None else str(a.steps_lost)),
                Text(printable(changes)),
            )

    @work(thread=True, exclusive=True, group="job-log")
    def start_log(self) -> None:
        """The tail through the gate (job_logs, audited), then the file's new lines as they come,
        as `nightshift logs -f` does."""
        try:
            r = self.chat.session.read("job_logs", {"job_id": self.job_id, "tail": LOG_TAIL})
        except Exception as exc:
            self.app.call_from_thread(self._write_log, [f"cannot read the log: {exc}"])
            return
        if r.log_path is None:
            self.app.call_from_thread(
                self._write_log, [f"job {self.job_id} has no attempt yet, so no log"]
            )
            return
        self._log_path, self._offset = Path(r.log_path), r.end_offset
        self.app.call_from_thread(self._write_log, [f"── {r.log_path} ──", *r.lines])
        self.app.call_from_thread(self._start_follow)

    def _start_follow(self) -> None:
        self._follow = self.set_interval(FOLLOW_POLL_S, self.follow_log)

    @work(thread=True, exclusive=True, group="job-log-follow")
    def follow_log(self) -> None:
        lines = self.read_new_lines()
        if lines:
            self.app.call_from_thread(self._write_log, lines)

    def read_new_lines(self) -> list[str]:
        """Whole lines appended to the log since the last read."""
        path = self._log_path
        if path is None:
            return []
        try:
            size = path.stat().st_size
        except OSError:
            return []
        if size < self._offset:
            self._offset = 0  # truncated and rewritten
        if size == self._offset:
            return []
        try:
            with open(path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read(min(size - self._offset, 1 << 20))
        except OSError:
            return []
        self._offset += len(chunk)
        self._pending += chunk
        *done, self._pending = self._pending.split(b"\n")
        return [line.decode("utf-8", "replace") for line in done]

    def _write_log(self, lines: list[str]) -> None:
        log = self.query_one("#logs", Log)
        log.write_lines([printable(line) for line in lines])


# ------------------------------------------------------------------------------------ audit
class AuditScreen(Screen[None]):
    """The newest audit events, newest first."""

    BINDINGS = [
        Binding("escape,q", "app.pop_screen", "Back"),
        Binding("ctrl+r", "reload", "Reload"),
    ]

    def __init__(self, limit: int = 200):
        super().__init__()
        self.limit = limit

    def compose(self) -> ComposeResult:
        yield Label(Content("audit · newest first"), classes="screen-title")
        yield DataTable(id="audit", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("id", "time", "actor", "action", "skill", "job", "detail")
        self.action_reload()

    @work(thread=True, exclusive=True, group="audit")
    def action_reload(self) -> None:
        app: ChatApp = self.app  # type: ignore[assignment]
        events = app.w.audit.events(limit=self.limit, newest_first=True)
        self.app.call_from_thread(self._show, events)

    def _show(self, events: list[Any]) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for e in events:
            table.add_row(
                Text(str(e.id)),
                Text(str(e.ts)[:19]),
                Text(printable(e.actor)),
                Text(e.action),
                Text(e.skill or ""),
                Text("" if e.job_id is None else str(e.job_id)),
                Text(printable(json.dumps(e.payload, default=str))[:120], style="dim"),
            )
        table.focus()


# ------------------------------------------------------------------------------------ keys
class KeysScreen(ModalScreen[None]):
    """Every key binding, read from the bindings the screens and widgets declare (so the list
    cannot drift from what the keys do), grouped by where each one works."""

    BINDINGS = [Binding("escape,q,f1", "dismiss", "Close")]

    def __init__(self) -> None:
        super().__init__(classes="modal")

    def sections(self) -> list[tuple[str, list[BindingType]]]:
        palette = Binding(self.app.COMMAND_PALETTE_BINDING, "command_palette", "Commands, skills")
        app_keys = list(Binding.make_bindings(self.app.BINDINGS))
        panes = [b for b in app_keys if b.action.startswith("show_pane")]
        return [
            ("Anywhere", [b for b in app_keys if b not in panes] + [palette]),
            ("The panes, on the main screen (one at a time when narrow)", panes),
            ("On the jobs table (F4)", list(JobsTable.BINDINGS)),
            ("In a job's view", list(JobScreen.BINDINGS)),
            ("In an approval", list(ApprovalModal.BINDINGS)),
            ("When asked to confirm", list(ConfirmModal.BINDINGS)),
            ("In the audit (F2)", list(AuditScreen.BINDINGS)),
            ("This list", list(self.BINDINGS)),
        ]

    def lines(self) -> list[str]:
        out: list[str] = []
        for title, bindings in self.sections():
            out += ["", title] if out else [title]
            keys: dict[str, list[str]] = {}  # one line per action, its keys together
            for b in Binding.make_bindings(bindings):
                keys.setdefault(b.description or b.action, []).append(self.app.get_key_display(b))
            out += [f"  {' / '.join(k):<14} {what}" for what, k in keys.items()]
        out += ["", "Type `help` in the chat for its commands."]
        return out

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(Content("Keys"), classes="dialog-title")
            with VerticalScroll(id="keys-scroll"):
                yield Static(Content("\n".join(self.lines())), id="keys")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#keys-scroll").focus()
