"""The daemon's API as it travels on its Unix socket: one JSON object per line, each way.

A client sends a request and reads one reply. Two requests answer with more than one line: a
call the requester may confirm at a terminal first sends the request to confirm (`confirm`) and
reads the answer (`ConfirmAnswer`) from the same connection, so only the peer that made the call
can answer it; `logs.follow` follows a whole job after one decision of the gate: an event per
attempt's header, per batch of log lines and per change of the job's status, then the job's end.

Nothing in a request says who asks: the daemon takes the peer's uid from the kernel. Unknown
fields are refused, so a request carrying `principal` or `user` is an error, never obeyed.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from nightshift.runtime import errors
from nightshift.runtime.errors import NightshiftError


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WhoAmI(_Request):
    op: Literal["whoami"]


class Call(_Request):
    """One skill call through the daemon's gate, as the peer."""

    op: Literal["call"]
    skill: str = Field(max_length=200)
    args: dict[str, Any] = Field(default_factory=dict)
    call_id: str | None = Field(
        None, max_length=200, description="Repeat a call (after an approval) under its id"
    )
    via: Literal["terminal", "chat", "api"] = "api"
    interactive: bool = Field(
        False, description="A person at a terminal can answer a confirmation on this connection"
    )


class FollowLogs(_Request):
    """Follow a job to its end (agent/doors/follow.py): one audited decision whether the peer
    may read its logs, then FollowEvent replies until the job has ended for good."""

    op: Literal["logs.follow"]
    job_id: int
    attempt: int | None = Field(None, ge=1, description="Start at this attempt; default: the first")
    tail: int = Field(100, ge=1, le=5000)


class JobStatus(BaseModel):
    """What the live status line says: `job 7 running · attempt 2 · step 130 · loss 0.412`."""

    job_id: int
    state: str = ""
    reason: str | None = None
    attempt: int | None = None
    step: int | None = None
    loss: float | None = None


class FollowEvent(BaseModel):
    """One step of a job's follow, the same in-process and on the daemon's socket: an attempt's
    `header`, its log `lines` (data, never instructions), the job's `status` when it changed,
    `waiting` while no attempt has started, and `end` once the job has ended for good."""

    kind: Literal["header", "lines", "status", "waiting", "end"]
    text: str | None = Field(None, description="header: the header line")
    lines: list[str] | None = None
    status: JobStatus | None = Field(None, description="status, waiting, end: the job now")
    attempts: int | None = Field(None, description="end: how many attempts the job had")


class ApprovalsList(_Request):
    op: Literal["approvals.list"]
    all: bool = False


class ApprovalShow(_Request):
    op: Literal["approvals.show"]
    approval_id: int


class ApprovalWait(_Request):
    """Answers once the approval is no longer pending, or after `timeout_s` (a client waiting
    for other people's votes asks again)."""

    op: Literal["approvals.wait"]
    approval_id: int
    timeout_s: float = Field(20.0, gt=0, le=30)


class Vote(_Request):
    op: Literal["approvals.vote"]
    approval_id: int
    approve: bool


class WebTokenOp(_Request):
    """Make, revoke or list the peer's own web dashboard tokens (`nightshift web token`)."""

    op: Literal["web.token"]
    action: Literal["issue", "revoke", "list"]
    token_id: int | None = None


class ConfirmAnswer(_Request):
    """The requester's y/N, only read in answer to a `confirm` on the same connection."""

    op: Literal["confirm"]
    approval_id: int
    yes: bool


Request = Annotated[
    WhoAmI
    | Call
    | FollowLogs
    | ApprovalsList
    | ApprovalShow
    | ApprovalWait
    | Vote
    | WebTokenOp
    | ConfirmAnswer,
    Field(discriminator="op"),
]
REQUEST: TypeAdapter[Request] = TypeAdapter(Request)


class ErrorInfo(BaseModel):
    """A NightshiftError as it travels: its class (the client raises the same one), its message
    and exit code, and what an approval or an in-doubt call needs to be taken up again."""

    type: str
    message: str
    exit_code: int
    approval_id: int | None = None
    call_id: str | None = None
    skill: str | None = None
    quorum: int | None = None
    rule: str | None = None
    job_ids: list[int] = Field(default_factory=list)
    approval: dict[str, Any] | None = Field(None, description="The pending request in full")


class Reply(BaseModel):
    kind: Literal["result", "error", "confirm", "event"]
    result: Any = None
    error: ErrorInfo | None = None
    confirm: dict[str, Any] | None = None
    event: FollowEvent | None = None


def error_info(exc: NightshiftError, approval: dict[str, Any] | None = None) -> ErrorInfo:
    return ErrorInfo(
        type=type(exc).__name__,
        message=str(exc),
        exit_code=exc.exit_code,
        approval_id=getattr(exc, "approval_id", None),
        call_id=getattr(exc, "call_id", None),
        skill=getattr(exc, "skill", None),
        quorum=getattr(exc, "quorum", None),
        rule=getattr(exc, "rule", None),
        job_ids=list(getattr(exc, "job_ids", None) or []),
        approval=approval,
    )


# The branch of the error tree for an exit code, for an error class this install does not know.
_BY_EXIT: dict[int, type[NightshiftError]] = {
    cls.exit_code: cls
    for cls in (
        errors.SkillFailed,
        errors.BadArguments,
        errors.Refused,
        errors.ApprovalRequired,
        errors.OperatorError,
    )
}


def to_exception(info: ErrorInfo) -> NightshiftError:
    """The error the daemon raised, raised here: same class (or its branch), message and exit
    code, so the CLI says and exits the same as in the single-user mode."""
    found = getattr(errors, info.type, None)
    cls: type[NightshiftError] = (
        found
        if isinstance(found, type) and issubclass(found, NightshiftError)
        else _BY_EXIT.get(info.exit_code, NightshiftError)
    )
    exc = Exception.__new__(cls)  # the classes' own __init__ differ; the fields are set below
    Exception.__init__(exc, info.message)
    for name in ("approval_id", "call_id", "skill", "quorum", "rule", "job_ids"):
        setattr(exc, name, getattr(info, name))
    return exc


# Framing --------------------------------------------------------------------------------------


class TooLarge(Exception):
    """A line longer than the reader's limit."""


class LineReader:
    """Whole lines from a socket, each at most `limit` bytes and read within `timeout_s` of
    asking for it (a peer that trickles bytes cannot hold a reader longer than that)."""

    def __init__(self, sock: socket.socket, limit: int):
        self.sock = sock
        self.limit = limit
        self.buf = bytearray()

    def line(self, timeout_s: float | None) -> bytes | None:
        """The next line without its newline; None at the end of input (a partial last line
        is dropped). TimeoutError after `timeout_s`, TooLarge past the limit."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                if end > self.limit:
                    raise TooLarge
                line = bytes(self.buf[:end])
                del self.buf[: end + 1]
                return line
            if len(self.buf) > self.limit:
                raise TooLarge
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.sock.settimeout(left)
            else:
                self.sock.settimeout(None)
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return None
            self.buf += chunk


def send(
    sock: socket.socket, message: BaseModel | dict[str, Any], timeout_s: float | None = None
) -> None:
    """One line; a peer that reads nothing for `timeout_s` gets TimeoutError, not a hang."""
    data = (
        message.model_dump_json(exclude_none=True)
        if isinstance(message, BaseModel)
        else json.dumps(message)
    )
    sock.settimeout(timeout_s)
    sock.sendall(data.encode() + b"\n")
