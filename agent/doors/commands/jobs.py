"""`nightshift show | logs | cancel | retry JOB`: the everyday commands on one job, each one skill
call through the policy gate (audited; cancel asks for approval as the policy says). The ones that
change a job take --yes (confirm one's own call where the policy lets one) and --wait (a script
waits for others' decision instead of getting exit 4 and the approval id at once)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from nightshift.agent.doors.console import console, print_table, say
from nightshift.agent.doors.shell import call_as_user, call_or_exit

if TYPE_CHECKING:
    from nightshift.skills.job_logs import JobLogsResult

ConfigOpt = typer.Option(None, "--config", help="Config file")
# A call that needs an approval: at a terminal it is confirmed y/N where the policy lets the
# requester, else waited for; a script (no terminal) gets exit 4 and the approval id at once.
WaitOpt = typer.Option(
    False,
    "--wait",
    help="Without a terminal, wait for an approval's decision (else exit 4 at once)",
)
YesOpt = typer.Option(
    False,
    "--yes",
    help="Confirm your own call without asking, where the policy lets the requester confirm it",
)


def _steps(a: Any) -> str:
    return f"{a.start_step}→{'?' if a.last_step is None else a.last_step}"


def _value(v: Any) -> str:
    """A parameter's value as a person reads it: a parameter an attempt did not have is unset."""
    return "unset" if v is None else str(v)


def _resume_line(r: Any) -> str | None:
    """Where the job's next attempt would start, for a job that can have one: a waiting or
    stopped job's next attempt, a failed job's retry; nothing for a finished job."""
    if r.state in ("succeeded", "cancelled") or not (r.resume_from or r.resume_step):
        return None
    where = r.resume_from or f"step {r.resume_step}"
    if r.resume_from and r.resume_step is not None:
        where += f" (step {r.resume_step})"
    if r.state == "failed":
        return f"`nightshift retry {r.job_id}` resumes from {where}"
    return f"next attempt resumes from {where}"


def _resumed(a: Any) -> str | None:
    if not a.resumed_from:
        return None
    step = a.resumed_from_step
    return a.resumed_from if step is None else f"{a.resumed_from} @ step {step}"


def print_attempt_diagnosis(number: int, d: Any, *, log_path: str | None = None) -> None:
    """One attempt's diagnosis, whole: category, the line that shows it and where, the summary,
    the recommended action. Log text is printed as data (say escapes it)."""
    retry = "a retry can help" if d.retryable else "a retry will not help"
    say("  attempt {}: [bold]{}[/] ({} confidence; {})", number, d.category, d.confidence, retry)
    if d.evidence:
        where = d.where()
        if where == "monitor":
            say("    evidence (the loop): {}", d.evidence, soft_wrap=True)
        else:
            of = f" of {log_path}" if log_path and d.source == "log" else ""
            say("    evidence, {}{}: {}", where, of, d.evidence, soft_wrap=True)
    say("    summary: {}", d.summary, soft_wrap=True)
    say("    fix: {} [dim]({})[/]", d.fix, d.action, soft_wrap=True)
    if d.changes:
        say("    changes: {}", ", ".join(f"{k} = {v}" for k, v in d.changes.items()))


def show(
    job_id: int = typer.Argument(..., help="The job"),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
    config: str | None = ConfigOpt,
) -> None:
    """One job in full: every attempt with its steps, cause, diagnosis (the evidence line and the
    fix), the steps the next attempt lost, parameter changes and the checkpoint it resumed from
    (what `sacct` gives a Slurm user)."""
    r: Any = call_or_exit(config, "show_job", {"job_id": job_id})
    if as_json:
        print(r.model_dump_json(indent=2))
        return
    say(
        "[bold]job {}[/] {}: [bold]{}[/]{}",
        r.job_id,
        r.name,
        r.state,
        f" — {r.reason}" if r.reason else "",
    )
    say(
        "  owner {}, priority {}, attempts {} of at most {}, steps lost in all {}",
        r.owner,
        r.priority,
        len(r.attempts),
        r.max_attempts,
        r.steps_lost_total,
    )
    say("  folder {}\n  checkpoints {}", r.workspace, r.checkpoint_dir)
    resume = _resume_line(r)
    if resume:
        say("  {}", resume)
    for k in r.good_checkpoints:
        say("  kept good checkpoint: step {}, {} MB, {}", k.step, f"{k.bytes / 1e6:.1f}", k.path)
    rows = []
    for a in r.attempts:
        changes = ", ".join(
            f"{k} {_value(c.before)}→{_value(c.after)}" for k, c in a.param_changes.items()
        )
        how = a.outcome or a.state
        if a.signal:
            how += f" (signal {a.signal})"
        elif a.exit_code not in (None, 0):
            how += f" (exit {a.exit_code})"
        rows.append(
            [
                a.number,
                a.started_at.strftime("%m-%d %H:%M:%S"),
                None if a.duration_s is None else f"{a.duration_s:.0f}s",
                _steps(a),
                how,
                a.cause or (a.diagnosis.category if a.diagnosis else None),
                a.steps_lost,
                changes or None,
                _resumed(a),
            ]
        )
    print_table(
        "attempts",
        ["#", "started", "ran", "steps", "ended", "cause", "lost", "changed", "resumed from"],
        rows,
    )
    for a in r.attempts:
        if a.diagnosis is not None:
            print_attempt_diagnosis(a.number, a.diagnosis, log_path=a.log_path)
            if a.evidence and a.evidence != a.diagnosis.evidence:
                say("    the loop saw: {}", a.evidence, soft_wrap=True)
        elif a.evidence:
            say("  attempt {}: {}", a.number, a.evidence, soft_wrap=True)


def logs(
    job_id: int = typer.Argument(..., help="The job"),
    attempt: int | None = typer.Option(
        None, "--attempt", help="Attempt number; default: the latest (with -f: from the first)"
    ),
    tail: int = typer.Option(100, "--tail", "-n", help="Lines from the end (of each attempt)"),
    follow: bool = typer.Option(
        False,
        "--follow",
        "-f",
        help="Follow the job to its end, across its attempts; exit with its final state",
    ),
    config: str | None = ConfigOpt,
) -> None:
    """The end of a job's log (stdout and stderr of one attempt). With -f, the job followed to
    its end: each attempt's log under a header line (`── attempt 2 (resumed from step 125) ──`),
    the newest one as it grows, the next one when a retry starts, until the job has ended for
    good (a failed job that recovery will retry is not). Exit code with -f: 0 the job
    succeeded, 6 it failed for good, 7 it was cancelled, 130 Ctrl-C (the job goes on)."""
    from nightshift.agent.brain.wiring import Wiring

    w = Wiring.load(config)
    if follow:
        from nightshift.agent.doors.follow import follow as follow_job

        raise typer.Exit(follow_job(w, job_id, tail=tail, first_attempt=attempt))
    args: dict[str, Any] = {"job_id": job_id, "tail": tail}
    if attempt is not None:
        args["attempt"] = attempt
    r: Any = call_as_user(w, "job_logs", args)
    _print_logs(job_id, r)


def _print_logs(job_id: int, r: JobLogsResult) -> None:
    for line in r.lines:
        console.out(line, highlight=False)  # log text is data: printed, never interpreted
    if r.log_path is None:
        say("job {} has no attempt yet, so no log", job_id)


def cancel(
    job_id: int = typer.Argument(..., help="The job"),
    reason: str = typer.Option("cancelled by operator", "--reason"),
    as_json: bool = typer.Option(False, "--json"),
    wait: bool = WaitOpt,
    yes: bool = YesOpt,
    config: str | None = ConfigOpt,
) -> None:
    """End a job for good, stopping its running attempt (asks for approval as the policy says:
    y/N at a terminal, --yes in a script; else exit 4 with the approval id, or --wait)."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.console import error

    # Nobody is asked to approve the cancel of a job that does not exist or has already ended;
    # cancel_job checks again when it runs.
    w = Wiring.load(config)
    if w.served_at is not None:  # the daemon's store: asked through its gate (a read)
        state = _remote_state(w, job_id)
    else:
        job = w.store.job(job_id)
        state = None if job is None else job.state
    if state is None:
        error(f"no job {job_id}; `nightshift jobs` lists the jobs")
        raise typer.Exit(2)
    if state in ("succeeded", "failed", "cancelled"):
        say("job {} is {}: nothing to cancel", job_id, state)
        return
    r: Any = call_as_user(
        w,
        "cancel_job",
        {"job_id": job_id, "reason": reason},
        wait=wait,
        yes=yes,
        as_json=as_json,
    )
    if as_json:
        print(r.model_dump_json(indent=2))
    elif r.before == r.after:
        say("job {} is {}: nothing to cancel", job_id, r.after)
    else:
        stopped = f" (attempt {r.stopped_attempt} stopped)" if r.stopped_attempt else ""
        say("job {}: {} → {}{}", job_id, r.before, r.after, stopped)


def hold(
    job_id: int = typer.Argument(..., help="The job"),
    reason: str = typer.Option("", "--reason", help="Why; recorded on the job"),
    as_json: bool = typer.Option(False, "--json"),
    wait: bool = WaitOpt,
    yes: bool = YesOpt,
    config: str | None = ConfigOpt,
) -> None:
    """Keep a job back: a running one is stopped at its newest checkpoint, a queued one does not
    start. It stays held, and costs no retry, until `nightshift release JOB`."""
    from nightshift.agent.brain.wiring import Wiring

    args: dict[str, Any] = {"job_id": job_id}
    if reason:
        args["reason"] = reason
    r: Any = call_as_user(
        Wiring.load(config), "pause_job", args, wait=wait, yes=yes, as_json=as_json
    )
    if as_json:
        print(r.model_dump_json(indent=2))
    elif r.before == r.after:
        say("job {} is {}: only a queued, running or paused job is held", job_id, r.after)
    else:
        at = f" at step {r.last_step}" if r.last_step is not None else ""
        say(
            "job {}: {} → {}{}; `nightshift release {}` lets it run again",
            job_id,
            r.before,
            r.after,
            at,
            job_id,
        )


def release(
    job_id: int = typer.Argument(..., help="The held job"),
    as_json: bool = typer.Option(False, "--json"),
    wait: bool = WaitOpt,
    yes: bool = YesOpt,
    config: str | None = ConfigOpt,
) -> None:
    """Let a held job run again: from its newest checkpoint if the hold stopped its run."""
    from nightshift.agent.brain.wiring import Wiring

    r: Any = call_as_user(
        Wiring.load(config),
        "release_job",
        {"job_id": job_id},
        wait=wait,
        yes=yes,
        as_json=as_json,
    )
    if as_json:
        print(r.model_dump_json(indent=2))
    elif r.before == r.after:
        say("job {} is {}: not held, nothing to release", job_id, r.after)
    else:
        then = (
            "recovery resumes it from its newest checkpoint"
            if r.after == "paused"
            else "it waits for a slot"
        )
        say("job {}: {} → {}; {}", job_id, r.before, r.after, then)


def _remote_state(w: Any, job_id: int) -> str | None:
    from nightshift.agent.doors.remote import Remote
    from nightshift.runtime.errors import UnknownJob

    try:
        return Remote(w.served_at).call("show_job", {"job_id": job_id}, via="terminal").state  # type: ignore[no-any-return]
    except UnknownJob:
        return None


def retry(
    job_id: int = typer.Argument(..., help="A failed job"),
    from_scratch: bool = typer.Option(
        False, "--from-scratch", help="Start at step 0, not from the job's resume point"
    ),
    as_json: bool = typer.Option(False, "--json"),
    wait: bool = WaitOpt,
    yes: bool = YesOpt,
    config: str | None = ConfigOpt,
) -> None:
    """One more attempt of a failed job, even when its retries ran out or recovery gave up."""
    r: Any = call_or_exit(
        config,
        "retry_job",
        {"job_id": job_id, "from_scratch": from_scratch},
        wait=wait,
        yes=yes,
        as_json=as_json,
    )
    if as_json:
        print(r.model_dump_json(indent=2))
        return
    where = f"from {r.resume_from} (step {r.resume_step})" if r.resume_from else "from scratch"
    say(
        "job {}: {} → {}, attempt {} will start {}; max attempts {} → {}{}",
        job_id,
        r.before,
        r.after,
        r.attempts + 1,
        where,
        r.max_attempts_before,
        r.max_attempts_after,
        " (this call had already requeued it)" if r.already_done else "",
    )


def register(app: typer.Typer) -> None:
    for command in (show, logs, cancel, retry, hold, release):
        app.command()(command)
