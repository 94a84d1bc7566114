"""`nightshift submit` and `nightshift jobs`: queue work (a spec, or a plain command line) and
see why each job waits."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand

from nightshift.agent.doors import job_views
from nightshift.agent.doors.console import (
    console,
    err_console,
    error,
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
    from nightshift.runtime.store.quick_read import JOB_STATES

    unknown = [x for x in state if x not in JOB_STATES]
    if unknown:
        raise BadArguments(f"--state {unknown[0]!r}: use one of {', '.join(JOB_STATES)}")
    if watch and as_json:
        raise BadArguments("--watch and --json: --watch prints tables for a person; give one")
    if watch:
        _watch(config, state, interval)
        return
    from nightshift.agent.doors import quick

    rows = quick.rows_and_switch(config, state, switch=False)[0]
    job_views.answer_jobs(rows, as_json=as_json)


def _watch(config: str | None, state: list[str], interval: float) -> None:
    """The jobs table every `interval` seconds until Ctrl-C (exit 0, no traceback): at a
    terminal the screen is cleared first and a header names the time and the interval, as
    `watch` shows it; without one each table simply follows the last."""
    import time
    from datetime import datetime

    from nightshift.agent.doors import quick

    at_terminal = console.is_terminal
    try:
        while True:
            rows = quick.rows_and_switch(config, state, switch=False)[0]
            if at_terminal:
                console.clear()
            say(
                "[dim]every {} s · {} · Ctrl-C to stop[/]",
                f"{interval:g}",
                datetime.now().strftime("%H:%M:%S"),
            )
            job_views.print_jobs(rows)
            console.file.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def status(
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON"),
    config: str | None = typer.Option(None, "--config"),
) -> None:
    """How things stand, at a glance: how many jobs are in each state, whether the kill switch
    is on, every running job with its step and loss, the queued jobs that run next and why they
    wait, the newest failures and why they failed. `jobs` lists every job."""
    from nightshift.agent.doors import quick

    job_views.answer_status(*quick.rows_and_switch(config, []), as_json=as_json)


def register(app: typer.Typer) -> None:
    app.command(cls=_SubmitCommand)(submit)
    app.command()(jobs)
    app.command()(status)
