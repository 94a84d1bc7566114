"""`nightshift audit verify [--against FILE]` and `nightshift audit publish`: check the signed
chain against its anchor, the heads published outside the store and the job and attempt rows;
publish the newest head now (to the configured file and syslog, and on stdout to keep elsewhere).

The two commands join the `audit` group that agent/doors/cli.py declares (beside its `show`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from nightshift.agent.doors.console import console, error, say
from nightshift.runtime.user_files import regular_file

if TYPE_CHECKING:
    from nightshift.policies.audit import AuditLog

ConfigOpt = typer.Option(None, "--config", help="Config file")


def _log(config: str | None) -> AuditLog:
    """The log as configured (the key file, the publish sinks)."""
    from nightshift.agent.brain.wiring import Wiring

    return Wiring.load(config).audit


def verify(
    against: Path | None = typer.Option(
        None,
        "--against",
        help="Published heads (JSON lines) to check against; default audit.publish_file",
    ),
    config: str | None = ConfigOpt,
) -> None:
    """Check the chain, each event's signature, the anchor, the published heads and that every job
    and attempt has its events; OK, or the first thing wrong."""
    log = _log(config)
    if against is not None and against.exists():  # a FIFO or a device is refused, never opened
        regular_file(against, "--against")
    res = log.verify(against=against)
    if not res.ok:
        error(
            f"audit chain broken at event {res.first_bad_id}: {res.reason}"
            if res.first_bad_id is not None
            else f"audit not intact: {res.reason}"
        )
        raise typer.Exit(1)
    if res.unaudited_jobs:
        error(f"audit not intact: {res.reason}")
        raise typer.Exit(1)
    heads = (
        f", {res.heads_checked} published heads match"
        if res.heads_checked
        else " (no published heads to check: set audit.publish_file, keep it elsewhere)"
    )
    say("[green]OK[/]: {} audit events, chain, signatures and anchor intact{}", res.count, heads)
    if res.unanchored or res.unsigned or ";" in res.reason:  # more to say than "intact"
        console.print(res.reason, markup=False, highlight=False)


def publish(config: str | None = ConfigOpt) -> None:
    """Publish the newest head now: to audit.publish_file and syslog when configured, and print
    it (keep the line somewhere the store's owner cannot rewrite)."""
    head = _log(config).publish_head()
    if head is None:
        console.print("the audit log is empty: nothing to publish")
        return
    print(json.dumps(head, sort_keys=True))


def register(app: typer.Typer) -> None:
    group = next(g.typer_instance for g in app.registered_groups if g.name == "audit")
    assert group is not None
    group.command("verify")(verify)
    group.command("publish")(publish)
