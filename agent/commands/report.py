"""`nightshift report`: the night's summary, on the terminal or as Markdown with a plot."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from nightshift.agent.console import console, table

if TYPE_CHECKING:
    from nightshift.agent.wiring import Wiring


def report(
    hours: float = typer.Option(24.0, "--hours", min=0.01, help="Look back this many hours"),
    markdown: Path | None = typer.Option(
        None, "--markdown", help="Write Markdown (+ PNG plot) here"
    ),
    as_json: bool = typer.Option(False, "--json"),
    notify: bool = typer.Option(
        False, "--notify", help="Also queue it for Slack / WeChat Work (the daemon posts it)"
    ),
    config: str | None = typer.Option(None, "--config"),
) -> None:
    """Jobs, attempts, failures by cause, recoveries, GPU-hours, kWh and cost."""
    from nightshift.agent.report import default_window, plot_metrics, report_of, to_markdown
    from nightshift.agent.wiring import Wiring, local_now

    w = Wiring.load(config)
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
            + (f" and {plot}" if has_plot else " (no plot: pip install 'nightshift[report]')")
        )
        return
    console.print(to_markdown(r).split("## Jobs")[0].strip())
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


def _queue_for_channels(w: Wiring, hours: float) -> None:
    from nightshift.agent.channels.service import ChannelService, report_notice
    from nightshift.agent.wiring import local_now
    from nightshift.runtime.errors import ConfigError

    service = ChannelService(w, say=console.print)
    if not service.active:
        raise ConfigError(
            "--notify: no channel is configured (README, 'Approvals on Slack and WeChat Work')"
        )
    now = local_now()
    notice = report_notice(w, now, f"{now:%Y-%m-%dT%H:%M}", hours)
    service.outbox.queue_notice(notice)
    console.print(
        f"queued for {', '.join(service.built.channels)}: the daemon posts it (`nightshift daemon`)"
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
