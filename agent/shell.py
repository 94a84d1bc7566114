"""What a person at a shell goes through for one skill call: the gate, and — when a rule asks —
an approval prompt at the terminal (or a wait for a decision from another shell or channel)."""

from __future__ import annotations

import json
import select
import sys
import time
import uuid
from typing import Any

from pydantic import BaseModel

from nightshift.agent.api import Client
from nightshift.agent.console import console
from nightshift.agent.wiring import Wiring, local_now
from nightshift.runtime.errors import PolicyDenied


def wait_for_approval(w: Wiring, req: dict[str, Any]) -> str:
    """Ask at the terminal when there is one; otherwise (cron, CI) wait for a decision from any
    channel until the approval is decided or expires. Returns approved | rejected | expired."""
    aid = req["approval_id"]
    console.print(f"[bold yellow]approval {aid} needed[/]: {req['skill']} {json.dumps(req['args'])} "
                  f"(rule {req['rule']}, quorum {req['quorum']})\n"
                  f"  decide from any shell: [bold]nightshift approve {aid}[/] / "
                  f"[bold]nightshift reject {aid}[/]")
    interactive = sys.stdin is not None and sys.stdin.isatty()
    if interactive:
        console.print(f"  approve as {w.user}? [y/N] ", end="")
    while True:
        state = w.approvals.status(aid, local_now()).state
        if state != "pending":
            console.print(f"  approval {aid}: {state}")
            return state
        if interactive and select.select([sys.stdin], [], [], 1.0)[0]:
            answer = sys.stdin.readline().strip().lower()
            try:
                w.approvals.vote(aid, w.user, answer in ("y", "yes"), local_now())
            except PolicyDenied as exc:
                console.print(f"  [red]{exc}[/] — waiting for another approver")
                interactive = False
        else:
            time.sleep(1.0)


def call_as_user(w: Wiring, name: str, args: dict[str, Any]) -> BaseModel:
    """One skill call from the shell, as the local user, through the gate; waits for an approval
    at the terminal (or from another shell) when the policy asks for one."""
    return Client(w).call(name, args, call_id=f"cli-{uuid.uuid4().hex[:12]}",
                          wait=lambda req: wait_for_approval(w, req))
