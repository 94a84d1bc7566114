"""`nightshift web token`: a sign-in token for the web dashboard, for the OS user who runs it
(in a shared install, the uid the daemon's socket reports); shown once, kept hashed."""

from __future__ import annotations

import json
from typing import Any

import typer

from nightshift.agent.doors.console import say

web_app = typer.Typer(help="The web dashboard served by the daemon (web.listen).")


@web_app.command("token")
def token(
    revoke: bool = typer.Option(
        False, "--revoke", help="Revoke your tokens (all of them, or --id's) instead"
    ),
    token_id: int | None = typer.Option(None, "--id", help="With --revoke: only this token"),
    show_list: bool = typer.Option(False, "--list", help="List your tokens (never their secrets)"),
    as_json: bool = typer.Option(False, "--json"),
    config: str | None = typer.Option(None, "--config"),
) -> None:
    """Make a token that signs you in to the web dashboard (shown once: keep it), or revoke."""
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.agent.doors.remote import remote_of
    from nightshift.agent.doors.web.tokens import token_op

    action = "revoke" if revoke else "list" if show_list else "issue"
    w = Wiring.load(config)
    remote = remote_of(w)
    out: dict[str, Any] = (
        remote.web_token(action, token_id)
        if remote is not None
        else token_op(w, w.user, action, token_id)
    )
    if as_json:
        print(json.dumps(out, indent=2))
        return
    if action == "issue":
        listen = w.settings.web.listen
        say("Web dashboard token {} for [bold]{}[/], shown once:", out["id"], out["user"])
        say("{}", out["token"], soft_wrap=True)
        say("End it with `nightshift web token --revoke --id {}`", out["id"])
        if listen:
            say("Sign in at http://{}/login (or open /?token=… once)", listen)
        else:
            say("The daemon serves the dashboard once web.listen is set (e.g. 127.0.0.1:8470)")
    elif action == "revoke":
        ids = out["revoked"]
        say("revoked {}", ", ".join(map(str, ids)) if ids else "nothing (no live token matched)")
    else:
        for t in out["tokens"]:
            state = f"revoked {t['revoked_at']}" if t["revoked_at"] else "live"
            say("{}  made {}  {}", t["id"], t["created_at"], state)


def register(app: typer.Typer) -> None:
    app.add_typer(web_app, name="web")
