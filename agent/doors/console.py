"""The one place that prints, and the one rendering boundary.

Rich reads `[...]` in a string as markup. Anything that did not come from nightshift's own code —
what a user typed, a job's name or reason, a log line, a store row, a model's answer — reaches
Rich only through the helpers here, which show it literally: `error()` prints its message as
plain text, `styled()`/`say()` fill our own markup template with values Rich never parses, and
`table()`/`key_values()` make every cell literal unless it is already a `Text` we styled. So
`[/x]` prints as `[/x]` (never a MarkupError traceback), and `pip install 'nightshift[tui]'`
keeps its `[tui]`. A command that prints a value with `console.print` must pass `markup=False`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from nightshift.agent.doors.wire import JobStatus

console = Console(highlight=False)
# Set (to anything): the read commands take their full path (Rich lays out every table, the ORM
# reads the store) instead of the fast one; for tests/test_fast_answers.py and `eval latency`,
# which compare the two.
FULL_PATH_ENV = "NIGHTSHIFT_FULL_READ_PATH"
err_console = Console(stderr=True, highlight=False)

# A value's place in a template while Rich parses it: Unicode private use, never in our own text.
_SLOT = 0xE000


def error(message: str) -> None:
    """One error line: our red `error:`, then the message exactly as it is."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)


def literal(value: Any) -> Text:
    """A value as it is (None: empty); a Text is ours, already styled, and is kept."""
    if isinstance(value, Text):
        return value
    return Text("" if value is None else str(value))


def styled(template: str, *values: Any) -> Text:
    """Our own markup `template` with each `{}` filled by a value, shown literally (a Text value
    keeps its own style). A value inherits the template's style around its `{}`, as if typed
    there, but no `[` in it is read as a tag: it is inserted after Rich has parsed the template."""
    n = len(values)
    parsed = Text.from_markup(template.format(*(chr(_SLOT + i) for i in range(n))))
    slots = [at for at, ch in enumerate(parsed.plain) if _SLOT <= ord(ch) < _SLOT + n]
    cuts = sorted({cut for at in slots for cut in (at, at + 1)})
    out = Text(end=parsed.end)
    for piece in parsed.divide(cuts):
        text = piece.plain
        if len(text) != 1 or not _SLOT <= ord(text) < _SLOT + n:
            out.append(piece)
            continue
        value = Text().append(literal(values[ord(text) - _SLOT]))  # its own style: a span
        for span in reversed(piece.spans):  # the template's style goes under the value's own
            value.stylize_before(span.style, 0, len(value))
        out.append(value)
    return out


def say(template: str, *values: Any, **options: Any) -> None:
    """Print `styled(template, *values)`; options as for Console.print (soft_wrap, end...)."""
    console.print(styled(template, *values), **options)


def table(
    title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], **column_options: Any
) -> Table:
    """A table whose title, headers and cells are literal; a cell that is a Text (or another
    Rich renderable) is ours and kept as it is."""
    t = Table(title=Text(title, style="table.title"), title_justify="left")
    for c in columns:
        t.add_column(Text(c), **column_options)
    for r in rows:
        t.add_row(*[_cell(v) for v in r])
    return t


def print_table(
    title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], target: Console | None = None
) -> None:
    """Print `table(title, columns, rows)` on `target` (the console), as Rich would print it.

    Rich lays out every cell (measures it, wraps it, pads it): about a millisecond a row, ten
    seconds for `nightshift jobs` on 10,000 jobs. A table whose cells are all plain, printable
    one-line text and which fits the console gives each column its widest cell and prints every
    body row as it is, unstyled, even at a terminal; so Rich draws the title, header and borders
    from a one-row table of the same widths, and the rows are written here. Anything else (a
    styled cell, a line break, a table wider than the console, no rows) is Rich's to print.
    tests/test_fast_answers.py compares the two outputs."""
    out = target or console
    given = [list(r) for r in rows]
    texts = _plain_cells(columns, given)
    if texts is None or not given or os.environ.get(FULL_PATH_ENV):
        out.print(table(title, columns, given))
        return
    lengths = [[len(c) if c.isascii() else cell_len(c) for c in r] for r in texts]
    widths = [max(col) for col in zip([cell_len(c) for c in columns], *lengths, strict=True)]

    def line(cells: Sequence[str], sizes: Sequence[int]) -> str:
        pads = [f" {c}{' ' * (w - n)} " for c, n, w in zip(cells, sizes, widths, strict=True)]
        return "│" + "│".join(pads) + "│"

    placeholder = ["x" * w for w in widths]
    with out.capture() as captured:
        out.print(table(title, columns, [placeholder]))
    drawn = captured.get().split("\n")
    if len(drawn) < 3 or drawn[-1] != "" or drawn[-3] != line(placeholder, widths):
        out.print(table(title, columns, given))  # Rich laid it out otherwise (narrowed it)
        return
    head, bottom = drawn[:-3], drawn[-2]
    body = (line(r, n) for r, n in zip(texts, lengths, strict=True))
    out.file.write("\n".join([*head, *body, bottom, ""]))
    out.file.flush()


def _plain_cells(columns: Sequence[str], rows: list[list[Any]]) -> list[list[str]] | None:
    """Each cell as the text `table()` would show, or None when one is not plain printable text
    on one line (a Text we styled, a renderable, a newline, a tab, a control character)."""
    if not all(isinstance(c, str) and c.isprintable() for c in columns):
        return None
    out = []
    for r in rows:
        if len(r) != len(columns):
            return None
        cells = []
        for v in r:
            if v is None:
                cells.append("")
                continue
            if isinstance(v, Text) or hasattr(v, "__rich_console__") or hasattr(v, "__rich__"):
                return None
            text = str(v)
            if not text.isprintable():
                return None
            cells.append(text)
        out.append(cells)
    return out


def key_values(title: str, pairs: Iterable[tuple[str, Any]]) -> Table:
    """A two-column key/value table (keys bold), every value literal as in `table()`."""
    t = Table(title=Text(title, style="table.title"), title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for key, value in pairs:
        t.add_row(Text(key), _cell(value))
    return t


def _cell(value: Any) -> RenderableType:
    if hasattr(value, "__rich_console__") or hasattr(value, "__rich__"):
        return value  # type: ignore[no-any-return]
    return literal(value)


class ProgressPrinter:
    """A callback for the graph that turns its events into readable lines; at a terminal, the
    job it watches also has the live status line of `logs -f` under them (job, state, attempt,
    step, loss: StatusLine below), drawn on stderr and never part of what a
    script reads from stdout."""

    def __init__(
        self, verbose: bool = False, job_state: Callable[[int], str | None] | None = None
    ) -> None:
        self.verbose = verbose
        self.job_state = job_state or (lambda job_id: None)
        self.line = StatusLine(only_live=True) if console.is_terminal else None
        self._show = _progress_lines()

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if self.line is not None:
            self.line.clear()
        self._show(kind, data)
        if self.line is not None:
            console.file.flush()
            if not self._status(kind, data):
                self.line.draw()

    def close(self) -> None:
        """Take the status line away (before the run's summary prints)."""
        if self.line is not None:
            self.line.close()

    def _status(self, kind: str, data: dict[str, Any]) -> bool:
        """Whether the event changed the status line (and drew it)."""
        from nightshift.agent.doors.wire import JobStatus

        assert self.line is not None
        if kind == "watch":
            job_id = data["job_id"]
            self.line.update(JobStatus(job_id=job_id, state=self.job_state(job_id) or "watched"))
            return True
        if kind == "attempt":
            job_id = data["job_id"]
            self.line.update(
                JobStatus(
                    job_id=job_id,
                    state=self.job_state(job_id) or data.get("state") or "",
                    attempt=data.get("number"),
                    step=data.get("last_step"),
                    loss=data.get("last_loss"),
                )
            )
            return True
        if kind == "observe" and data.get("kind") == "watch" or kind == "finish":
            self.line.close()  # the watched job has ended
        return False


def progress_printer(
    verbose: bool = False, job_state: Callable[[int], str | None] | None = None
) -> ProgressPrinter:
    """The graph's progress callback for `nightshift run` (`job_state`: a job's state now, for
    the status line at a terminal)."""
    return ProgressPrinter(verbose, job_state)


def _progress_lines() -> Callable[[str, dict[str, Any]], None]:
    """The run's printed lines for the graph's events (stdout, at a terminal or not)."""
    seen_ticks: dict[int, tuple] = {}
    said_wait: dict[tuple[int, int], int] = {}

    def show(kind: str, data: dict[str, Any]) -> None:
        if kind == "plan" and data.get("kind") == "call":
            why = styled("  [dim]{}[/]", data["why"]) if data.get("why") else ""
            say("[cyan]→[/] {}{}", data["skill"], why)
        elif kind == "verdict" and data["verdict"]["decision"] != "allow":
            v = data["verdict"]
            reasons = f" — {'; '.join(v['reasons'])}" if v.get("reasons") else ""
            say("  [yellow]policy:[/] {} by rule {}{}", v["decision"], v["rule"], reasons)
        elif kind == "observe":
            say("  {}", describe(data))
        elif kind == "watch":
            say("[cyan]→[/] watching job {}", data["job_id"])
        elif kind == "attempt" and data.get("last_step") is not None:
            key = (data["number"], data.get("last_step"))
            if seen_ticks.get(data["job_id"]) != key:
                seen_ticks[data["job_id"]] = key
                say(
                    "    attempt {}: step {} loss {}",
                    data["number"],
                    data.get("last_step"),
                    _num(data.get("last_loss")),
                )
        elif kind == "backoff":
            # The retry backoff is silent otherwise: say what it waits for, then count down.
            left = max(0, round(data["seconds_left"]))
            key = (data["job_id"], data["attempt"])
            before = said_wait.get(key)
            if before is None:
                how = data["outcome"] + (
                    f", exit {data['exit_code']}" if data.get("exit_code") not in (None, 0) else ""
                )
                say(
                    "    attempt {} {}: attempt {} starts in {} s (retry backoff; "
                    "retry_wait_s in the spec, retry.base_s in the config)",
                    data["attempt"],
                    how,
                    data["attempt"] + 1,
                    left,
                )
                said_wait[key] = left
            elif left < before and (left % 5 == 0 or left <= 3):
                say("      … {} s", left)
                said_wait[key] = left
        elif kind == "finish":
            colour = "green" if data["ok"] else "red"
            word = "done" if data["ok"] else "failed"
            say(f"[bold {colour}]{word}:[/] {{}}", data["summary"])

    return show


def _num(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def describe(obs: dict[str, Any]) -> Text:
    """One line for an observation, readable by a person at 3 a.m."""
    if obs["status"] != "ok":
        return styled("[red]{}:[/] {}", obs["status"], obs.get("error"))
    return literal(_describe_ok(obs))


def _describe_ok(obs: dict[str, Any]) -> str:
    r = obs.get("result") or {}
    skill = obs.get("skill")
    if obs["kind"] == "watch":
        att = r.get("attempt") or {}
        return (
            f"job {r.get('job_id')} {r.get('state')} after attempt {att.get('number')}"
            f" (exit {att.get('exit_code')}"
            + (f", last step {att['last_step']})" if att.get("last_step") is not None else ")")
            + (f": {r.get('reason')}" if r.get("reason") and r.get("state") != "succeeded" else "")
        )
    if skill == "gpu_health_check":
        return f"GPU health: {r.get('overall')} — {r.get('message')}"
    if skill == "config_validator":
        return (
            f"spec {'valid' if r.get('valid') else 'INVALID'}: {len(r.get('errors', []))} error(s), "
            f"{len(r.get('warnings', []))} warning(s)"
        )
    if skill == "submit_job":
        return f"queued job {r.get('job_id')} ({r.get('name')})"
    if skill == "reproduce_job":
        return (
            f"queued job {r.get('job_id')} reproducing job {r.get('source_job_id')} "
            f"attempt {r.get('source_attempt')}"
        )
    if skill == "diagnose_failure":
        return f"diagnosis: {r.get('category')} (retryable: {r.get('retryable')}) — {r.get('reasoning', '')}"
    if skill == "auto_resume":
        return (
            f"checkpoint: step {r.get('step')} at {r.get('path')}"
            if r.get("found")
            else f"no checkpoint: {r.get('message')}"
        )
    if skill == "resume_job":
        changed = {
            k: (r["params_before"].get(k), v)
            for k, v in r.get("params_after", {}).items()
            if r["params_before"].get(k) != v
        }
        return f"job {r.get('job_id')} requeued from step {r.get('resume_step')}" + (
            f", changed {changed}" if changed else ""
        )
    return f"{skill}: ok"


def status_text(s: JobStatus) -> str:
    """`job 7 running · attempt 2 · step 130 · loss 0.412`: the live status line."""
    parts = [f"job {s.job_id} {s.state or '?'}"]
    if s.state == "queued" and s.reason:
        parts[0] += f" ({s.reason})"
    if s.attempt:
        parts.append(f"attempt {s.attempt}")
    if s.step is not None:
        parts.append(f"step {s.step}")
    if s.loss is not None:
        parts.append(f"loss {s.loss:.4g}")
    return " · ".join(parts)


class StatusLine:
    """A job's state under what a command prints: at a terminal, one line on stderr kept below
    the printed lines (cleared before they print, drawn again after); elsewhere, unless `live`
    only, a line on stderr each time the state or the attempt changes. Stdout stays the
    command's own lines either way."""

    def __init__(self, *, only_live: bool = False) -> None:
        self.live = err_console.is_terminal
        self.quiet = only_live and not self.live
        self._text = ""
        self._last: tuple[int, str, int | None] | None = None

    def update(self, s: JobStatus) -> None:
        text = status_text(s)
        if self.live:
            self._text = text
            self.draw()
            return
        key = (s.job_id, s.state, s.attempt)
        if key != self._last and not self.quiet:
            self._last = key
            err_console.print(Text(text, style="dim"), soft_wrap=True)

    def draw(self) -> None:
        if self.live and self._text:
            self.clear()
            err_console.print(Text(self._text[: err_console.width - 1], style="dim"), end="")
            err_console.file.flush()

    def clear(self) -> None:
        if self.live:
            err_console.file.write("\r\x1b[2K")
            err_console.file.flush()

    def close(self) -> None:
        self.clear()
        self._text = ""
