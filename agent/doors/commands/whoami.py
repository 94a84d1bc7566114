"""`nightshift whoami`: who nightshift takes you for, and why — the kernel's answer, never a name
you set: your OS user in the single-user mode, your uid on the daemon's socket in a shared one."""

from __future__ import annotations

import json
import os
from typing import Any

import typer

from nightshift.agent.doors.console import say


def whoami(
    as_json: bool = typer.Option(False, "--json"),
    config: str | None = typer.Option(None, "--config"),
) -> None:
    """Who you are to nightshift (and the policy), and whether the daemon or this process decides."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.remote import remote_of

    w = Wiring.load(config)
    remote = remote_of(w)
    if remote is not None:
        info: dict[str, Any] = {"mode": "client", **remote.whoami()}
        how = (
            f"uid {info['uid']} on the daemon's socket {info['socket']} (the daemon runs as "
            f"{info['daemon_user']} and owns the store; its policy decides)"
        )
    else:
        pol = w.policy
        info = {
            "mode": "embedded",
            "principal": w.user,
            "uid": os.geteuid(),
            "canonical": pol.canonical(w.user),
            "roles": pol.roles_of(w.user),
            "may_approve": pol.may_approve(w.user),
            "home": str(w.settings.home_path),
            "policy_file": w.settings.policy.file,
        }
        how = (
            f"OS user of this process, uid {info['uid']} (single-user mode: this process opens "
            f"the store in {info['home']} itself)"
        )
    if as_json:
        print(json.dumps(info, indent=2))
        return
    say(
        "[bold]{}[/]: {}\n  roles {}; {} vote on other principals' approvals; policy {}",
        info["principal"],
        how,
        ", ".join(info["roles"]),
        "may" if info["may_approve"] else "may not",
        info["policy_file"] or "the shipped default",
    )


def register(app: typer.Typer) -> None:
    app.command()(whoami)
