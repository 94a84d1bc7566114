"""Follow a job to its end: every attempt's log in turn, each under a header line, until the job
ends for good; the exit code then says how it ended (`logs -f`, `submit --watch`).

`JobFollow` says what comes next (an attempt's header, its new lines, the job's status when it
changed, the end) by reading `job_logs` with a cursor (attempt, byte offset); the skill says
when the job has ended for good (`final`: a failed job is not final while recovery may still
requeue it). One implementation for both modes: the single-user mode runs it in this process
(its first read through the gate, the rest direct), and a shared daemon runs it for its client
after one audited decision of its gate (`logs.follow`, agent/doors/api_server.py) and streams
the events, so a follow costs the audit two events however long it lasts, never its lines.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from rich.text import Text

from nightshift.agent.doors.console import StatusLine, console, err_console, styled
from nightshift.agent.doors.wire import FollowEvent, JobStatus
from nightshift.runtime.errors import OperatorError

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
POLL_S = 0.5  # between reads while the log grows
IDLE_POLL_S = 3.0  # at most, while nothing happens

Fetch = Callable[[dict[str, Any]], "JobLogsResult"]


def fetcher(w: Wiring) -> Fetch:
    """How the single-user mode reads `job_logs` for a follow: the first call goes through the
    gate (the policy decides whether this person may read the job, and the audit says who did)
    and the reads after it are the caller's own store and files, as `nightshift jobs` reads."""
    from nightshift.agent.doors.shell import call_as_user
    from nightshift.skills.registry import get_skill

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


def direct_fetcher(w: Wiring, principal: str) -> Fetch:
    """`job_logs` read directly, for a follow the gate has already allowed (Gate.decide)."""
    from nightshift.skills.registry import get_skill

    skill = get_skill("job_logs")
    return lambda args: skill.fn(w.context(principal), skill.parse(args))  # type: ignore[no-any-return]


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


def status_of(r: JobLogsResult) -> JobStatus:
    """The status line's data in a `job_logs` answer."""
    return JobStatus(
        job_id=r.job_id,
        state=r.job_state,
        reason=r.reason,
        attempt=r.attempt,
        step=r.last_step,
        loss=r.last_loss,
    )


class JobFollow:
    """What comes next in following a job: its attempts' logs in order, each under its header,
    the newest followed as it grows, the next when a new attempt starts, the job's status when
    it changes, until the job has ended for good (the last event, `end`). `sleep` waits between
    reads (the daemon's wakes early and raises when its client hangs up)."""

    def __init__(
        self,
        fetch: Fetch,
        job_id: int,
        *,
        tail: int = 100,
        first_attempt: int | None = None,
        poll_s: float = POLL_S,
        idle_poll_s: float = IDLE_POLL_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.fetch, self.job_id, self.tail = fetch, job_id, tail
        self.first_attempt = first_attempt
        self.poll_s, self.idle_poll_s, self.sleep = poll_s, idle_poll_s, sleep
        # Until the first wait, the attempts found at the start show their last lines only.
        self._catching_up = True
        self._status: JobStatus | None = None

    def events(self) -> Iterator[FollowEvent]:
        r = yield from self._ask(attempt=self.first_attempt)
        if r.attempt is None:  # nothing ran yet: wait for the first attempt (or the end)
            r = yield from self._first_attempt(r)
            if r.attempt is None:
                yield self._end(r)
                return
        # The attempts that exist already: each one's last lines; then follow the newest.
        number = r.attempt if self.first_attempt is not None else 1
        if number != r.attempt:
            r = yield from self._ask(attempt=number)
        yield from self._show(r)
        wait = self.poll_s
        while True:
            if r.more:
                r = yield from self._ask(attempt=number, offset=r.end_offset)
                yield from self._show(r, header_too=False)
                wait = self.poll_s
                continue
            if r.attempt_ended and r.latest_attempt > number:
                number += 1
                # An attempt that began before this follow: its end; a new one: all of it.
                tail_only = number < r.latest_attempt or self._catching_up
                r = yield from self._ask(attempt=number, offset=None if tail_only else 0)
                yield from self._show(r)
                wait = self.poll_s
                continue
            if r.final and number >= r.latest_attempt:
                yield self._end(r)
                return
            self._catching_up = False
            self.sleep(wait)
            before = r.end_offset
            r = yield from self._ask(attempt=number, offset=r.end_offset)
            yield from self._show(r, header_too=False)
            grew = r.end_offset != before or r.more
            wait = self.poll_s if grew else min(self.idle_poll_s, wait * 2)

    def _first_attempt(self, r: JobLogsResult) -> Generator[FollowEvent, None, JobLogsResult]:
        if not r.final:
            yield FollowEvent(kind="waiting", status=status_of(r))
        wait = self.poll_s
        while r.attempt is None and not r.final:
            self.sleep(wait)
            wait = min(self.idle_poll_s, wait * 2)
            r = yield from self._ask()
        self._catching_up = False  # it started while we watched: show it all
        if r.attempt is not None:
            r = yield from self._ask(attempt=1, offset=0)
        return r

    def _ask(
        self, *, attempt: int | None = None, offset: int | None = None
    ) -> Generator[FollowEvent, None, JobLogsResult]:
        args: dict[str, Any] = {"job_id": self.job_id, "tail": self.tail}
        if attempt is not None:
            args["attempt"] = attempt
        if offset is not None:
            args["offset"] = offset
        r = self.fetch(args)
        status = status_of(r)
        if status != self._status:
            self._status = status
            yield FollowEvent(kind="status", status=status)
        return r

    @staticmethod
    def _show(r: JobLogsResult, *, header_too: bool = True) -> Iterator[FollowEvent]:
        if header_too and r.attempt is not None:
            yield FollowEvent(kind="header", text=header(r))
        if r.lines:
            yield FollowEvent(kind="lines", lines=r.lines)

    @staticmethod
    def _end(r: JobLogsResult) -> FollowEvent:
        return FollowEvent(kind="end", status=status_of(r), attempts=r.latest_attempt)


class Printer:
    """Shows a follow's events: headers and log lines on stdout, the status on the status line
    (or, without one, the wait for a first attempt on stderr); keeps the `end`."""

    def __init__(self, status: StatusLine | None) -> None:
        self.status = status
        self.end: FollowEvent | None = None

    def show(self, e: FollowEvent) -> None:
        if e.kind == "end":
            self.end = e
        elif e.kind == "status" and e.status is not None:
            if self.status is not None:
                self.status.update(e.status)
        elif e.kind == "waiting" and e.status is not None:
            if self.status is None:  # the status line says it otherwise
                s = e.status
                why = f" ({s.reason})" if s.reason else ""
                err_console.print(
                    styled("job {} is {}{}: waiting for its first attempt", s.job_id, s.state, why),
                    soft_wrap=True,
                )
        elif e.kind in ("header", "lines"):
            if self.status is not None:
                self.status.clear()
            if e.text is not None:
                console.print(Text(e.text, style="bold"), soft_wrap=True)
            for line in e.lines or []:
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
    INTERRUPTED on Ctrl-C). A daemon's client asks the daemon to follow it (`logs.follow`)."""
    from nightshift.agent.doors.remote import remote_of

    # Ctrl-C ends the follow even when this process was started with SIGINT ignored (as a shell
    # does for a command it runs in the background), which would leave it running for ever.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    status = StatusLine() if live_status else None
    printer = Printer(status)
    remote = remote_of(w)
    try:
        if remote is not None:
            remote.follow(job_id, first_attempt, tail, printer.show)
        else:
            stream = JobFollow(fetcher(w), job_id, tail=tail, first_attempt=first_attempt)
            for event in stream.events():
                printer.show(event)
    except KeyboardInterrupt:
        err_console.print(
            styled("stopped following job {}; it goes on (`nightshift jobs`)", job_id)
        )
        return INTERRUPTED
    finally:
        if status is not None:
            status.close()
    end = printer.end
    if end is None or end.status is None:
        raise OperatorError(
            f"the daemon stopped following job {job_id} before it ended (stopping? its log "
            f"says); `nightshift logs {job_id} -f` follows it again"
        )
    err_console.print(ended_line(end.status, end.attempts or 0), soft_wrap=True)
    return EXIT_CODES.get(end.status.state, 1)


def ended_line(s: JobStatus, attempts: int) -> Text:
    """`job 7 succeeded after 2 attempt(s)` / `job 7 failed: …`, the follow's last line."""
    style = {"succeeded": "bold green", "cancelled": "bold yellow"}.get(s.state, "bold red")
    why = f": {s.reason}" if s.reason and s.state != "succeeded" else ""
    return styled(
        "job {} [" + style + "]{}[/] after {} attempt(s){}",
        s.job_id,
        s.state,
        attempts,
        why,
    )
