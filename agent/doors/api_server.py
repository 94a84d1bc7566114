"""The daemon's API on a Unix socket, where who asks is the peer's uid as the kernel reports it.

`nightshift daemon` serves it (agent/doors/daemon.py); the CLI of a shared install is its client
(agent/doors/remote.py; the messages are agent/doors/wire.py). The principal is `SO_PEERCRED`'s uid → its
user name, handed to the gate as `ctx.principal` and to Approvals as the voter: nothing in a
request can name it, so one person is one voter and never their own approver. Calls go through
the same gate as everywhere (agent/api.Client: validated, decided, audited, run or parked); votes
through the same Approvals. A request refused before the gate (not JSON, too large, unknown
fields such as `principal`, unknown skill, a user name the policy reserves, past the rate) is
audited as `api.refused`, the first `api.refusals_in_full_per_minute` of each uid's minute one
by one and the rest counted into one `api.refused_aggregate` event for the minute
(policies/refusal_tally.py): refusals cannot fill the disk. The reads that are not skills
(whoami, approvals list/show) are audited as `api.read`. A follow of a job (`logs.follow`) is one
decision of the gate, then a stream: its verdict and its end are its only audit events.

One thread per connection, a bounded request line read within a deadline, a cap on each user's
connections and a token bucket on each user's requests (`api.requests_per_s`, `api.burst`): a
client that sends nothing, trickles or floods holds its own thread only, and what it sends past
its rate is answered with a refusal and the time to retry, before any other work.
"""

from __future__ import annotations

import os
import select
import socket
import stat
import struct
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nightshift.agent.brain.wiring import Wiring, local_now, os_user_name
from nightshift.agent.doors.wire import (
    REQUEST,
    ApprovalShow,
    ApprovalsList,
    ApprovalWait,
    Call,
    ConfirmAnswer,
    ErrorInfo,
    FollowLogs,
    LineReader,
    Reply,
    TooLarge,
    Vote,
    WebTokenOp,
    WhoAmI,
    error_info,
    send,
)
from nightshift.policies.gate import PERSON_HERE
from nightshift.policies.refusal_tally import RateLimits, RefusalLog
from nightshift.runtime.errors import (
    ApprovalRequired,
    BadArguments,
    NightshiftError,
    OperatorError,
    PolicyDenied,
    Refused,
)
from nightshift.runtime.executors.submitter import RunAs, account_by_uid
from nightshift.runtime.user_files import reading_as

PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
MAX_SUN_PATH = 107  # sockaddr_un.sun_path is 108 bytes with its NUL


class PeerGone(Exception):
    """The client hung up or stopped reading: its connection ends, quietly."""


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int
    name: str


def peer_of(conn: socket.socket) -> Peer:
    """Who is at the other end, from the kernel (the credentials it had when it connected)."""
    pid, uid, gid = PEERCRED.unpack(
        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size)
    )
    return Peer(pid, uid, gid, os_user_name(uid))


class ApiServer:
    """Serves one Wiring's gate and approvals on `settings.api_socket` until `stop`."""

    def __init__(self, w: Wiring, say: Callable[[str], None] | None = None):
        self.w = w
        self.cfg = w.settings.api
        self.path = w.settings.api_socket
        self.say = say or (lambda message: None)
        self._sock: socket.socket | None = None
        self._inode: int | None = None
        self._stop = threading.Event()
        self._accepting: threading.Thread | None = None
        self._open: Counter[int] = Counter()
        self._lock = threading.Lock()
        self._rates = RateLimits(self.cfg.requests_per_s, self.cfg.burst)
        self.refusals = RefusalLog(
            w.audit,
            local_now,
            action="api.refused",
            aggregate="api.refused_aggregate",
            in_full=self.cfg.refusals_in_full_per_minute,
        )

    # Lifecycle -----------------------------------------------------------------------------------

    def start(self) -> bool:
        """Bind, set the socket's mode and group, and accept in a thread. False (said why) when
        the default path is too long for a socket; an explicit one is an OperatorError."""
        path = self.path
        _ = self.w.gate  # built once, here, not by the first requests' threads at the same time
        if len(os.fsencode(path)) > MAX_SUN_PATH:
            why = (
                f"{path} is longer than a Unix socket path may be ({MAX_SUN_PATH} bytes): "
                "set api.socket to a shorter path"
            )
            if self.cfg.socket is None:
                self.say(f"API not served: {why}")
                return False
            raise OperatorError(f"api.socket {why}")
        try:
            if not path.parent.exists():
                path.parent.mkdir(parents=True, mode=0o755)
            self._clear_stale(path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(path))
            os.chmod(path, self.cfg.socket_mode_bits)
            if self.cfg.socket_group is not None:
                os.chown(path, -1, _gid(self.cfg.socket_group))
            sock.listen(64)
        except OSError as exc:
            raise OperatorError(
                f"cannot serve the API on {path}: {exc.strerror or exc}; set api.socket to a "
                "path the daemon's user can create, or api.serve: false"
            ) from exc
        sock.settimeout(0.5)  # the accept loop looks at the stop flag twice a second
        self._sock, self._inode = sock, path.stat().st_ino
        self._accepting = threading.Thread(target=self._accept, name="api-accept", daemon=True)
        self._accepting.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._accepting is not None:
            self._accepting.join(5)
        self._flush_refusals(final=True)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            try:
                if self.path.stat().st_ino == self._inode:  # ours, not a successor's
                    self.path.unlink()
            except OSError:
                pass

    def _clear_stale(self, path: Path) -> None:
        """A socket file left by a daemon that died is removed; one someone listens on, or a
        file that is no socket, is the operator's to sort out."""
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise OperatorError(f"api.socket {path} exists and is not a socket; move it away")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(2)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)  # nobody listens: stale
            return
        except OSError as exc:
            raise OperatorError(f"cannot tell whether {path} is in use: {exc}") from exc
        finally:
            probe.close()
        raise OperatorError(
            f"another process serves {path} (a nightshift daemon of another home?); stop it, "
            "or give this daemon its own api.socket"
        )

    def _accept(self) -> None:
        while not self._stop.is_set():
            self._flush_refusals()
            sock = self._sock
            if sock is None:
                return
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.1)  # out of descriptors, say: the loop goes on
                continue
            threading.Thread(target=self._serve, args=(conn,), name="api-conn", daemon=True).start()

    # One connection ------------------------------------------------------------------------------

    def _serve(self, conn: socket.socket) -> None:
        try:
            peer = peer_of(conn)
            if peer.uid == os.geteuid() and self.w.settings.jobs_run_as_submitter:
                why = (
                    f"the daemon's own account ({peer.name}) is not a person on its socket: no "
                    "job runs as it, and its own commands open the store themselves "
                    "(api.mode: embedded); run the command as yourself"
                )
                self._refused(peer, "daemon_account", why, b"")
                self._reply_error(conn, PolicyDenied(why))
                return
            with self._lock:
                full = self._open[peer.uid] >= self.cfg.max_connections_per_user
                if not full:
                    self._open[peer.uid] += 1
            if full:
                self._reply_error(
                    conn,
                    OperatorError(
                        f"{peer.name} already has {self.cfg.max_connections_per_user} open "
                        "connections to the daemon (api.max_connections_per_user); close some"
                    ),
                )
                return
            try:
                self._session(conn, peer)
            finally:
                with self._lock:
                    self._open[peer.uid] -= 1
        except Exception:  # never the daemon's end: said in its log, the connection closed
            self.say(f"API connection failed:\n{traceback.format_exc()}")
        finally:
            conn.close()

    @staticmethod
    def _reader_of(peer: Peer) -> RunAs | None:
        """Whose rights the files a peer's call names are read with: the peer's own, where this
        daemon (root) can take them; else the daemon's (README "Shared install")."""
        if os.geteuid() != 0 or peer.uid == os.geteuid():
            return None
        return account_by_uid(peer.uid)

    def _session(self, conn: socket.socket, peer: Peer) -> None:
        reader = LineReader(conn, self.cfg.max_request_bytes)
        while not self._stop.is_set():
            try:
                line = reader.line(self.cfg.idle_timeout_s)
            except (TimeoutError, OSError):
                return
            except TooLarge:
                why = f"request longer than {self.cfg.max_request_bytes} bytes (api.max_request_bytes)"
                self._refused(peer, "too_large", why, b"")
                self._reply_error(conn, BadArguments(why))
                _drain(conn)
                return
            if line is None:
                return
            try:
                wait = self._rates.take(peer.uid, time.monotonic())
                if wait > 0:
                    self._send(conn, self._rate_limited(peer, wait, line))
                    continue
                with reading_as(self._reader_of(peer)):
                    reply = self._answer(conn, reader, peer, line)
                if reply is not None:
                    self._send(conn, reply)
            except PeerGone:
                return

    def _rate_limited(self, peer: Peer, wait: float, line: bytes) -> Reply:
        """The refusal of a request past the peer's rate: tallied, not read any further."""
        why = (
            f"rate limited: {peer.name} sent more than {self.cfg.burst} requests at once or "
            f"{self.cfg.requests_per_s:g} a second (api.burst, api.requests_per_s)"
        )
        self._refused(peer, "rate_limited", why, line)
        return Reply(
            kind="error", error=error_info(Refused(f"{why}; retry in {max(wait, 0.01):.2f} s"))
        )

    def _send(self, conn: socket.socket, reply: Reply) -> None:
        try:
            send(conn, reply, self.cfg.idle_timeout_s)
        except OSError as exc:
            raise PeerGone from exc

    def _answer(
        self, conn: socket.socket, reader: LineReader, peer: Peer, line: bytes
    ) -> Reply | None:
        """The reply to one request line (None when the handler has replied itself). Any error
        is one reply: a NightshiftError as itself, anything else as a skill failure, with the
        traceback in the daemon's log, never on the wire."""
        try:
            reserved = self._reserved(peer)
            if reserved:
                self._refused(peer, "reserved_name", reserved, line)
                raise PolicyDenied(reserved)
            try:
                req = REQUEST.validate_json(line)
            except ValidationError as exc:
                why = _describe(exc)
                self._refused(peer, "bad_request", why, line)
                raise BadArguments(why) from None
            return self._dispatch(conn, reader, peer, req)
        except PeerGone:
            raise
        except ApprovalRequired as exc:
            row = self.w.approvals.get(exc.approval_id).model_dump(mode="json")
            return Reply(kind="error", error=error_info(exc, approval=row))
        except NightshiftError as exc:
            return Reply(kind="error", error=error_info(exc))
        except Exception as exc:
            self.say(
                f"API request from {peer.name} (pid {peer.pid}) failed:\n{traceback.format_exc()}"
            )
            return Reply(
                kind="error",
                error=ErrorInfo(
                    type="SkillFailed", message=f"{type(exc).__name__}: {exc}", exit_code=1
                ),
            )

    def _dispatch(
        self, conn: socket.socket, reader: LineReader, peer: Peer, req: Any
    ) -> Reply | None:
        w = self.w
        if isinstance(req, Call):
            return Reply(kind="result", result=self._call(conn, reader, peer, req))
        if isinstance(req, FollowLogs):
            self._follow(conn, peer, req)
            return None
        if isinstance(req, ApprovalWait):  # a poll, not audited: the decision it waits for is
            end = time.monotonic() + req.timeout_s
            row = w.approvals.status(req.approval_id, local_now())
            while row.state == "pending" and time.monotonic() < end and not self._stop.is_set():
                time.sleep(0.25)
                row = w.approvals.status(req.approval_id, local_now())
            return Reply(kind="result", result=row.model_dump(mode="json"))
        if isinstance(req, Vote):  # audited by Approvals, counted or refused
            row = w.approvals.vote(req.approval_id, peer.name, req.approve, local_now())
            return Reply(
                kind="result", result={"voter": peer.name, "approval": row.model_dump(mode="json")}
            )
        if isinstance(req, WebTokenOp):  # the peer's own tokens only; audited there
            from nightshift.agent.doors.web.tokens import token_op

            return Reply(kind="result", result=token_op(w, peer.name, req.action, req.token_id))
        if isinstance(req, ConfirmAnswer):
            raise BadArguments(
                "a confirmation answers the daemon's question during a call on the same "
                "connection; no call asks one here"
            )
        self._audit(peer, "api.read", {"op": req.op})
        if isinstance(req, WhoAmI):
            return Reply(kind="result", result=self._whoami(peer))
        if isinstance(req, ApprovalShow):
            row = w.approvals.status(req.approval_id, local_now())
            return Reply(kind="result", result=row.model_dump(mode="json"))
        if isinstance(req, ApprovalsList):
            return Reply(
                kind="result", result=[a.model_dump(mode="json") for a in self._approvals(req.all)]
            )
        raise BadArguments(f"unknown op {req.op!r}")

    # The operations ------------------------------------------------------------------------------

    def _call(self, conn: socket.socket, reader: LineReader, peer: Peer, req: Call) -> Any:
        from nightshift.agent.doors.api import Client
        from nightshift.skills.registry import get_skill

        try:
            get_skill(req.skill)
        except BadArguments as exc:
            self._refused(peer, "unknown_skill", str(exc), req.model_dump_json().encode())
            raise
        confirm = None
        if req.interactive and req.via in PERSON_HERE:
            confirm = self._asker(conn, reader)
        result = Client(self.w, principal=peer.name, via=req.via).call(
            req.skill, req.args, call_id=self._call_id(peer, req.call_id), confirm=confirm
        )
        return result.model_dump(mode="json")

    def _call_id(self, peer: Peer, given: str | None) -> str:
        """Call ids are each user's own: one person's id never resumes another's call."""
        if given is None:
            return f"{peer.name}/api-{uuid.uuid4().hex}"
        return given if given.startswith(f"{peer.name}/") else f"{peer.name}/{given}"

    def _asker(self, conn: socket.socket, reader: LineReader) -> Callable[[dict[str, Any]], bool]:
        """The gate's terminal confirmation, asked of this connection's peer (the requester:
        the gate asks only them) and answered on it; silence, a hang-up or garbage is no."""

        def ask(request: dict[str, Any]) -> bool:
            self._send(conn, Reply(kind="confirm", confirm=request))
            try:
                line = reader.line(self.cfg.confirm_timeout_s)
                if line is None:
                    return False
                answer = ConfirmAnswer.model_validate_json(line)
            except (TimeoutError, TooLarge, OSError, ValidationError):
                return False
            return answer.approval_id == request["approval_id"] and answer.yes

        return ask

    def _follow(self, conn: socket.socket, peer: Peer, req: FollowLogs) -> None:
        """Follow a job for the peer until it has ended for good: the gate decides once whether
        they may read its logs (the verdict is the follow's first audit event), then the events
        of agent/doors/follow.py go out as they come; the last audit event counts what was sent
        (lines and bytes, never the lines themselves). This connection's thread is the whole
        cost, and api.max_connections_per_user bounds a user's follows."""
        from nightshift.agent.doors.follow import IDLE_POLL_S, POLL_S, JobFollow, direct_fetcher

        call_id = self._call_id(peer, None)
        args: dict[str, Any] = {"job_id": req.job_id, "tail": req.tail}
        if req.attempt is not None:
            args["attempt"] = req.attempt
        ctx = self.w.context(peer.name, call_id)
        self.w.gate.decide(ctx, "job_logs", args)

        def wait(seconds: float) -> None:
            """Between reads; a hang-up or the daemon's stop ends the follow (PeerGone)."""
            try:
                if select.select([conn], [], [], seconds)[0] and not conn.recv(4096):
                    raise PeerGone  # the client hung up
            except OSError as exc:
                raise PeerGone from exc
            if self._stop.is_set():
                raise PeerGone

        stream = JobFollow(
            direct_fetcher(self.w, peer.name),
            req.job_id,
            tail=req.tail,
            first_attempt=req.attempt,
            poll_s=POLL_S,
            idle_poll_s=IDLE_POLL_S,
            sleep=wait,
        )
        sent = {"lines": 0, "bytes": 0, "events": 0}
        how = "hung_up"
        try:
            for event in stream.events():
                self._send(conn, Reply(kind="event", event=event))
                sent["events"] += 1
                for line in event.lines or []:
                    sent["lines"] += 1
                    sent["bytes"] += len(line.encode()) + 1
                if event.kind == "end":
                    how = event.status.state if event.status else "ended"
        except NightshiftError as exc:
            how = f"error: {type(exc).__name__}"
            raise
        finally:
            try:
                self.w.audit.append(
                    peer.name,
                    "logs.follow.end",
                    skill="job_logs",
                    call_id=call_id,
                    job_id=req.job_id,
                    payload={**sent, "ended": how, "uid": peer.uid, "pid": peer.pid},
                )
            except Exception:  # the follow is over either way; the daemon's log says why
                self.say(
                    f"could not audit the end of {peer.name}'s follow:\n{traceback.format_exc()}"
                )

    def _whoami(self, peer: Peer) -> dict[str, Any]:
        from nightshift.policies.killswitch import pause_info

        pol = self.w.policy
        return {
            "principal": peer.name,
            "uid": peer.uid,
            "pid": peer.pid,
            "canonical": pol.canonical(peer.name),
            "roles": pol.roles_of(peer.name),
            "may_approve": pol.may_approve(peer.name),
            "daemon_user": os_user_name(os.geteuid()),
            "socket": str(self.path),
            "policy_file": self.w.settings.policy.file,
            "paused": pause_info(self.w.store),
        }

    def _approvals(self, every: bool) -> list[Any]:
        if not every:
            return list(self.w.approvals.pending(local_now()))
        from sqlmodel import col, select

        from nightshift.runtime.store.db import Approval

        with self.w.store.session() as s:
            return list(s.exec(select(Approval).order_by(col(Approval.id))))

    # Identity and audit --------------------------------------------------------------------------

    def _reserved(self, peer: Peer) -> str | None:
        """An OS user named like one of the policy's machine principals (agent, system, a
        channel) would speak as it: refused."""
        entry = self.w.policy.policy.principals.get(peer.name)
        if entry is not None and entry.kind != "user":
            return (
                f"OS user {peer.name!r} (uid {peer.uid}) has the name of the policy's {entry.kind} "
                "principal; the daemon will not let it speak as that principal: rename the "
                "account, or that principal in the policy"
            )
        return None

    def _refused(self, peer: Peer, kind: str, why: str, line: bytes) -> None:
        """Audited in full while the peer's minute allows, else counted (policies/refusal_tally)."""
        payload = {
            "error": why,
            "request": line[:500].decode("utf-8", "replace"),
            "uid": peer.uid,
            "pid": peer.pid,
        }
        try:
            self.refusals.refused(
                f"uid:{peer.uid}",
                kind,
                why,
                actor=peer.name,
                payload=payload,
                about={"uid": peer.uid, "user": peer.name},
            )
        except Exception:  # the reply still goes out; the daemon's log says why
            self.say(f"could not audit api.refused from {peer.name}:\n{traceback.format_exc()}")

    def _flush_refusals(self, *, final: bool = False) -> None:
        """The aggregate of a closed minute, written within the accept loop's half second."""
        try:
            self.refusals.flush(final=final)
        except Exception:
            self.say(f"could not audit api.refused_aggregate:\n{traceback.format_exc()}")

    def _audit(self, peer: Peer, action: str, payload: dict[str, Any]) -> None:
        try:
            self.w.audit.append(
                peer.name, action, payload={**payload, "uid": peer.uid, "pid": peer.pid}
            )
        except Exception:  # the reply still goes out; the daemon's log says why
            self.say(f"could not audit {action} from {peer.name}:\n{traceback.format_exc()}")

    def _reply_error(self, conn: socket.socket, exc: NightshiftError) -> None:
        try:
            send(conn, Reply(kind="error", error=error_info(exc)), self.cfg.idle_timeout_s)
        except OSError:
            pass


def _describe(exc: ValidationError) -> str:
    """A refused request in one line, naming the field; an extra field is named as such."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"][1:] or first["loc"]) or "request"
    if first["type"] == "json_invalid":
        return f"not a JSON request: {first['msg']}"
    if first["type"] == "extra_forbidden":
        hint = (
            ": who asks is the peer's uid, from the kernel"
            if first["loc"][-1] in ("principal", "user", "as", "actor", "requester")
            else ""
        )
        return f"request field '{first['loc'][-1]}' is not accepted{hint}"
    if first["type"] == "union_tag_invalid" or where == "op":
        return f"unknown op: {first['msg']}"
    return f"request field '{where}': {first['msg']}"


def _drain(conn: socket.socket, limit_s: float = 2.0, limit_bytes: int = 64 << 20) -> None:
    """After refusing a request too large to read, let the sender finish writing (so it reads
    the refusal rather than a reset), within limits."""
    try:
        conn.shutdown(socket.SHUT_WR)
        end, seen = time.monotonic() + limit_s, 0
        while seen < limit_bytes and (left := end - time.monotonic()) > 0:
            conn.settimeout(left)
            chunk = conn.recv(1 << 16)
            if not chunk:
                return
            seen += len(chunk)
    except OSError:
        pass


def _gid(group: str) -> int:
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise OperatorError(f"api.socket_group {group!r}: no such group") from None
