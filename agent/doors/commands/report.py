"""`nightshift report`: the night's summary, on the terminal or as Markdown with a plot."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from nightshift.agent.doors.console import console, table

if TYPE_CHECKING:
    from nightshift.agent.brain.wiring import Wiring


def report(
    hours: float = typer.Option(24.0, "--hours", min=0.01, help="Look back this many hours"),
    markdown: Path | None = typer.Option(
        None, "--markdown", help="Write Markdown (+ PNG plot) here"
    ),
    as_json: bool = typer.Option(False, "--json"),
    notify: bool = typer.Option(
        False, "--notify", help="Also queue it for Slack / WeChat Work (the daemon posts it)"
    ),
    sweep: str | None = typer.Option(
        None, "--sweep", help="One sweep instead: best trial, trials, plot, GPU-hours saved"
    ),
    config: str | None = typer.Option(None, "--config"),
) -> None:
    """Jobs, attempts, failures by cause, recoveries, GPU-hours, kWh and cost."""
    from nightshift.agent.brain.wiring import Wiring, local_now
    from nightshift.agent.doors.report import default_window, plot_metrics, report_of, to_markdown

    w = Wiring.load(config)
    if sweep is not None:
        _sweep_report(w, sweep, markdown, as_json)
        return
    since, until = default_window(local_now(), hours)
    r = report_of(w, since, until)
    head = _publish_head(w)
    if notify:
        _queue_for_channels(w, hours)
    if as_json:
        print(r.model_dump_json(indent=2))
        return
    if markdown is not None:
        plot = markdown.with_suffix(".png")
        has_plot = plot_metrics(w.store, [j.id for j in r.jobs], plot)
        markdown.write_text(to_markdown(r, plot.name if has_plot else None) + f"\n{head}\n")
        console.print(
            f"wrote {markdown}"
            + (f" and {plot}" if has_plot else " (no plot: pip install 'nightshift[report]')"),
            markup=False,
        )
        return
    # Job names, reasons and causes are the jobs' own: printed as they are, never as markup.
    console.print(to_markdown(r).split("## Jobs")[0].strip(), markup=False)
    console.print(
        table(
            "jobs",
            ["id", "name", "state", "attempts", "final", "note"],
            [
                [
                    j.id,
                    j.name,
                    j.state,
                    j.attempts,
                    None if j.final_metric is None else f"{j.metric} {j.final_metric:.4g}",
                    j.reason,
                ]
                for j in r.jobs
            ],
        )
    )
    console.print(head, markup=False, highlight=False)


def _sweep_report(w: Wiring, name: str, markdown: Path | None, as_json: bool) -> None:
    """One sweep: the best trial and its parameters, the trials, GPU-hours used and saved by
    pruning (an estimate), and a plot next to the Markdown (or in $NIGHTSHIFT_HOME/sweeps/)."""
    from nightshift.agent.brain.wiring import local_now
    from nightshift.agent.doors.sweep_report import plot_sweep, sweep_report

    r = sweep_report(w.store, name, local_now())
    if as_json:
        print(r.model_dump_json(indent=2))
        return
    plot = (
        markdown.with_suffix(".png")
        if markdown
        else w.settings.home_path / "sweeps" / f"{name}.png"
    )
    has_plot = plot_sweep(w.store, r, plot)
    best = r.best
    lines = [
        f"# Sweep {r.name} ({r.state}{': ' + r.reason if r.reason else ''})",
        "",
        f"- objective: {r.metric} ({r.mode}) over {', '.join(r.searched)}",
        f"- trials: {len(r.trials)}, {sum(t.state == 'COMPLETE' for t in r.trials)} complete, "
        f"{r.pruned} pruned, {sum(t.state == 'FAIL' for t in r.trials)} failed",
        f"- best: trial {best.number} (job {best.job_id}), {r.metric} {best.value:.6g}, "
        f"params {best.params}"
        if best and best.value is not None
        else "- best: no trial has finished yet",
        f"- GPU-hours used: {r.gpu_hours:.4f} (CPU-only trials count one slot)",
        f"- GPU-hours saved by pruning: {r.saved_gpu_hours:.4f} (an estimate: each pruned "
        "trial's remaining steps at its own seconds per step)",
    ]
    if markdown is not None:
        rows = [
            "| trial | state | value | job | steps | seconds | params |",
            "|---|---|---|---|---|---|---|",
        ]
        rows += [
            f"| {t.number} | {t.state.lower()} | {'' if t.value is None else f'{t.value:.6g}'} | "
            f"{t.job_id or ''} | {t.last_step or ''} | {t.seconds:.1f} | {t.params} |"
            for t in r.trials
        ]
        image = [f"![sweep {r.name}]({plot.name})", ""] if has_plot else []
        markdown.write_text("\n".join([*lines, "", *image, *rows, ""]))
        console.print(f"wrote {markdown}" + (f" and {plot}" if has_plot else ""), markup=False)
        return
    console.print("\n".join(lines), markup=False, highlight=False)
    console.print(
        table(
            "trials",
            ["trial", "state", r.metric, "job", "steps", "seconds", *r.searched],
            [
                [
                    t.number,
                    t.state.lower() + (f" @{t.pruned_at}" if t.pruned_at is not None else ""),
                    None if t.value is None else f"{t.value:.5g}",
                    t.job_id,
                    t.last_step,
                    f"{t.seconds:.1f}",
                    *[_short(t.params.get(k)) for k in r.searched],
                ]
                for t in r.trials
            ],
        )
    )
    console.print(
        f"plot: {plot}" if has_plot else "no plot: pip install 'nightshift[report]'",
        markup=False,
        highlight=False,
    )


def _short(v: object) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _queue_for_channels(w: Wiring, hours: float) -> None:
    from nightshift.agent.brain.wiring import local_now
    from nightshift.agent.doors.channels.service import ChannelService, report_notice
    from nightshift.runtime.errors import ConfigError

    service = ChannelService(w, say=lambda line: console.print(line, markup=False))
    if not service.active:
        raise ConfigError(
            "--notify: no channel is configured (README, 'Approvals on Slack and WeChat Work')"
        )
    now = local_now()
    notice = report_notice(w, now, f"{now:%Y-%m-%dT%H:%M}", hours)
    service.outbox.queue_notice(notice)
    console.print(
        f"queued for {', '.join(service.built.channels)}: the daemon posts it (`nightshift daemon`)",
        markup=False,
    )


def _publish_head(w: Wiring) -> str:
    """Every report publishes the audit's chain head (audit.publish_file, syslog) and names it,
    so a report kept elsewhere is one more copy that catches a rolled-back or truncated log."""
    head = w.audit.publish_head()
    if head is None:
        return "audit head: the log is empty"
    return (
        f"audit head: event {head['seq']}, hash {head['hash']} (check a copy of the log "
        "against it: `nightshift audit verify`)"
    )


def register(app: typer.Typer) -> None:
    app.command()(report)
