"""`nightshift reproduce JOB` and `nightshift compare JOB JOB…`: a run again from what was
recorded as it started (reproduce_job, a launch through the gate, as the calling user), and runs
side by side (compare_jobs, a read) with their curves overlaid in a PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from nightshift.agent.doors.console import print_table, say
from nightshift.agent.doors.shell import call_or_exit

ConfigOpt = typer.Option(None, "--config", help="Config file")


def reproduce(
    job_id: int = typer.Argument(..., help="The job to reproduce"),
    attempt: int | None = typer.Option(
        None, "--attempt", help="Its attempt to reproduce; default: the newest with provenance"
    ),
    strict: bool = typer.Option(
        False,
        "--strict",
        help="Refuse (exit 2) when today's package list or data fingerprint differ from the "
        "recorded ones, instead of warning",
    ),
    worktree: str | None = typer.Option(
        None, "--worktree", help="Where to check the commit out (default: under the runs folder)"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
    wait: bool = typer.Option(
        False, "--wait", help="Without a terminal, wait for an approval's decision"
    ),
    yes: bool = typer.Option(False, "--yes", help="Confirm your own call without asking"),
    config: str | None = ConfigOpt,
) -> None:
    """Queue a new job that reruns a recorded attempt: its git commit checked out into a worktree
    of its own with the recorded uncommitted diff applied, its image pinned by digest, the same
    interpreter, command, parameters, seed and environment. Warns when today's packages or data
    differ from the recorded ones (--strict: refuses, exit 2)."""
    args: dict[str, Any] = {"job_id": job_id, "strict": strict}
    if attempt is not None:
        args["attempt"] = attempt
    if worktree is not None:
        args["worktree"] = str(Path(worktree).expanduser().absolute())
    r: Any = call_or_exit(config, "reproduce_job", args, wait=wait, yes=yes, as_json=as_json)
    if as_json:
        print(r.model_dump_json(indent=2))
        return
    say(
        "queued job {} ({}) reproducing job {} attempt {}",
        r.job_id,
        r.name,
        r.source_job_id,
        r.source_attempt,
    )
    if r.commit:
        diff = f", diff {r.diff_applied[:12]} applied" if r.diff_applied else ""
        say("  code   {} @ {}{}", r.worktree, r.commit[:12], diff)
    else:
        say("  code   {}", r.code_path)
    if r.image:
        say("  image  {}", r.image)
    if r.python:
        say("  python {}", r.python)
    say("  seed   {}; params {}", r.seed, json.dumps(r.params, sort_keys=True))
    for w in r.warnings:
        say("  [yellow]warning:[/] {}", w, soft_wrap=True)
    if r.already_done:
        say("  (this call had already queued it)")


def compare(
    job_ids: list[int] = typer.Argument(..., help="Two or more jobs"),
    plot: str | None = typer.Option(
        None,
        "--plot",
        help="Where to write the PNG of their curves overlaid "
        "(default: ./compare-<ids>.png; 'none' writes none)",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON"),
    config: str | None = ConfigOpt,
) -> None:
    """Jobs side by side: parameters, final and best metric, how their provenance differs from
    the first job's (commit, dirty diff, packages, image, seed, data, GPU, driver, host), and a
    PNG of their curves overlaid, written beside where you are (its path is printed)."""
    if len(job_ids) < 2:
        from nightshift.runtime.errors import BadArguments

        raise BadArguments("compare needs two or more jobs: nightshift compare JOB JOB…")
    r: Any = call_or_exit(config, "compare_jobs", {"job_ids": job_ids})
    where: Path | None = None
    if (plot or "").lower() != "none":
        where = Path(plot or f"compare-{'-'.join(str(j) for j in job_ids)}.png").absolute()
        if not plot_curves(r, where):
            where = None
    if as_json:
        data = r.model_dump(mode="json")
        data["plot"] = str(where) if where else None
        print(json.dumps(data, indent=2))
        return
    print_report(r)
    if where is not None:
        say("curves overlaid: {}", where)
    else:
        say("[dim]no plot written[/]")


def print_report(r: Any) -> None:
    keys = sorted({k for j in r.jobs for k in j.params})
    head = ["", *[f"job {j.job_id}" for j in r.jobs]]
    rows: list[list[Any]] = [
        ["name", *[j.name for j in r.jobs]],
        ["state", *[j.state for j in r.jobs]],
    ]
    for k in keys:
        mark = " *" if k in r.params_differ else ""
        rows.append([f"{k}{mark}", *[_v(j.params.get(k)) for j in r.jobs]])
    rows.append(
        [
            "final",
            *[
                f"{j.metric} {_num(j.final)} @ {j.final_step}" if j.final is not None else "-"
                for j in r.jobs
            ],
        ]
    )
    rows.append(
        [
            "best",
            *[
                f"{j.metric} {_num(j.best)} @ {j.best_step} ({j.mode})"
                if j.best is not None
                else "-"
                for j in r.jobs
            ],
        ]
    )
    print_table("compared (* parameters that differ)", head, rows)
    first = r.jobs[0]
    for j in r.jobs[1:]:
        if j.provenance is None or first.provenance is None:
            say("provenance, job {} vs job {}: not recorded for both", j.job_id, first.job_id)
        elif not j.differences:
            say("provenance, job {} vs job {}: the same", j.job_id, first.job_id)
        else:
            from nightshift.runtime.training.provenance import short

            say("provenance, job {} vs job {}:", j.job_id, first.job_id)
            for d in j.differences:
                say("  {}: {} → {}", d.field, short(d.first), short(d.this), soft_wrap=True)


def _v(v: Any) -> str:
    return "-" if v is None else str(v)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.6g}"


def plot_curves(r: Any, path: Path) -> bool:
    """Each job's metric curve overlaid, one line per job; False without matplotlib or points."""
    if not any(j.curve for j in r.jobs):
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for j in r.jobs:
        if j.curve:
            steps, values = zip(*j.curve, strict=True)
            ax.plot(steps, values, label=f"job {j.job_id} {j.name}", linewidth=1.2)
    metrics = sorted({j.metric for j in r.jobs})
    ax.set_xlabel("step")
    ax.set_ylabel(", ".join(metrics))
    ax.set_title("nightshift compare " + " ".join(str(j.job_id) for j in r.jobs))
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def register(app: typer.Typer) -> None:
    for command in (reproduce, compare):
        app.command()(command)
