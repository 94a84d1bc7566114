"""`nightshift submit` and `nightshift jobs`: queue work (a spec, or a plain command line) and
see why each job waits."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand

from nightshift.agent.doors.console import (
    console,
    err_console,
    error,
    print_table,
    say,
    styled,
)
from nightshift.agent.doors.shell import parse_key_values
from nightshift.runtime.errors import BadArguments

PRIORITIES = {"high": 10, "normal": 0, "low": -10}


def checked_spec(spec: Path, config: str | None) -> tuple[Any, Any]:
    """The client to call (in a shared install the daemon's: it reads the spec and runs the code
    as its own user) and the parsed spec, once config_validator found it valid; else each error
    on its own line and exit code 2."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.api import Client
    from nightshift.agent.doors.remote import remote_of
    from nightshift.runtime.spec import load_spec
    from nightshift.runtime.user_files import regular_file

    regular_file(spec, "SPEC")  # a FIFO or a device is refused before anything opens it
    w = Wiring.load(config)
    client: Any = remote_of(w) or Client(w)
    parsed = load_spec(spec)
    check: Any = client.call("config_validator", {"path": str(spec.resolve())})
    if not check.valid:
        for e in check.errors:
            error(f"{spec}: field '{e.field}': {e.message}")
        raise typer.Exit(2)
    return client, parsed


def _priority(value: str | None) -> int | None:
    if value is None:
        return None
    if value in PRIORITIES:
        return PRIORITIES[value]
    try:
        return int(value)
    except ValueError:
        raise BadArguments(f"--priority {value!r}: use high, normal, low or an integer") from None


class _SubmitCommand(TyperCommand):
    """`submit` tells a spec from a plain command by the `--` before it: click drops the `--`
    from the arguments it hands on, so the words after it are noted here first."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # Any: typer's own click
        if "--" in args:
            ctx.meta["nightshift.command"] = args[args.index("--") + 1 :]
        return super().parse_args(ctx, args)


WATCH_HELP = (
    "Stay and follow the job to its end: its log across attempts and a live status line; "
    "exit 0 succeeded, 6 failed, 7 cancelled"
)


def submit(
    ctx: typer.Context,
    target: list[str] = typer.Argument(
        None,
        metavar="SPEC | -- CMD ARGS…",
        help="An experiment spec (YAML), or after `--` a command line to run as it is",
        show_default=False,
    ),
    priority: str | None = typer.Option(None, "--priority", help="high | normal | low | N"),
    cost: str | None = typer.Option(None, "--cost", help="urgent | cost_sensitive"),
    cheap: bool = typer.Option(
        False, "--cheap", help="Wait for cheap hours (the tariff's): --cost cost_sensitive"
    ),
    param: list[str] = typer.Option([], "--param", help="k=v override (YAML value)"),
    name: str | None = typer.Option(
        None, "--name", help="A command's job name; default: its program's (train for train.py)"
    ),
    gpus: int | None = typer.Option(None, "--gpus", help="GPUs a command needs; default 0"),
    after: int | None = typer.Option(
        None, "--after", help="A command starts only once job JOB has succeeded", metavar="JOB"
    ),
    retries: int | None = typer.Option(
        None, "--retries", help="More attempts for a failing command; default 0"
    ),
    at: str | None = typer.Option(
        None, "--at", help="A command starts no sooner than HH:MM (next) or an ISO date-time"
    ),
    watch: bool = typer.Option(False, "--watch", "-w", help=WATCH_HELP),
    as_json: bool = typer.Option(False, "--json"),
    config: str | None = typer.Option(None, "--config"),
) -> None:
    """Queue a job and return at once (or, with --watch, follow it to its end). Either from a
    spec — one job per trial of its search_space grid — or from a plain command line, as
    `sbatch --wrap` does: `nightshift submit --gpus 1 -- python train.py --lr 3e-4` runs in the
    current folder, its metrics the step and loss it prints, through the same policy and audit
    as a spec. Options after `--` are the command's."""
    command = ctx.meta.get("nightshift.command")
    given = list(target or [])
    if command is not None:
        if len(given) > len(command):
            raise BadArguments(
                f"{given[0]!r} before `--`: give a SPEC or a command after `--`, not both"
            )
        options = {"name": name, "gpus": gpus, "after": after, "retries": retries, "at": at}
        ids, group = _submit_command(command, config, options, priority, _cost(cost, cheap))
    else:
        if len(given) != 1:
            raise BadArguments(
                "give one SPEC (a YAML file), or a command after `--`: "
                "nightshift submit -- python train.py"
                if not given
                else f"{given[1]!r}: one SPEC at a time; a command line goes after `--`"
            )
        only = {"--name": name, "--gpus": gpus, "--after": after, "--retries": retries, "--at": at}
        for option, value in only.items():
            if value is not None:
                raise BadArguments(
                    f"{option} is for a plain command (nightshift submit {option} … -- CMD); "
                    "a spec says it in its own fields"
                )
        ids, group = _submit_spec(Path(given[0]), config, priority, _cost(cost, cheap), param)
        if watch and len(ids) > 1:
            err_console.print(
                "--watch follows one job: `nightshift logs JOB -f` follows each of these"
            )
    if as_json:
        print(json.dumps({"job_ids": ids, "group": group}))
    else:
        say("queued job(s) {}{}", ", ".join(map(str, ids)), f" as sweep {group}" if group else "")
    if watch and len(ids) == 1:
        from nightshift.agent.brain.wiring import Wiring
        from nightshift.agent.doors.follow import follow

        raise typer.Exit(follow(Wiring.load(config), ids[0], live_status=True))


def _cost(cost: str | None, cheap: bool) -> str | None:
    if cost not in (None, "urgent", "cost_sensitive"):
        raise BadArguments(f"--cost {cost!r}: use urgent or cost_sensitive")
    if cheap and cost == "urgent":
        raise BadArguments("--cheap and --cost urgent: give one of them")
    return "cost_sensitive" if cheap else cost


def _submit_spec(
    spec: Path, config: str | None, priority: str | None, cost: str | None, param: list[str]
) -> tuple[list[int], str | None]:
    client, parsed = checked_spec(spec, config)
    if parsed.search:
        raise BadArguments(
            f"{spec}: its search: section is sampled by a sweep, which `submit` does not run: "
            f"`nightshift sweep {spec}` starts it (an Optuna search under the sweep: budget); "
            "to run the parameters as they are once, remove search: (a search_space: grid of "
            "lists is what `submit` expands, one job per trial)"
        )
    overrides = parse_key_values(param, "--param")
    trials = [{**t, **overrides} for t in parsed.grid()]
    group = f"{parsed.name}-{uuid.uuid4().hex[:8]}" if len(trials) > 1 else None
    items: list[dict[str, Any]] = []
    for params in trials:
        args: dict[str, Any] = {
            "spec_path": str(spec.resolve()),
            "params": params,
            "group": group,
            "cost_class": cost,
        }
        if priority is not None:
            args["priority"] = _priority(priority)
        items.append(args)
    # One trial is one submit_job; a sweep's trials are one decision, all or none.
    if len(items) > 1:
        ids = [j.job_id for j in client.call("submit_jobs", {"items": items}).jobs]
    else:
        ids = [client.call("submit_job", items[0]).job_id]
    return ids, group


def _submit_command(
    argv: list[str],
    config: str | None,
    options: dict[str, Any],
    priority: str | None,
    cost: str | None,
) -> tuple[list[int], None]:
    """One job of a plain command line: its spec mapping, then submit_job(spec=…) as for a
    spec file (the daemon's, for its client)."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.api import Client
    from nightshift.agent.doors.remote import remote_of
    from nightshift.runtime.command_spec import command_spec, default_name

    w = Wiring.load(config)
    client: Any = remote_of(w) or Client(w)
    after = options["after"]
    spec = command_spec(
        _on_path(argv),
        cwd=Path.cwd(),
        name=options["name"] or (default_name(argv) if argv and argv[0] else None),
        gpus=options["gpus"] or 0,
        after=None if after is None else _job_name(client, after),
        cheap=cost == "cost_sensitive",
        retries=options["retries"] or 0,
        at=options["at"],
    )
    args: dict[str, Any] = {"spec": spec}
    if priority is not None:
        args["priority"] = _priority(priority)
    return [client.call("submit_job", args).job_id], None


def _on_path(argv: list[str]) -> list[str]:
    """The program as this shell finds it (`python` from the active virtualenv, a tool in the
    user's own bin): the daemon runs it with its own PATH, where it may be another or none."""
    if not argv or not argv[0] or "/" in argv[0]:
        return argv
    found = shutil.which(argv[0])
    return [found, *argv[1:]] if found else argv


def _job_name(client: Any, job_id: int) -> str:
    """The name `--after JOB` waits on (dependencies are by name: a job of that name that has
    succeeded, or succeeds, lets the new one start)."""
    from nightshift.runtime.errors import UnknownJob

    try:
        job: Any = client.call("show_job", {"job_id": job_id})
    except UnknownJob:
        raise BadArguments(
            f"--after {job_id}: no job {job_id}; `nightshift jobs` lists them"
        ) from None
    if job.state in ("failed", "cancelled"):
        err_console.print(
            styled(
                "note: job {} is {}: this one waits until a job named {} succeeds "
                "(`nightshift retry {}`)",
                job_id,
                job.state,
                job.name,
                job_id,
            ),
            soft_wrap=True,
        )
    return str(job.name)


def jobs(
    state: list[str] = typer.Option([], "--state", help="Only these states"),
    as_json: bool = typer.Option(False, "--json"),
    watch: bool = typer.Option(
        False, "--watch", help="Print the table again every --interval seconds, until Ctrl-C"
    ),
    interval: float = typer.Option(
        2.0, "--interval", min=0.1, help="Seconds between two tables with --watch"
    ),
    config: str | None = typer.Option(None, "--config"),
) -> None:
    """Queue, running and finished jobs: why each waiting job waits, and why a failed (or
    retrying) job failed — the diagnosis's category and evidence line; `nightshift why JOB`
    gives the whole diagnosis and its fix. With --watch, the table is printed afresh every
    --interval seconds (at a terminal in place, as `watch squeue` does) until Ctrl-C."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.store.quick_read import JOB_STATES

    unknown = [x for x in state if x not in JOB_STATES]
    if unknown:
        raise BadArguments(f"--state {unknown[0]!r}: use one of {', '.join(JOB_STATES)}")
    if watch and as_json:
        raise BadArguments("--watch and --json: --watch prints tables for a person; give one")
    w = Wiring.load(config)
    if watch:
        _watch(w, state, interval)
        return
    out = _job_rows(w, state)
    if as_json:
        print(json.dumps(out, indent=2))
        return
    _print_jobs(out)


def _job_rows(w: Any, state: list[str]) -> list[dict[str, Any]]:
    return _remote_jobs(w, state) if w.served_at is not None else _local_jobs(w, state)


def _print_jobs(out: list[dict[str, Any]]) -> None:
    print_table(
        "jobs",
        ["id", "name", "state", "prio", "cost", "attempts", "why"],
        [
            [
                r["id"],
                r["name"],
                r["state"],
                r["priority"],
                r["cost_class"],
                r["attempts"],
                r["why"],
            ]
            for r in out
        ],
    )


def _watch(w: Any, state: list[str], interval: float) -> None:
    """The jobs table every `interval` seconds until Ctrl-C (exit 0, no traceback): at a
    terminal the screen is cleared first and a header names the time and the interval, as
    `watch` shows it; without one each table simply follows the last."""
    import time
    from datetime import datetime

    at_terminal = console.is_terminal
    try:
        while True:
            rows = _job_rows(w, state)
            if at_terminal:
                console.clear()
            say(
                "[dim]every {} s · {} · Ctrl-C to stop[/]",
                f"{interval:g}",
                datetime.now().strftime("%H:%M:%S"),
            )
            _print_jobs(rows)
            console.file.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def _local_jobs(w: Any, state: list[str]) -> list[dict[str, Any]]:
    """The rows from this process's own store (the single-user mode): a direct read, no policy
    stack and no audit. A SQLite store at HEAD is read without the ORM (quick_read.py)."""
    from nightshift.agent.doors.console import FULL_PATH_ENV
    from nightshift.runtime.store.quick_read import job_rows
    from nightshift.runtime.training.attempt_diagnosis import Diagnosis

    rows: list[Any] | None = None
    if not os.environ.get(FULL_PATH_ENV):
        s = w.settings
        rows = job_rows(s.store_url, state, s.store.busy_timeout_s)
    if rows is None:
        rows = _orm_job_rows(w, state)
    return [_row(j, j.attempts, Diagnosis.stored(j.diagnosis)) for j in rows]


def _orm_job_rows(w: Any, state: list[str]) -> list[Any]:
    """The same rows through the Store (any database; migrates an older store first)."""
    from types import SimpleNamespace

    from sqlmodel import select

    from nightshift.runtime.store.db import Attempt, Job

    with w.store.session() as s:
        q = select(Job).order_by(Job.id)
        if state:
            q = q.where(Job.state.in_(state))
        rows = list(s.exec(q))
        counts: dict[int, int] = {}
        newest: dict[int, Any] = {}  # each job's newest attempt's diagnosis
        for job_id, diagnosis in s.exec(
            select(Attempt.job_id, Attempt.diagnosis).order_by(Attempt.number)
        ):
            counts[job_id] = counts.get(job_id, 0) + 1
            newest[job_id] = diagnosis
    return [
        SimpleNamespace(
            id=j.id,
            name=j.name,
            state=j.state,
            priority=j.priority,
            cost_class=j.spec.get("cost_class"),
            group=j.group,
            reason=j.reason,
            hold_reason=j.hold_reason,
            attempts=counts.get(j.id, 0),  # type: ignore[arg-type]
            diagnosis=newest.get(j.id),  # type: ignore[arg-type]
        )
        for j in rows
    ]


def _remote_jobs(w: Any, state: list[str]) -> list[dict[str, Any]]:
    """The same rows from the daemon, through list_jobs (a read through its gate)."""
    from nightshift.agent.doors.remote import Remote

    r: Any = Remote(w.served_at).call(
        "list_jobs", {"states": state or None, "limit": 10_000}, via="terminal"
    )
    return [
        _row(j, len(j.attempts), j.attempts[-1].diagnosis if j.attempts else None)
        for j in sorted(r.jobs, key=lambda j: j.id)
    ]


def _row(j: Any, attempts: int, diagnosis: Any) -> dict[str, Any]:
    """One row of `jobs`, from the store's rows or the daemon's list_jobs alike."""
    return {
        "id": j.id,
        "name": j.name,
        "state": j.state,
        "priority": j.priority,
        "cost_class": j.cost_class,
        "attempts": attempts,
        "group": j.group,
        "why": why_of(j.state, j.reason, j.hold_reason, diagnosis),
        "diagnosis": diagnosis.model_dump() if diagnosis else None,
    }


def why_of(state: str, reason: str | None, hold_reason: str | None, diagnosis: Any) -> str | None:
    """The "why" of one row: why a queued job waits, why a job stopped; for a failed job, and a
    queued one retrying after a failure, its newest attempt's diagnosis first (category and
    evidence, cut short; only a failed attempt has one), ahead of the wait."""
    why = hold_reason if state == "queued" else reason
    if diagnosis is None or state not in ("failed", "queued"):
        return why
    brief = diagnosis.brief()
    if state == "queued":
        return f"{brief} · {why or 'retry queued'}"
    return str(brief)


def register(app: typer.Typer) -> None:
    app.command(cls=_SubmitCommand)(submit)
    app.command()(jobs)
