"""The main screen's widgets: the chat log with its tool cards, the GPU panel and the jobs table.

Every text that comes from a person, a log, a result or a model is shown as literal text
(`Content(...)`, `Text(...)`): never parsed as markup, never run."""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Collapsible, DataTable, Static

from nightshift.agent.doors.chat import (
    Answer,
    ApprovalClosed,
    ApprovalNeeded,
    Progress,
    StepStats,
    ToolCard,
    format_stats,
    printable,
)
from nightshift.agent.doors.tui.data import GpuRow, JobRow

MAX_SHOWN = 6000  # characters of a result shown in an expanded card
KEEP = 500  # entries the chat log keeps

STATUS_MARK = {
    "planned": "·",
    "running": "…",
    "pending": "?",
    "ok": "✓",
    "error": "✗",
    "denied": "⊘",
    "rejected": "⊘",
}
VERDICT_STYLE = {
    "OK": "green",
    "NO_GPUS": "green",
    "WARNING": "yellow",
    "CRITICAL": "red",
    "UNKNOWN": "magenta",
}
STATE_STYLE = {
    "running": "cyan",
    "queued": "",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "dim",
    "paused": "yellow",
    "held": "yellow",
}


def literal(text: str) -> Content:
    return Content(printable(text))


def pretty(value: Any) -> str:
    text = json.dumps(value, indent=2, default=str, ensure_ascii=False)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "\n… (cut)"


def short_args(args: dict[str, Any], width: int = 60) -> str:
    text = json.dumps(args, default=str, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= width else text[: width - 1] + "…"


# ------------------------------------------------------------------------------------ chat log
class ToolCardView(Collapsible):
    """One skill call: a title line (skill, arguments, verdict and rule, result summary) that
    expands to the whole call and result."""

    def __init__(self, card: ToolCard):
        body = Static("", classes="card-body", markup=False)
        super().__init__(body, title="", collapsed=True, classes="tool-card")
        self.body = body
        self.show(card)

    def show(self, card: ToolCard) -> None:
        self.card = card
        mark = STATUS_MARK.get(card.status, "·")
        verdict = f" · {card.decision} ({card.rule})" if card.decision else ""
        who = f"{card.requester}: " if card.requester == "agent" else ""
        summary = f" — {card.summary}" if card.summary else ""
        # The title widget's label, as literal text (the `title` string would be markup).
        self._title.label = Content(
            printable(f"{mark} {who}{card.skill} {short_args(card.args)}{verdict}{summary}")
        )
        self.set_class(card.status in ("error", "denied", "rejected"), "-failed")
        self.set_class(card.status == "pending", "-pending")
        self.set_class(card.status == "ok", "-ok")
        lines = [f"skill     {card.skill}", f"requester {card.requester}"]
        if card.why:
            lines.append(f"why       {card.why}")
        if card.decision:
            lines.append(f"verdict   {card.decision} by rule {card.rule}")
        lines += [f"          {r}" for r in card.reasons]
        lines.append("arguments " + pretty(card.args).replace("\n", "\n          "))
        lines.append(f"status    {card.status}")
        if card.error:
            lines.append(f"error     {card.error}")
        if card.result is not None:
            lines.append("result    " + pretty(card.result).replace("\n", "\n          "))
        self.body.update(Content(printable("\n".join(lines))))


class ChatLog(VerticalScroll):
    """The conversation: the person's messages, the agent's answers and a card per call."""

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self.cards: dict[str, ToolCardView] = {}

    def add_user(self, text: str) -> None:
        self._add(Static(literal(f"› {text}"), classes="user-msg"))

    def add_note(self, text: str, classes: str = "note") -> None:
        self._add(Static(literal(text), classes=classes))

    def add_event(self, event: Any) -> None:
        if isinstance(event, ToolCard):
            view = self.cards.get(event.call_id)
            if view is None:
                view = self.cards[event.call_id] = ToolCardView(event)
                self._add(view)
            else:
                view.show(event)
        elif isinstance(event, Answer):
            classes = "answer" if event.outcome in ("ok", "waiting") else "answer -failed"
            self._add(Static(literal(event.text), classes=classes))
            if event.stats:
                self._add(
                    Static(
                        literal(
                            f"model: {event.stats.get('steps', '?')} step(s) · "
                            f"{format_stats(event.stats)}"
                        ),
                        classes="stats",
                    )
                )
        elif isinstance(event, StepStats):
            self._add(
                Static(
                    literal(f"model step {event.step}: {format_stats(event.data)}"), classes="stats"
                )
            )
        elif isinstance(event, ApprovalNeeded):
            a = event.approval
            self._add(
                Static(
                    literal(
                        f"approval {a.id} needed: {a.skill} {short_args(a.args)} requested by "
                        f"{a.requester} (rule {a.rule}, quorum {a.quorum}) — {event.note}"
                    ),
                    classes="approval-note",
                )
            )
        elif isinstance(event, ApprovalClosed):
            self.add_note(f"approval {event.approval_id}: {event.state}")
        elif isinstance(event, Progress):
            self.add_note(event.text, "progress")

    def _add(self, widget: Any) -> None:
        at_end = self.scroll_offset.y >= self.max_scroll_y - 1
        if len(self.children) >= KEEP:  # a long night: the oldest entries go
            old = list(self.children)[: KEEP // 5]
            gone = {id(w) for w in old}
            self.cards = {k: v for k, v in self.cards.items() if id(v) not in gone}
            for w in old:
                w.remove()
        self.mount(widget)
        if at_end:
            self.call_after_refresh(self.scroll_end, animate=False)


# ------------------------------------------------------------------------------------ panels
GPU_NAME_WIDTH = 18  # "0 H100 80GB HBM3": the panel stays 66 columns wide beside the chat


class GpuTable(DataTable):
    """Per GPU: verdict, utilisation, memory, temperature, power."""

    def on_mount(self) -> None:
        self.cursor_type = "none"
        self.zebra_stripes = False
        self.add_columns("gpu", "verdict", "util", "memory", "temp", "power")

    def show(self, rows: list[GpuRow]) -> None:
        self.clear()
        for r in rows:
            name = Text(f"{r.index} {r.name}")
            name.truncate(GPU_NAME_WIDTH, overflow="ellipsis")
            self.add_row(
                name,
                Text(r.verdict, style=VERDICT_STYLE.get(r.verdict, "")),
                Text(r.util),
                Text(r.memory),
                Text(r.temp),
                Text(r.power),
                key=str(r.index),
            )


JOB_COLUMNS = (
    ("id", "id"),
    ("name", "name"),
    ("state", "state"),
    ("attempts", "att"),
    ("metric", "metric"),
    ("spark", "loss"),
    ("why", "why"),
)
WHY_MAX = 300  # characters of a reason kept; the column shows what fits of them
CELL_PADDING = 2  # a DataTable column's padding, one cell each side
LEAST = 8  # a shared column never gets less, however narrow the terminal


def share_widths(natural: dict[str, int], width: int) -> dict[str, int]:
    """Column widths for a table `width` cells wide. Every column gets its natural width while
    they all fit; when they do not, the short columns keep theirs and the job's name and its why
    share what is left (the name at most two fifths of it, unless the why needs less), so only a
    truly narrow terminal cuts them, with an ellipsis."""
    fixed = sum(w + CELL_PADDING for k, w in natural.items() if k not in ("name", "why"))
    room = width - fixed - 2 * CELL_PADDING
    name, why = natural["name"], natural["why"]
    if width <= 0 or name + why <= room:
        return dict(natural)
    name_w = max(LEAST, min(name, max(room * 2 // 5, room - why)))
    return natural | {"name": name_w, "why": max(LEAST, room - name_w)}


def on_screen(widget: Widget) -> bool:
    """Whether the person can see the widget now: displayed, laid out and wholly inside the
    terminal (a table pushed past the right edge of a narrow terminal is not)."""
    if not widget.is_mounted or not widget.is_on_screen:
        return False
    region = widget.region
    return bool(region.area) and widget.screen.region.contains_region(region)


class JobsTable(DataTable):
    """The jobs, k9s style: one key per action on the highlighted job. A key acts only while
    the table is on screen: on a hidden table it would act on a row nobody sees."""

    BINDINGS = [
        Binding("enter", "open", "Open"),
        Binding("l", "job('logs')", "Logs"),
        Binding("s", "job('attempts')", "Attempts"),
        Binding("c", "job('cancel')", "Cancel"),
        Binding("r", "job('retry')", "Retry"),
        Binding("p", "job('pause')", "Pause"),
    ]

    class JobAction(Message):
        """The person asked for `action` on a job."""

        def __init__(self, job_id: int, action: str):
            super().__init__()
            self.job_id = job_id
            self.action = action

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self.rows_shown: list[JobRow] = []
        self._fitted_to = -1

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self._fill()

    def on_resize(self) -> None:
        if self.size.width != self._fitted_to:
            self._fill()

    def show(self, rows: list[JobRow]) -> None:
        self.rows_shown = rows
        self._fill()

    def _fill(self) -> None:
        """The rows again, with the columns sized to the table's width now."""
        selected = self.selected_job()
        cells = [
            {
                "id": Text(str(r.id)),
                "name": Text(printable(r.name)),
                "state": Text(r.state, style=STATE_STYLE.get(r.state, "")),
                "attempts": Text(str(r.attempts)),
                "metric": Text(r.metric),
                "spark": Text(r.spark, style="cyan"),
                "why": Text(printable(r.why)[:WHY_MAX], style="dim"),
            }
            for r in self.rows_shown
        ]
        natural = {
            key: max([len(label), *(row[key].cell_len for row in cells)])
            for key, label in JOB_COLUMNS
        }
        # The vertical scrollbar's column is kept free, so a longer list never cuts the why.
        self._fitted_to = self.size.width
        width = self.size.width - self.styles.scrollbar_size_vertical if self.size.width else 0
        widths = share_widths(natural, width)
        self.clear(columns=True)
        for key, label in JOB_COLUMNS:
            self.add_column(label, key=key, width=widths[key])
        for r, row in zip(self.rows_shown, cells, strict=True):
            for key, text in row.items():
                text.truncate(widths[key], overflow="ellipsis")
            self.add_row(*row.values(), key=str(r.id))
        if selected is not None and str(selected) in {str(r.id) for r in self.rows_shown}:
            self.move_cursor(row=self.get_row_index(str(selected)), animate=False)

    def selected_job(self) -> int | None:
        if self.row_count == 0:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        except Exception:  # no row under the cursor
            return None
        return int(key.value) if key.value is not None else None

    def action_open(self) -> None:
        self.action_job("attempts")

    def action_job(self, action: str) -> None:
        if not on_screen(self):
            self.notify(
                "The jobs table is not on screen, so no job was touched: F4 shows it.",
                title="jobs",
                severity="warning",
            )
            return
        job_id = self.selected_job()
        if job_id is not None:
            self.post_message(self.JobAction(job_id, action))
