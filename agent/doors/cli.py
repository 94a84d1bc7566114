"""The `nightshift` command: goal runs, single skill calls, status, approvals, audit, kill switch."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from nightshift.agent.doors.commands import register_all
from nightshift.agent.doors.console import (
    console,
    err_console,
    error,
    key_values,
    say,
    table,
)
from nightshift.runtime.errors import BadArguments, NightshiftError

if TYPE_CHECKING:
    from nightshift.agent.brain.planner import Planner
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.store.db import Approval, Attempt

# A command imports what it needs when it runs: the store (SQLAlchemy), the policy stack and the
# agent's graph (LangGraph) take a second or more to import, and `--help` or `jobs` would pay it.

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="nightshift: works the night shift on deep-learning GPU servers.",
)
audit_app = typer.Typer(no_args_is_help=True, help="The hash-chained audit log.")
approvals_app = typer.Typer(no_args_is_help=True, help="Approvals: list, show, approve, reject.")
config_app = typer.Typer(no_args_is_help=True, help="Effective configuration.")
app.add_typer(audit_app, name="audit")
app.add_typer(approvals_app, name="approvals")
app.add_typer(config_app, name="config")

ConfigOpt = typer.Option(
    None, "--config", help="Config file (default $NIGHTSHIFT_HOME/config.yaml)"
)


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        print(f"nightshift {version('nightshift')}")
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the installed version and exit.",
    ),
) -> None:
    """nightshift: works the night shift on deep-learning GPU servers."""


# ------------------------------------------------------------------------------------ run
@app.command()
def run(
    goal_file: Path | None = typer.Argument(None, help="Goal file (YAML)"),
    resume: str | None = typer.Option(None, "--resume", help="Resume the run with this thread id"),
    recover: int | None = typer.Option(None, "--recover", help="Run the recover playbook on job N"),
    config: str | None = ConfigOpt,
) -> None:
    """Run a goal file end to end (or resume an interrupted run)."""
    # The agent's graph (LangGraph, LangChain) is imported by the commands that run it only: it
    # takes a second, and every other command would pay it.
    from langgraph.types import Command

    from nightshift.agent.brain.goals import load_goal, recover_goal
    from nightshift.agent.brain.graph import build_graph, recorded_goal, sqlite_checkpointer
    from nightshift.agent.brain.wiring import Wiring, local_now
    from nightshift.agent.doors.console import progress_printer
    from nightshift.agent.doors.prompts import wait_for_decision
    from nightshift.agent.doors.summary import run_summary, thread_jobs
    from nightshift.runtime.user_files import regular_file

    if sum(x is not None for x in (goal_file, resume, recover)) != 1:
        error("give exactly one of GOAL_FILE, --resume THREAD or --recover JOB")
        raise typer.Exit(2)
    if resume is not None and not resume:
        raise BadArguments("--resume '': give the thread id the run printed when it started")
    goal = None
    if goal_file is not None:  # a FIFO or a device is refused before anything opens it
        regular_file(goal_file, "GOAL_FILE")
        goal = load_goal(goal_file)  # a bad goal stops here: nothing opened, nothing run
    w = Wiring.load(config)
    w.refuse_if_served()
    checkpointer = sqlite_checkpointer(w)
    if resume is not None:  # the planner the interrupted goal asked for
        recorded = recorded_goal(w, checkpointer, resume)
        if recorded is None:
            error(f"no run with thread id '{resume}' in {w.settings.home_path}")
            raise typer.Exit(2)
        asked = recorded.get("planner")
    else:
        if recover is not None:
            goal = recover_goal(recover)
        assert goal is not None
        asked = goal.planner
    progress = progress_printer(job_state=lambda job_id: _job_state(w, job_id))
    graph = build_graph(
        w,
        _planner(w, asked),
        checkpointer=checkpointer,
        on_progress=progress,
    )
    started = time.monotonic()
    if resume is not None:
        thread = resume
    else:
        assert goal is not None
        thread = f"{goal.name}-{local_now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:4]}"
    cfg = _cfg(thread)
    try:
        if resume is not None:
            say("[bold]resuming[/] thread {}", thread)
            _own_loop(w, thread)
            result = graph.resume(cfg, lambda approval_id: wait_for_decision(w, approval_id))
        else:
            assert goal is not None
            say(
                "[bold]nightshift[/] goal [bold]{}[/] · thread {} · as OS user [bold]{}[/] "
                "(single-user mode)\n[dim](if interrupted: nightshift run --resume {})[/]",
                goal.name,
                thread,
                w.user,
                thread,
            )
            _own_loop(w, thread)
            result = graph.invoke(
                {"goal": goal.model_dump(mode="json"), "history": [], "on_behalf_of": w.user}, cfg
            )
        while "__interrupt__" in result:
            req = result["__interrupt__"][0].value
            result = graph.invoke(Command(resume=wait_for_decision(w, req["approval_id"])), cfg)
        # Without a daemon, this process owns the loop until every job of the goal has ended.
        w.engine.run_until_settled(thread_jobs(w, thread))
    except KeyboardInterrupt:
        progress.close()
        _interrupted(w, thread)
        raise typer.Exit(130) from None
    finally:
        progress.close()
    w.engine.stop_background()  # harmless when the daemon owns the loop
    w.drain_opinions()  # the models' opinions on this goal's failures, still on their way
    w.stop_mirror()  # MLflow shows how the goal's jobs ended (a bounded last pass)
    fin = result.get("finish") or {"ok": False, "summary": "run ended without a result"}
    console.print(run_summary(w, thread, time.monotonic() - started))
    raise typer.Exit(
        0 if fin["ok"] else 2 if fin.get("bad_input") else 5 if fin.get("operator") else 1
    )


def _job_state(w: Wiring, job_id: int) -> str | None:
    """A job's state now, for `run`'s status line."""
    job = w.store.job(job_id)
    return job.state if job is not None else None


def _interrupted(w: Wiring, thread: str) -> None:
    """Ctrl-C in `nightshift run`: stop this process's loop and say what it leaves behind — each
    job of the goal still queued or running, and the commands that act on it."""
    import signal

    from nightshift.agent.doors.daemon import DaemonLock
    from nightshift.agent.doors.summary import thread_jobs

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut this report short
    w.engine.stop_background()
    daemon = DaemonLock.held(w.settings.home_path)
    err_console.print("\ninterrupted", style="bold yellow")
    left = _still_active(w, thread_jobs(w, thread))
    for job_id, name, state, attempt in left:
        if state == "running" and attempt is not None:
            pid = (attempt.handle or {}).get("pid")
            where = f"attempt {attempt.number} under the {attempt.executor or 'local'} executor" + (
                f", pid {pid}" if pid else ""
            )
            watched = (
                "the daemon watches it"
                if daemon
                else "nothing watches it until `nightshift daemon` runs or the goal resumes"
            )
            err_console.print(
                f"job {job_id} ({name}) keeps running ({where}); {watched}.", markup=False
            )
        else:
            starts = (
                "the daemon starts it"
                if daemon
                else "it starts when `nightshift daemon` runs or the goal resumes"
            )
            err_console.print(f"job {job_id} ({name}) stays {state}; {starts}.", markup=False)
        err_console.print(
            f"  `nightshift cancel {job_id}` to stop it, `nightshift logs {job_id} -f` to follow it",
            markup=False,
        )
    if not left:
        err_console.print("no job of this goal is left queued or running.", markup=False)
    err_console.print(
        f"`nightshift run --resume {thread}` continues the goal where it stopped.", markup=False
    )


def _still_active(w: Wiring, job_ids: list[int]) -> list[tuple[int, str, str, Attempt | None]]:
    """(job id, name, state, last attempt) of each of `job_ids` still queued or running."""
    from sqlmodel import col, select

    from nightshift.runtime.store.db import Attempt, Job
    from nightshift.runtime.store.lifecycle import ACTIVE

    if not job_ids:
        return []
    active = [state.value for state in ACTIVE]
    out: list[tuple[int, str, str, Attempt | None]] = []
    with w.store.session() as s:
        jobs = s.exec(
            select(Job).where(col(Job.id).in_(job_ids), col(Job.state).in_(active)).order_by(Job.id)
        ).all()
        for job in jobs:
            last = s.exec(
                select(Attempt).where(Attempt.job_id == job.id).order_by(col(Attempt.number).desc())
            ).first()
            assert job.id is not None
            out.append((job.id, job.name, job.state, last))
    return out


def _planner(w: Wiring, asked: str | None) -> Planner:
    """The deterministic planner, which never calls a model; the LLM planner only for a goal that
    says `planner: llm`, and then an endpoint must be configured (exit 2 if not)."""
    from nightshift.agent.brain.planner import DeterministicPlanner

    if asked != "llm":
        return DeterministicPlanner()
    from nightshift.agent.brain.llm import NO_ENDPOINT, LLMPlanner, endpoint

    ep = endpoint(w.settings)
    if ep is None:
        error(f"the goal says planner: llm, but {NO_ENDPOINT}")
        raise typer.Exit(2)

    def step(s: dict[str, Any]) -> None:
        cost = f", cost {s['cost']:g}" if s.get("cost") is not None else ""
        what = s.get("error") or f"→ {s.get('tool') or 'answer'}"
        say(
            "[dim]  model step {}: {}+{} tokens, {} s{} {}[/]",
            s["step"],
            s.get("prompt_tokens", 0),
            s.get("completion_tokens", 0),
            f"{s['latency_s']:.2f}",
            cost,
            what,
        )

    say("[dim]planner: llm, {}[/]", ep.describe())
    return LLMPlanner.from_settings(w.settings, audit=w.audit, on_step=step)


def _own_loop(w: Wiring, thread: str) -> None:
    """Without a daemon, run the scheduler/monitor loop in this process, starting only this goal's
    jobs; with one, submit and watch through the store and leave the loop to it."""
    from nightshift.agent.doors.daemon import DaemonLock
    from nightshift.agent.doors.summary import thread_jobs

    if DaemonLock.held(w.settings.home_path):
        console.print("[dim]a nightshift daemon is running: it places and watches the jobs[/]")
        w.engine.passive = True
        return
    w.engine.scope = lambda: set(thread_jobs(w, thread))
    w.engine.start_background()


def _cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "recursion_limit": 500}


# ------------------------------------------------------------------------------------ skills
@app.command("skills")
def skills_cmd(as_json: bool = typer.Option(False, "--json")) -> None:
    """List registered skills with their capability."""
    from nightshift.skills.registry import registry

    found = registry()
    if as_json:
        console.print_json(json.dumps([s.tool_schema() for s in found.values()]))
        return
    console.print(
        table(
            "skills",
            ["name", "capability", "description"],
            [
                [s.name, s.capability, s.description.split("\n")[0][:90]]
                for s in sorted(found.values(), key=lambda s: s.name)
            ],
        )
    )


@app.command("skill")
def skill_cmd(
    name: str,
    arg: list[str] = typer.Option([], "--arg", help="key=value (value parsed as YAML)"),
    as_json: bool = typer.Option(False, "--json", help="Print the result model as JSON"),
    wait: bool = typer.Option(
        False,
        "--wait",
        help="Without a terminal, wait for an approval's decision (else exit 4 at once)",
    ),
    yes: bool = typer.Option(
        False,
        "--yes",
        help="Confirm your own call without asking, where the policy lets the requester confirm it",
    ),
    config: str | None = ConfigOpt,
) -> None:
    """Call one skill through the policy gate and print its result. A call that needs an
    approval is confirmed y/N at a terminal where the policy lets you (--yes: without asking);
    one left to others waits at a terminal, and in a script exits 4 naming the approval (--wait:
    waits)."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.shell import call_as_user, parse_key_values
    from nightshift.skills.registry import get_skill

    w = Wiring.load(config)
    if w.served_at is None:
        get_skill(name)  # an unknown name fails before any argument is parsed (else: the daemon's)
    result = call_as_user(w, name, parse_key_values(arg), wait=wait, yes=yes, as_json=as_json)
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        console.print(result, markup=False)


# ------------------------------------------------------------------------------------ audit
@audit_app.command("show")
def audit_show(
    limit: int = typer.Option(50, "--limit", min=1),
    job: int | None = typer.Option(None, "--job"),
    as_json: bool = typer.Option(False, "--json"),
    config: str | None = ConfigOpt,
) -> None:
    """Print the newest audit events."""
    from nightshift.agent.brain.wiring import Wiring

    w = Wiring.load(config)
    events = list(reversed(w.audit.events(limit=limit, job_id=job, newest_first=True)))
    if as_json:
        print(json.dumps([e.model_dump(mode="json") for e in events], indent=2))
        return
    console.print(
        table(
            "audit",
            ["id", "time", "actor", "action", "skill", "job", "detail"],
            [
                [
                    e.id,
                    e.ts,
                    e.actor,
                    e.action,
                    e.skill,
                    e.job_id,
                    json.dumps(e.payload, default=str)[:100],
                ]
                for e in events
            ],
        )
    )


# ------------------------------------------------------------------------------------ approvals
def _approval_rows(rows: list[Approval]) -> list[list[Any]]:
    return [
        [
            a.id,
            a.state,
            a.skill,
            json.dumps(a.args)[:60],
            a.requester,
            a.rule,
            f"{len({v['principal'] for v in a.votes if v.get('approve')})}/{a.quorum}",
            a.expires_at,
        ]
        for a in rows
    ]


@approvals_app.command("list")
def approvals_list(
    config: str | None = ConfigOpt,
    all_: bool = typer.Option(False, "--all", help="Every approval, not only pending"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Pending approvals (or all with --all): pending → approved/rejected/expired → executed/failed."""
    from sqlmodel import select

    from nightshift.agent.brain.wiring import Wiring, local_now
    from nightshift.runtime.store.db import Approval

    w = Wiring.load(config)
    from nightshift.agent.doors.remote import remote_of

    remote = remote_of(w)
    if remote is not None:
        rows = remote.approvals(all_)
    elif all_:
        with w.store.session() as s:
            rows = list(s.exec(select(Approval).order_by(Approval.id)))
    else:
        rows = w.approvals.pending(local_now())
    if as_json:
        print(json.dumps([a.model_dump(mode="json") for a in rows], indent=2))
        return
    console.print(
        table(
            "approvals",
            ["id", "state", "skill", "args", "requester", "rule", "votes", "expires"],
            _approval_rows(rows),
        )
    )


@approvals_app.command("show")
def approvals_show(
    approval_id: int, config: str | None = ConfigOpt, as_json: bool = typer.Option(False, "--json")
) -> None:
    """One approval in full: the call, the files it names, votes, and what running it did."""
    from nightshift.agent.brain.wiring import Wiring, local_now

    w = Wiring.load(config)
    from nightshift.agent.doors.remote import remote_of

    remote = remote_of(w)
    a = (
        remote.approval(approval_id)
        if remote is not None
        else w.approvals.status(approval_id, local_now())
    )
    if as_json:
        print(json.dumps(a.model_dump(mode="json"), indent=2))
        return
    pairs: tuple[tuple[str, Any], ...] = (
        ("skill", a.skill),
        ("call", a.call_id),
        ("requester", a.requester),
        ("via", a.requested_via),
        ("rule", a.rule),
        ("quorum", a.quorum),
        ("args", json.dumps(a.args, indent=1)),
        ("files", "\n".join(f"{p} sha256 {d}" for p, d in a.files.items()) or "-"),
        (
            "votes",
            "\n".join(
                f"{v['principal']}: {'yes' if v['approve'] else 'no'}"
                f"{' (confirmation)' if v.get('confirmation') else ''}"
                f" at {v['at']}"
                for v in a.votes
            )
            or "-",
        ),
        ("expires", a.expires_at),
        ("decided", a.decided_at),
        ("carried out by", a.claimed_by),
        ("executed", a.executed_at),
        ("result", json.dumps(a.result) if a.result is not None else "-"),
        ("error", a.error or "-"),
    )
    console.print(
        key_values(
            f"approval {a.id} · {a.state}",
            [(key, "-" if value is None else value) for key, value in pairs],
        )
    )


def _vote(approval_id: int, approve: bool, config: str | None) -> None:
    from nightshift.agent.brain.wiring import Wiring, local_now

    w = Wiring.load(config)
    from nightshift.agent.doors.remote import remote_of

    remote = remote_of(w)
    if remote is not None:  # the daemon counts the vote under this connection's uid
        voter, a = remote.vote(approval_id, approve)
    else:
        voter, a = w.user, w.approvals.vote(approval_id, w.user, approve, local_now())
    say("approval {}: {} ({} voted {})", a.id, a.state, voter, "yes" if approve else "no")
    if a.state == "approved":
        console.print(
            "  the requester's shell carries it out if it still waits; otherwise the "
            "daemon (or `nightshift run --resume` for a goal's call) does, once"
        )


@approvals_app.command("approve")
def approvals_approve(approval_id: int, config: str | None = ConfigOpt) -> None:
    """Approve another principal's pending call (as your OS user; never your own call)."""
    _vote(approval_id, True, config)


@approvals_app.command("reject")
def approvals_reject(approval_id: int, config: str | None = ConfigOpt) -> None:
    """Reject a pending call (the requester may withdraw its own); it never runs."""
    _vote(approval_id, False, config)


app.command("approve", help="Alias of `nightshift approvals approve`.")(approvals_approve)
app.command("reject", help="Alias of `nightshift approvals reject`.")(approvals_reject)


# ------------------------------------------------------------------------------------ kill switch
@app.command()
def pause(
    reason: str = typer.Option("paused by operator", "--reason"), config: str | None = ConfigOpt
) -> None:
    """Kill switch: stop every action but reads until `nightshift resume`."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.policies import killswitch

    w = Wiring.load(config)
    killswitch.pause(w.store, w.audit, w.user, reason)
    console.print("[bold red]paused[/]: only read skills run until `nightshift resume`")


@app.command("resume")
def resume_cmd(config: str | None = ConfigOpt) -> None:
    """Lift the kill switch."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.policies import killswitch

    w = Wiring.load(config)
    killswitch.resume(w.store, w.audit, w.user)
    console.print("[green]resumed[/]")


@config_app.command("show")
def config_show(
    config: str | None = ConfigOpt, as_json: bool = typer.Option(False, "--json")
) -> None:
    """Every effective setting and where it came from: one left unset shows what is used in its
    place (store, socket, runs folder, audit key under the home folder); secrets are masked."""
    from nightshift.agent.doors.effective_settings import effective_rows
    from nightshift.runtime.config import load_settings_with_sources

    settings, sources = load_settings_with_sources(config)
    rows = effective_rows(settings, sources)
    if as_json:
        print(json.dumps({k: {"value": v, "from": f} for k, v, f in rows}, indent=2, default=str))
        return
    console.print(table("config", ["key", "value", "from"], rows))


register_all(app)


def main() -> None:
    """The `nightshift` command: any NightshiftError a command leaves uncaught is one error line
    and its exit code, never a traceback."""
    try:
        app()
    except NightshiftError as exc:
        error(str(exc))
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()
