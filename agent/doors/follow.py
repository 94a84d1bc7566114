"""Follow a job to its end: every attempt's log in turn, each under a header line, until the job
ends for good; the exit code then says how it ended (`logs -f`, `submit --watch`).

The follower only polls the `job_logs` skill with a cursor (attempt, byte offset), so it works
the same for the single-user mode and for a client of a shared daemon, which cannot open the
job's files: the daemon reads them and answers through its gate. The skill says when the job has
ended for good (`final`): a failed job is not final while recovery may still requeue it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.text import Text

from nightshift.agent.doors.console import console, err_console, styled

if TYPE_CHECKING:
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.skills.job_logs import JobLogsResult

# A job's final state → the exit code of the command that followed it (README, "Following").
EXIT_CODES = {"succeeded": 0, "failed": 6, "cancelled": 7}
INTERRUPTED = 130  # Ctrl-C: the job goes on; the shell's code for SIGINT
EXIT_HELP = (
    "Exit code: 0 the job succeeded, 6 it failed for good, 7 it was cancelled, 130 Ctrl-C "
    "(the job goes on)."
)
POLL_S = 0.5  # between polls while the log grows
IDLE_POLL_S = 3.0  # at most, while nothing happens
# A daemon's client: each poll is a read through the daemon's gate, audited with what it read.
REMOTE_POLL_S, REMOTE_IDLE_POLL_S = 1.0, 5.0

Fetch = Callable[[dict[str, Any]], "JobLogsResult"]


def fetcher(w: Wiring) -> Fetch:
    """How this command asks `job_logs`: through the daemon's gate for its client (every poll);
    in the single-user mode the first call goes through the gate (the policy decides whether
    this person may read the job, and the audit says who did) and the polls after it read the
    caller's own store and files directly, as the rows of `nightshift jobs` are read."""
    from nightshift.agent.doors.remote import remote_of
    from nightshift.agent.doors.shell import call_as_user
    from nightshift.skills.registry import get_skill

    remote = remote_of(w)
    if remote is not None:
        return lambda args: remote.call("job_logs", args, via="terminal")  # type: ignore[return-value]
    skill = get_skill("job_logs")
    allowed = False

    def fetch(args: dict[str, Any]) -> JobLogsResult:
        nonlocal allowed
        if not allowed:
            r: Any = call_as_user(w, "job_logs", args)
            allowed = True
            return r  # type: ignore[no-any-return]
        return skill.fn(w.context(w.user), skill.parse(args))  # type: ignore[no-any-return]

    return fetch


def header(r: JobLogsResult) -> str:
    """`── attempt 2 (resumed from step 125) ──`: where each attempt's lines begin."""
    n = r.attempt or 0
    if n <= 1:
        how = ""
    elif r.start_step:
        how = f" (resumed from step {r.start_step})"
    else:
        how = " (from scratch)"
    return f"── attempt {n}{how} ──"


def status_text(job_id: int, r: JobLogsResult) -> str:
    """`job 7 running · attempt 2 · step 130 · loss 0.412`: the live status line."""
    parts = [f"job {job_id} {r.job_state or '?'}"]
    if r.job_state == "queued" and r.reason:
        parts[0] += f" ({r.reason})"
    if r.attempt:
        parts.append(f"attempt {r.attempt}")
    if r.last_step is not None:
        parts.append(f"step {r.last_step}")
    if r.last_loss is not None:
        parts.append(f"loss {r.last_loss:.4g}")
    return " · ".join(parts)


class StatusLine:
    """The job's state under the stream: at a terminal, one line on stderr kept below the log's
    lines (cleared before they print, drawn again after); elsewhere a line on stderr each time
    the state or the attempt changes. Stdout stays the log's lines either way."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.live = err_console.is_terminal
        self._text = ""
        self._last: tuple[str, int | None] | None = None

    def update(self, r: JobLogsResult) -> None:
        text = status_text(self.job_id, r)
        if self.live:
            self._text = text
            self.draw()
            return
        key = (r.job_state, r.attempt)
        if key != self._last:
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


class Follower:
    """Print a job's attempts' logs in order, each under its header, and follow the newest as it
    grows, moving on when a new attempt starts, until the job has ended for good."""

    def __init__(
        self,
        fetch: Fetch,
        job_id: int,
        *,
        tail: int = 100,
        first_attempt: int | None = None,
        status: StatusLine | None = None,
        poll_s: float = POLL_S,
        idle_poll_s: float = IDLE_POLL_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.fetch, self.job_id, self.tail = fetch, job_id, tail
        self.first_attempt, self.status = first_attempt, status
        self.poll_s, self.idle_poll_s, self.sleep = poll_s, idle_poll_s, sleep
        # Until the first wait, the attempts found at the start show their last lines only.
        self._catching_up = True

    def run(self) -> JobLogsResult:
        """Follow until the job is final; its last answer (job_state says how it ended)."""
        r = self._ask(attempt=self.first_attempt)
        if r.attempt is None:  # nothing ran yet: wait for the first attempt (or the end)
            r = self._first_attempt(r)
            if r.attempt is None:
                return r
        # The attempts that exist already: each one's last lines; then follow the newest.
        number = r.attempt if self.first_attempt is not None else 1
        if number != r.attempt:
            r = self._ask(attempt=number)
        self._show(r)
        wait = self.poll_s
        while True:
            if r.more:
                r = self._ask(attempt=number, offset=r.end_offset)
                self._show(r, header_too=False)
                wait = self.poll_s
                continue
            if r.attempt_ended and r.latest_attempt > number:
                number += 1
                # An attempt that began before this follow: its end; a new one: all of it.
                tail_only = number < r.latest_attempt or self._catching_up
                r = self._ask(attempt=number, offset=None if tail_only else 0)
                self._show(r)
                wait = self.poll_s
                continue
            if r.final and number >= r.latest_attempt:
                return r
            self._catching_up = False
            self.sleep(wait)
            before = r.end_offset
            r = self._ask(attempt=number, offset=r.end_offset)
            self._show(r, header_too=False)
            grew = r.end_offset != before or r.more
            wait = self.poll_s if grew else min(self.idle_poll_s, wait * 2)

    def _first_attempt(self, r: JobLogsResult) -> JobLogsResult:
        if self.status is None and not r.final:  # the status line says it otherwise
            why = f" ({r.reason})" if r.reason else ""
            err_console.print(
                styled(
                    "job {} is {}{}: waiting for its first attempt", self.job_id, r.job_state, why
                ),
                soft_wrap=True,
            )
        wait = self.poll_s
        while r.attempt is None and not r.final:
            self.sleep(wait)
            wait = min(self.idle_poll_s, wait * 2)
            r = self._ask()
        self._catching_up = False  # it started while we watched: show it all
        if r.attempt is not None:
            r = self._ask(attempt=1, offset=0)
        return r

    def _ask(self, *, attempt: int | None = None, offset: int | None = None) -> JobLogsResult:
        args: dict[str, Any] = {"job_id": self.job_id, "tail": self.tail}
        if attempt is not None:
            args["attempt"] = attempt
        if offset is not None:
            args["offset"] = offset
        r = self.fetch(args)
        if self.status is not None:
            self.status.update(r)
        return r

    def _show(self, r: JobLogsResult, *, header_too: bool = True) -> None:
        if not r.lines and not (header_too and r.attempt is not None):
            return
        if self.status is not None:
            self.status.clear()
        if header_too and r.attempt is not None:
            console.print(Text(header(r), style="bold"), soft_wrap=True)
        for line in r.lines:
            console.out(line, highlight=False)  # log text is data: printed, never interpreted
        if self.status is not None:
            console.file.flush()
            self.status.draw()


def follow(
    w: Wiring,
    job_id: int,
    *,
    tail: int = 100,
    first_attempt: int | None = None,
    live_status: bool = False,
) -> int:
    """Follow job `job_id` to its end and say how it ended; the exit code for it (EXIT_CODES,
    INTERRUPTED on Ctrl-C)."""
    # Ctrl-C ends the follow even when this process was started with SIGINT ignored (as a shell
    # does for a command it runs in the background), which would leave it running for ever.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    status = StatusLine(job_id) if live_status else None
    remote = w.served_at is not None
    follower = Follower(
        fetcher(w),
        job_id,
        tail=tail,
        first_attempt=first_attempt,
        status=status,
        poll_s=REMOTE_POLL_S if remote else POLL_S,
        idle_poll_s=REMOTE_IDLE_POLL_S if remote else IDLE_POLL_S,
    )
    try:
        r = follower.run()
    except KeyboardInterrupt:
        r = None
    finally:
        if status is not None:
            status.close()
    if r is None:
        err_console.print(
            styled("stopped following job {}; it goes on (`nightshift jobs`)", job_id)
        )
        return INTERRUPTED
    err_console.print(ended_line(r), soft_wrap=True)
    return EXIT_CODES.get(r.job_state, 1)


def ended_line(r: JobLogsResult) -> Text:
    """`job 7 succeeded after 2 attempt(s)` / `job 7 failed: …`, the follow's last line."""
    style = {"succeeded": "bold green", "cancelled": "bold yellow"}.get(r.job_state, "bold red")
    why = f": {r.reason}" if r.reason and r.job_state != "succeeded" else ""
    return styled(
        "job {} [" + style + "]{}[/] after {} attempt(s){}",
        r.job_id,
        r.job_state,
        r.latest_attempt,
        why,
    )
