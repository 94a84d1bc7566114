"""The CLI as a client of the daemon's socket (the wiring's `served_at` says when it is one).

A shared install: the daemon runs as its own user, which alone can read and write the state, and
serves the API (agent/doors/api_server.py). With `api.mode: auto` (the default) a command is its client
when the socket `api.socket` (default `$NIGHTSHIFT_HOME/api.sock`) belongs to another user than
the caller — or, while no daemon runs, when the folder it lives in does (a folder root owns, such
as /tmp, says nothing). Otherwise it is the single-user embedded mode: the caller's own store,
opened in-process, the caller being its OS user. `api.mode: client` always goes through the
socket; `embedded` never does.

In client mode only the caller's `api.*` settings matter: policy, store, executor and the rest
are the daemon's, and so is who the caller is (their uid, from the kernel).
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from nightshift.agent.doors.console import console, err_console
from nightshift.agent.doors.wire import FollowEvent, LineReader, Reply, send, to_exception
from nightshift.runtime.errors import ApprovalRequired, OperatorError

if TYPE_CHECKING:
    from rich.console import Console

    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.store.db import Approval


def remote_of(w: Wiring) -> Remote | None:
    """The client of the daemon's socket when this command is one (the wiring says when), else
    None: the single-user embedded mode."""
    return Remote(w.served_at) if w.served_at is not None else None


class RemoteResult(BaseModel):
    """A skill's result when this install does not know the skill (a plugin of the daemon's)."""

    model_config = ConfigDict(extra="allow")


class Remote:
    """Requests to the daemon at `path`, one connection each."""

    def __init__(self, path: Path):
        self.path = path

    # Transport -----------------------------------------------------------------------------------

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(self.path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise OperatorError(
                f"no nightshift daemon answers on {self.path} ({exc.strerror}): start it "
                "(`nightshift daemon`, as the daemon's user), or set api.mode: embedded for "
                "the single-user mode"
            ) from None
        except PermissionError:
            sock.close()
            raise OperatorError(
                f"cannot connect to the daemon's socket {self.path}: permission denied; its "
                "admin decides who may connect (api.socket_mode, api.socket_group, and the "
                "folders above it)"
            ) from None
        except OSError as exc:
            sock.close()
            raise OperatorError(f"cannot connect to {self.path}: {exc}") from None
        return sock

    def request(
        self,
        req: dict[str, Any],
        *,
        confirm: Callable[[dict[str, Any]], bool] | None = None,
        on_event: Callable[[FollowEvent], None] | None = None,
    ) -> Any:
        """Send one request; answer the daemon's confirmation (if it asks) with `confirm`;
        return the result, or raise the daemon's error as the same NightshiftError. With
        `on_event`, hand it every `event` reply until the `end` one (then None)."""
        with self._connect() as sock:
            reader = LineReader(sock, 1 << 30)
            try:
                send(sock, req)
            except OSError as exc:
                raise OperatorError(f"the connection to {self.path} broke: {exc}") from None
            while True:
                try:
                    line = reader.line(None)
                except OSError as exc:
                    raise OperatorError(f"the connection to {self.path} broke: {exc}") from None
                if line is None:
                    if on_event is not None:
                        return None
                    raise OperatorError(
                        f"the daemon at {self.path} closed the connection without an answer "
                        "(stopping? its log says)"
                    )
                reply = Reply.model_validate_json(line)
                if reply.kind == "error":
                    assert reply.error is not None
                    raise to_exception(reply.error)
                if reply.kind == "confirm":
                    asked = reply.confirm or {}
                    yes = confirm(asked) if confirm is not None else False
                    # An answer later than api.confirm_timeout_s was taken as no: the daemon
                    # may have hung up already, and its reply, still to read, says so.
                    with contextlib.suppress(OSError):
                        send(
                            sock, {"op": "confirm", "approval_id": asked["approval_id"], "yes": yes}
                        )
                elif reply.kind == "event":
                    if on_event is not None and reply.event is not None:
                        on_event(reply.event)
                        if reply.event.kind == "end":
                            return None  # the last one: hang up
                else:
                    return reply.result

    # Operations ----------------------------------------------------------------------------------

    def whoami(self) -> dict[str, Any]:
        return self.request({"op": "whoami"})  # type: ignore[no-any-return]

    def web_token(self, action: str, token_id: int | None = None) -> dict[str, Any]:
        """Make, revoke or list this uid's own web dashboard tokens, on the daemon's store."""
        return self.request(  # type: ignore[no-any-return]
            {"op": "web.token", "action": action, "token_id": token_id}
        )

    def call(
        self,
        skill: str,
        args: dict[str, Any],
        *,
        call_id: str | None = None,
        via: str = "api",
        confirm: Callable[[dict[str, Any]], bool] | None = None,
    ) -> BaseModel:
        """One skill call through the daemon's gate, as this process's uid."""
        from nightshift.skills.registry import find_skill

        out = self.request(
            {
                "op": "call",
                "skill": skill,
                "args": args,
                "call_id": call_id,
                "via": via,
                "interactive": confirm is not None,
            },
            confirm=confirm,
        )
        known = find_skill(skill)
        model = known.output_model if known is not None else RemoteResult
        return model.model_validate(out)

    def call_as_user(
        self,
        skill: str,
        args: dict[str, Any],
        *,
        yes: bool = False,
        wait: bool = False,
        as_json: bool = False,
    ) -> BaseModel:
        """What `call_as_user` does in the embedded mode, through the daemon: where the policy
        lets the requester confirm, the daemon asks on this connection and a terminal answers
        y/N (`yes`: answered yes without asking). A call left to other principals waits for
        their votes at a terminal or with `wait`, then asks again under the same call id (the
        daemon runs it once); without either it raises ApprovalRequired at once."""
        from nightshift.agent.doors.prompts import at_terminal, confirmer

        confirm = confirmer(yes)
        block = wait or at_terminal()
        call_id = f"cli-{uuid.uuid4().hex[:12]}"
        while True:
            try:
                return self.call(skill, args, call_id=call_id, via="terminal", confirm=confirm)
            except ApprovalRequired as exc:
                if not block:
                    raise
                call_id = exc.call_id  # the daemon's name for it
                self.wait_for_decision(exc.approval_id, err_console if as_json else console)
                confirm = None  # asked once; now it is the others' decision that counts

    def wait_for_decision(self, approval_id: int, out: Console = console) -> str:
        """Wait until others decide or the approval expires, saying what for (on `out`); Ctrl-C
        leaves it pending (once approved, the daemon carries it out)."""
        from nightshift.agent.doors.prompts import announce_wait, say_expiry

        row = self.approval(approval_id)
        announce_wait(row, out)
        last_said = time.monotonic()
        while row.state == "pending":
            last_said = say_expiry(row, last_said, out)
            row = self._approval_row(
                self.request({"op": "approvals.wait", "approval_id": approval_id})
            )
        out.print(f"  approval {approval_id}: {row.state}")
        return row.state

    def approvals(self, every: bool = False) -> list[Approval]:
        rows = self.request({"op": "approvals.list", "all": every})
        return [self._approval_row(r) for r in rows]

    def approval(self, approval_id: int) -> Approval:
        return self._approval_row(
            self.request({"op": "approvals.show", "approval_id": approval_id})
        )

    def vote(self, approval_id: int, approve: bool) -> tuple[str, Approval]:
        """(the name the daemon counted the vote under, the approval after it)."""
        out = self.request({"op": "approvals.vote", "approval_id": approval_id, "approve": approve})
        return out["voter"], self._approval_row(out["approval"])

    def follow(
        self,
        job_id: int,
        attempt: int | None,
        tail: int,
        on_event: Callable[[FollowEvent], None],
    ) -> None:
        """Follow a job to its end through the daemon: its gate decides once whether this uid
        may read the job's logs, then the daemon sends the follow's events (agent/doors/follow.py)
        until the job has ended for good (the `end` event) or Ctrl-C hangs up."""
        self.request(
            {"op": "logs.follow", "job_id": job_id, "attempt": attempt, "tail": tail},
            on_event=on_event,
        )

    @staticmethod
    def _approval_row(data: dict[str, Any]) -> Approval:
        from nightshift.runtime.store.db import Approval

        return Approval.model_validate(data)
