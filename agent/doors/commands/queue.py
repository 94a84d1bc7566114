"""`nightshift submit` and `nightshift jobs`: queue work and see why each job waits."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import typer

from nightshift.agent.doors.console import console, error, say, table
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


def submit(
    spec: Path = typer.Argument(..., help="Experiment spec (YAML)"),
    priority: str | None = typer.Option(None, "--priority", help="high | normal | low | N"),
    cost: str | None = typer.Option(None, "--cost", help="urgent | cost_sensitive"),
    param: list[str] = typer.Option([], "--param", help="k=v override (YAML value)"),
    as_json: bool = typer.Option(False, "--json"),
    config: str | None = typer.Option(None, "--config"),
) -> None:
    """Queue a job — or one per trial of the spec's search_space grid — and return at once."""
    client, parsed = checked_spec(spec, config)
    if cost not in (None, "urgent", "cost_sensitive"):
        raise BadArguments(f"--cost {cost!r}: use urgent or cost_sensitive")
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
    if as_json:
        print(json.dumps({"job_ids": ids, "group": group}))
    else:
        say("queued job(s) {}{}", ", ".join(map(str, ids)), f" as sweep {group}" if group else "")


def jobs(
    state: list[str] = typer.Option([], "--state", help="Only these states"),
    as_json: bool = typer.Option(False, "--json"),
    config: str | None = typer.Option(None, "--config"),
) -> None:
    """Queue, running and finished jobs: why each waiting job waits, and why a failed (or
    retrying) job failed — the diagnosis's category and evidence line; `nightshift why JOB`
    gives the whole diagnosis and its fix."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.store.db import JOB_STATES

    unknown = [x for x in state if x not in JOB_STATES]
    if unknown:
        raise BadArguments(f"--state {unknown[0]!r}: use one of {', '.join(JOB_STATES)}")
    w = Wiring.load(config)
    out = _remote_jobs(w, state) if w.served_at is not None else _local_jobs(w, state)
    if as_json:
        print(json.dumps(out, indent=2))
        return
    console.print(
        table(
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
    )


def _local_jobs(w: Any, state: list[str]) -> list[dict[str, Any]]:
    """The rows from this process's own store (the single-user mode): no policy stack."""
    from sqlmodel import select

    from nightshift.runtime.store.db import Attempt, Job
    from nightshift.runtime.training.attempt_diagnosis import Diagnosis

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
    out = []
    for j in rows:
        diagnosis = Diagnosis.stored(newest.get(j.id))
        out.append(
            {
                "id": j.id,
                "name": j.name,
                "state": j.state,
                "priority": j.priority,
                "cost_class": j.spec.get("cost_class"),
                "attempts": counts.get(j.id, 0),
                "group": j.group,
                "why": why_of(j.state, j.reason, j.hold_reason, diagnosis),
                "diagnosis": diagnosis.model_dump() if diagnosis else None,
            }
        )
    return out


def _remote_jobs(w: Any, state: list[str]) -> list[dict[str, Any]]:
    """The same rows from the daemon, through list_jobs (a read through its gate)."""
    from nightshift.agent.doors.remote import Remote

    r: Any = Remote(w.served_at).call(
        "list_jobs", {"states": state or None, "limit": 10_000}, via="terminal"
    )
    out = []
    for j in sorted(r.jobs, key=lambda j: j.id):
        diagnosis = j.attempts[-1].diagnosis if j.attempts else None
        out.append(
            {
                "id": j.id,
                "name": j.name,
                "state": j.state,
                "priority": j.priority,
                "cost_class": j.cost_class,
                "attempts": len(j.attempts),
                "group": j.group,
                "why": why_of(j.state, j.reason, j.hold_reason, diagnosis),
                "diagnosis": diagnosis.model_dump() if diagnosis else None,
            }
        )
    return out


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
    app.command()(submit)
    app.command()(jobs)
