"""`nightshift show | logs | cancel | retry JOB`: the everyday commands on one job, each one skill
call through the policy gate (audited; cancel asks for approval as the policy says). The ones that
change a job take --yes (confirm one's own call where the policy lets one) and --wait (a script
waits for others' decision instead of getting exit 4 and the approval id at once)."""

from __future__ import annotations

from typing import Any

import typer

from nightshift.agent.doors import job_views
from nightshift.agent.doors.console import say
from nightshift.agent.doors.shell import call_as_user, call_or_exit

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


def show(
    job_id: int = typer.Argument(..., help="The job"),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
    config: str | None = ConfigOpt,
) -> None:
    """One job in full: every attempt with its steps, cause, diagnosis (the evidence line and the
    fix), the steps the next attempt lost, parameter changes and the checkpoint it resumed from
    (what `sacct` gives a Slurm user)."""
    from nightshift.agent.doors import quick

    r: Any = None if as_json else quick.show(config, job_id)
    if r is None:
        r = call_or_exit(config, "show_job", {"job_id": job_id})
    if as_json:
        print(r.model_dump_json(indent=2))
        return
    job_views.print_show(r)


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
    from nightshift.agent.doors import quick

    if not follow:
        found = quick.log_lines(config, job_id, attempt, tail)
        if found is not None:
            job_views.print_logs(job_id, *found)
            return
    from nightshift.agent.brain.wiring import Wiring

    w = Wiring.load(config)
    if follow:
        from nightshift.agent.doors.follow import follow as follow_job

        raise typer.Exit(follow_job(w, job_id, tail=tail, first_attempt=attempt))
    args: dict[str, Any] = {"job_id": job_id, "tail": tail}
    if attempt is not None:
        args["attempt"] = attempt
    r: Any = call_as_user(w, "job_logs", args)
    job_views.print_logs(job_id, r.lines, r.log_path)


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
