"""The web dashboard's routes on the daemon's one Starlette app (agent/doors/web/server.py).

Who is signed in: a token made by `nightshift web token` (agent/doors/web/tokens.py), sent
once — the login form, or `?token=` on any page — and then carried by an HttpOnly,
SameSite=Strict cookie; every request checks it against the store again, so a revoked token
stops at its next request. No request names a user.

What a page does is what the same person could do at a shell, through the same gate: the job
list is a `list_jobs` decision, a job page a `show_job` one, its log and curves a `job_logs` one
(others' logs are the owner's and the admins', policy rule others-job-logs); each is audited as
a verdict once per page view (the page's log and curve polls read on under it, as a follow
does); a comparison is a `compare_jobs` decision (others' curves under the same rule), the
morning report a `list_jobs` one. Buttons (retry, hold, release, cancel, reproduce) and the
experiment form (`submit_job`, the job the signed-in user's) are gate calls as the signed-in user
with via "web": policy, approvals and the audit apply. Where a rule lets the requester confirm
their own call, the page shows the full request and a confirm button (the terminal's y/N);
the call id comes from a nonce in the page, so a form sent twice is one call. Votes go through
Approvals.vote, which counts a voter's vote once.

Every POST carries the session's CSRF token (an HMAC of the cookie's secret, in a form field or
the X-CSRF-Token header) and, where the browser sends one, an Origin of this host. Responses
forbid framing, inline script and caching.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import secrets
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import timedelta
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from nightshift.agent.doors.web import experiment_form, pages, tensorboard
from nightshift.agent.doors.web.body import BodyRefused, bounded_body
from nightshift.agent.doors.web.tokens import user_of
from nightshift.runtime.errors import (
    ApprovalRequired,
    BadArguments,
    NightshiftError,
    Refused,
    UnknownApproval,
)
from nightshift.skills.compare_jobs import thin

if TYPE_CHECKING:
    from nightshift.agent.brain.wiring import Wiring
    from nightshift.policies.engine import Verdict

COOKIE = "nightshift_session"
MAX_FORM = 16 * 1024
ALLOW_S = 600.0  # a page's job_logs decision covers its log and curve polls this long
LOG_TAIL = 200
MAX_POINTS = 1000  # per metric series sent to the page
PAGE_SIZE = 200
NONCE = re.compile(r"^[0-9a-f]{32}$")
STATIC = {"dash.js": "text/javascript", "dash.css": "text/css"}


@functools.cache
def _static_bytes(name: str) -> bytes:
    """A static file of the package (one of STATIC), read once."""
    return resources.files("nightshift.agent.doors.web").joinpath("static", name).read_bytes()


HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # a ?token= never travels to another site in a Referer
    "Cache-Control": "no-store",
}

Handler = Callable[[Request, str, str, dict[str, str]], Awaitable[Response]]


def csrf_of(secret: str) -> str:
    """The session's CSRF token: derived from the cookie's secret, which a page of another
    site can neither read nor send with a Strict cookie."""
    return hmac.new(secret.encode(), b"nightshift web csrf", hashlib.sha256).hexdigest()


class Dashboard:
    """The dashboard of one daemon (its Wiring: store, gate, approvals, audit)."""

    def __init__(self, w: Wiring, say: Callable[[str], None] | None = None):
        self.w = w
        self.say = say or (lambda message: None)
        self._lock = threading.Lock()
        self._allowed: dict[tuple[str, int], float] = {}  # (user, job) → until (monotonic)
        self._done: OrderedDict[str, tuple[int, str]] = OrderedDict()  # call id → answer
        self._boards = tensorboard.Boards(w.settings, self.say)

    # ------------------------------------------------------------------------------ routes
    def routes(self) -> list[BaseRoute]:
        return [
            Route("/login", self.login, methods=["GET", "POST"]),
            Route("/logout", self._page(self.logout), methods=["POST"]),
            Route("/static/{name}", self.static, methods=["GET"]),
            Route("/", self._page(self.jobs), methods=["GET"]),
            Route("/jobs/{job_id:int}", self._page(self.job), methods=["GET"]),
            Route("/jobs/{job_id:int}/log.json", self._page(self.log, api=True), methods=["GET"]),
            Route(
                "/jobs/{job_id:int}/metrics.json",
                self._page(self.metrics, api=True),
                methods=["GET"],
            ),
            Route("/jobs/{job_id:int}/action", self._page(self.action), methods=["POST"]),
            Route("/approvals", self._page(self.approvals), methods=["GET"]),
            Route("/approvals/{approval_id:int}/vote", self._page(self.vote), methods=["POST"]),
            Route("/gantt", self._page(self.gantt), methods=["GET"]),
            Route(  # TensorBoard's own POSTs are reads and carry no CSRF token: Origin checked
                "/jobs/{job_id:int}/tensorboard/{rest:path}",
                self._page(self.tensorboard, csrf=False),
                methods=["GET", "POST"],
            ),
            Route("/compare", self._page(self.compare), methods=["GET"]),
            Route("/report", self._page(self.report), methods=["GET"]),
            Route("/submit", self._page(self.submit), methods=["GET", "POST"]),
        ]

    # ------------------------------------------------------------------------------ sign-in
    def _page(
        self, handler: Handler, *, api: bool = False, csrf: bool = True
    ) -> Callable[[Request], Awaitable[Response]]:
        """`handler` for a signed-in user only; a POST must carry the session's CSRF token
        (unless not `csrf`: its body is then left unread) and come from this site."""

        async def endpoint(request: Request) -> Response:
            try:
                return _secure(await guarded(request))
            except Exception as exc:  # the store gone, a bug: said, never a traceback
                self.say(f"web {request.url.path} failed: {type(exc).__name__}: {exc}")
                return _secure(HTMLResponse("error", status_code=500))

        async def guarded(request: Request) -> Response:
            token = request.query_params.get("token")
            if token is not None and request.method == "GET":
                return await self._sign_in(request, token, _without_token(request))
            secret = request.cookies.get(COOKIE, "")
            user = await run_in_threadpool(user_of, self.w.store, secret) if secret else None
            if user is None:
                if api or request.method != "GET":
                    return _secure(JSONResponse({"error": "sign in first"}, status_code=401))
                return _secure(RedirectResponse("/login?next=" + quote(request.url.path), 303))
            form: dict[str, str] = {}
            if request.method == "POST" and not csrf:
                if not _same_origin(request):
                    return _secure(HTMLResponse("cross-origin request refused", status_code=403))
            elif request.method == "POST":
                form_or_error = await _form(request)
                if isinstance(form_or_error, Response):
                    return _secure(form_or_error)
                form = form_or_error
                given = form.get("csrf") or request.headers.get("x-csrf-token", "")
                if not hmac.compare_digest(given.encode(), csrf_of(secret).encode()):
                    return _secure(HTMLResponse("missing or wrong CSRF token", status_code=403))
                if not _same_origin(request):
                    return _secure(HTMLResponse("cross-origin request refused", status_code=403))
            return await handler(request, user, secret, form)

        return endpoint

    async def _sign_in(self, request: Request, token: str, next_path: str) -> Response:
        user = await run_in_threadpool(user_of, self.w.store, token)
        if user is None:
            return _secure(
                HTMLResponse(pages.login_page("That token is not valid.", next_path), 401)
            )
        response = RedirectResponse(next_path, 303)
        # Secure where the browser reached us over TLS (directly, or through a proxy that
        # says so): the cookie then never travels in clear.
        tls = request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/", secure=tls)
        return _secure(response)

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            token = request.query_params.get("token")
            next_path = _safe_next(request.query_params.get("next"))
            if token is not None:
                return await self._sign_in(request, token, next_path)
            return _secure(HTMLResponse(pages.login_page(next_path=next_path)))
        form = await _form(request)
        if isinstance(form, Response):
            return _secure(form)
        token = form.get("token", "").strip()
        return await self._sign_in(request, token, _safe_next(form.get("next")))

    async def logout(
        self, request: Request, user: str, secret: str, form: dict[str, str]
    ) -> Response:
        response = RedirectResponse("/login", 303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return _secure(HTMLResponse("not found", status_code=404))
        return _secure(Response(_static_bytes(name), media_type=STATIC[name]))

    # ------------------------------------------------------------------------------ reads
    def _decide(self, user: str, skill: str, args: dict[str, Any]) -> Verdict:
        """One audited decision of the gate for a read this page makes as `user`."""
        ctx = self.w.context(user, f"{user}/web-read-{uuid.uuid4().hex}")
        return self.w.gate.decide(ctx, skill, args)

    def _may_read_logs(self, user: str, job_id: int, *, fresh: bool) -> str | None:
        """None when `user` may read job_id's log and metrics (decided now when `fresh` or not
        decided lately); else why not."""
        key = (user, job_id)
        with self._lock:
            until = self._allowed.get(key, 0.0)
        if not fresh and until > time.monotonic():
            return None
        try:
            self._decide(user, "job_logs", {"job_id": job_id})
        except Refused as exc:
            with self._lock:
                self._allowed.pop(key, None)
            return str(exc)
        with self._lock:
            if len(self._allowed) > 10_000:
                self._allowed.clear()
            self._allowed[key] = time.monotonic() + ALLOW_S
        return None

    def _render(
        self,
        request: Request,
        title: str,
        user: str,
        secret: str,
        body: str,
        *,
        status: str = "",
        code: int = 200,
    ) -> Response:
        return HTMLResponse(pages.layout(title, user, csrf_of(secret), body, status=status), code)

    async def jobs(
        self, request: Request, user: str, secret: str, form: dict[str, str]
    ) -> Response:
        q = request.query_params
        filters = {k: q.get(k, "").strip()[:200] for k in ("state", "owner", "name")}
        try:
            page = max(0, min(int(q.get("page", "0")), 10_000))
        except ValueError:
            page = 0
        try:
            await run_in_threadpool(self._decide, user, "list_jobs", {})
        except Refused as exc:
            return self._render(
                request, "Jobs", user, secret, pages.result_page(None, str(exc)), code=403
            )
        jobs, holds, owners, more = await run_in_threadpool(self._jobs, filters, page)
        body = pages.jobs_page(jobs, holds, filters, owners, more, page)
        return self._render(request, "Jobs", user, secret, body)

    def _jobs(
        self, filters: dict[str, str], page: int
    ) -> tuple[list[Any], dict[int, str], list[str], bool]:
        """One page of jobs, newest first, with their hold reasons, every owner, and whether
        an older page follows."""
        from sqlmodel import col, select

        from nightshift.runtime.store import job_holds
        from nightshift.runtime.store.db import Job

        q = select(Job)
        if filters["state"]:
            q = q.where(col(Job.state) == filters["state"])
        if filters["owner"]:
            q = q.where(col(Job.owner) == filters["owner"])
        if filters["name"]:
            q = q.where(col(Job.name).contains(filters["name"], autoescape=True))
        q = q.order_by(col(Job.id).desc()).offset(page * PAGE_SIZE).limit(PAGE_SIZE + 1)
        with self.w.store.session() as s:
            rows = list(s.exec(q))
            holds = job_holds.of(s, [j.id for j in rows[:PAGE_SIZE]])
            owners = sorted(s.exec(select(Job.owner).distinct()).all())
        return rows[:PAGE_SIZE], holds, owners, len(rows) > PAGE_SIZE

    async def job(self, request: Request, user: str, secret: str, form: dict[str, str]) -> Response:
        job_id = request.path_params["job_id"]
        job = await run_in_threadpool(self.w.store.job, job_id)
        if job is None:
            return self._render(
                request,
                "No such job",
                user,
                secret,
                pages.result_page(None, f"no job {job_id}"),
                code=404,
            )
        try:
            await run_in_threadpool(self._decide, user, "show_job", {"job_id": job_id})
        except Refused as exc:
            return self._render(
                request, f"Job {job_id}", user, secret, pages.result_page(None, str(exc)), code=403
            )
        refused = await run_in_threadpool(self._may_read_logs, user, job_id, fresh=True)
        attempts = await run_in_threadpool(self.w.store.attempts, job_id)
        hold = (
            await run_in_threadpool(self.w.store.hold_reason, job_id)
            if job.state == "queued"
            else None
        )
        board = refused is None and await run_in_threadpool(self._boards.has_events, job)
        body = pages.job_page(
            job,
            attempts,
            csrf_of(secret),
            secrets.token_hex(16),
            logs_refused=refused,
            tensorboard=board,
            reproduces=job.reproduces,
            hold=hold,
        )
        return self._render(request, f"Job {job_id}: {job.name}", user, secret, body)

    async def log(self, request: Request, user: str, secret: str, form: dict[str, str]) -> Response:
        """The log's last lines (no offset), or its lines from `offset` of `attempt` on."""
        job_id = request.path_params["job_id"]
        refused = await run_in_threadpool(self._may_read_logs, user, job_id, fresh=False)
        if refused is not None:
            return JSONResponse({"error": refused}, status_code=403)
        args: dict[str, Any] = {"job_id": job_id, "tail": LOG_TAIL}
        try:
            if "offset" in request.query_params:
                args["offset"] = max(0, int(request.query_params["offset"]))
            if "attempt" in request.query_params:
                args["attempt"] = max(1, int(request.query_params["attempt"]))
        except ValueError:
            return JSONResponse({"error": "offset and attempt are numbers"}, status_code=400)
        from nightshift.skills.registry import get_skill

        skill = get_skill("job_logs")
        try:
            r: Any = await run_in_threadpool(skill.fn, self.w.context(user), skill.parse(args))
        except BadArguments as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        return JSONResponse(
            {
                "attempt": r.attempt,
                "latest_attempt": r.latest_attempt,
                "lines": r.lines[-LOG_TAIL * 10 :],
                "offset": r.end_offset,
                "more": r.more,
                "state": r.job_state,
                "final": r.final,
                "attempt_ended": r.attempt_ended,
            }
        )

    async def metrics(
        self, request: Request, user: str, secret: str, form: dict[str, str]
    ) -> Response:
        job_id = request.path_params["job_id"]
        refused = await run_in_threadpool(self._may_read_logs, user, job_id, fresh=False)
        if refused is not None:
            return JSONResponse({"error": refused}, status_code=403)
        return JSONResponse({"series": await run_in_threadpool(self._series, job_id)})

    def _series(self, job_id: int) -> dict[str, list[list[float]]]:
        from sqlmodel import col, select

        from nightshift.runtime.store.db import MetricPoint

        series: dict[str, list[list[float]]] = {}
        with self.w.store.session() as s:
            rows = s.exec(
                select(MetricPoint.step, MetricPoint.name, MetricPoint.value)
                .where(col(MetricPoint.job_id) == job_id)
                .order_by(col(MetricPoint.id))
            )
            for step, name, value in rows:
                if value is not None and value == value and abs(value) != float("inf"):
                    series.setdefault(name, []).append([step, value])
        return {name: thin(points, MAX_POINTS) for name, points in series.items()}

    async def tensorboard(
        self, request: Request, user: str, secret: str, form: dict[str, str]
    ) -> Response:
        """TensorBoard over the job's event files, for whoever may read its log (decided
        afresh, and audited, at its index; its data requests ride on that decision)."""
        job_id = request.path_params["job_id"]
        job = await run_in_threadpool(self.w.store.job, job_id)
        index = not request.path_params["rest"]
        refused = (
            f"no job {job_id}"
            if job is None
            else await run_in_threadpool(self._may_read_logs, user, job_id, fresh=index)
        )
        answer = refused or await self._boards.respond(request, job)  # type: ignore[arg-type]
        if isinstance(answer, Response):
            return answer
        code = 404 if job is None else 403 if refused else 503
        body = pages.result_page(job_id, answer)
        return self._render(request, f"TensorBoard: job {job_id}", user, secret, body, code=code)

    # ------------------------------------------------------------------------------ actions
    async def action(
        self, request: Request, user: str, secret: str, form: dict[str, str]
    ) -> Response:
        job_id = request.path_params["job_id"]
        action, nonce = form.get("action", ""), form.get("nonce", "")
        if action not in pages.ACTIONS or not NONCE.match(nonce):
            return self._render(
                request,
                "Refused",
                user,
                secret,
                pages.result_page(job_id, "unknown action or form"),
                code=400,
            )
        confirm: int | None = None
        if form.get("confirm"):
            try:
                confirm = int(form["confirm"])
            except ValueError:
                confirm = None
        code, kind, text, request_shown = await run_in_threadpool(
            self._act, user, job_id, action, nonce, confirm
        )
        if kind == "confirm" and request_shown is not None:
            body = pages.confirm_page(job_id, action, request_shown, csrf_of(secret), nonce)
            return self._render(
                request,
                f"Confirm: {pages.ACTIONS[action][1]} job {job_id}",
                user,
                secret,
                body,
                code=code,
            )
        return self._render(
            request,
            f"{pages.ACTIONS[action][1]} job {job_id}",
            user,
            secret,
            pages.result_page(job_id, text),
            code=code,
        )

    def _act(
        self, user: str, job_id: int, action: str, nonce: str, confirm: int | None
    ) -> tuple[int, str, str, dict[str, Any] | None]:
        """One button's call through the gate as `user`: (status, kind, text, request to
        confirm). A nonce already answered answers the same (a form sent twice is one call)."""
        skill = pages.ACTIONS[action][0]
        call_id = f"{user}/web-{nonce}"
        with self._lock:
            done = self._done.get(call_id)
        if done is not None:
            return done[0], "done", f"already sent: {done[1]}", None
        args: dict[str, Any] = {"job_id": job_id}
        if action in ("hold", "cancel"):
            args["reason"] = (
                f"{'held' if action == 'hold' else 'cancelled'} by {user} on the web dashboard"
            )
        verdicts: list[Verdict] = []

        def confirmed(req: dict[str, Any]) -> bool:
            return confirm is not None and req.get("approval_id") == confirm

        try:
            result = self.w.gate.call(
                self.w.context(user, call_id),
                skill,
                args,
                via="web",
                confirm=confirmed if confirm is not None else None,
                on_verdict=verdicts.append,
            )
        except ApprovalRequired as exc:
            verdict = verdicts[-1] if verdicts else None
            if confirm is None and verdict is not None and not verdict.from_others:
                row = self.w.approvals.get(exc.approval_id)  # type: ignore[arg-type]
                shown = {"approval_id": row.id, "args": row.args, "rule": row.rule}
                return 200, "confirm", "", shown
            return 202, "parked", f"waiting for approval {exc.approval_id}: {exc}", None
        except Refused as exc:
            return self._remember(call_id, 403, f"refused: {exc}")
        except NightshiftError as exc:
            return self._remember(call_id, 409, f"{skill} failed: {exc}")
        return self._remember(call_id, 200, f"{skill}: {_summary(result.model_dump(mode='json'))}")

    def _remember(self, call_id: str, code: int, text: str) -> tuple[int, str, str, None]:
        with self._lock:
            self._done[call_id] = (code, text)
            while len(self._done) > 1000:
                self._done.popitem(last=False)
        return code, "done", text, None

    # ------------------------------------------------------------------------------ approvals
    async def approvals(
        self, request: Request, user: str, secret: str, form: dict[str, str]
    ) -> Response:
        pending, decided = await run_in_threadpool(self._approval_rows, user)
        body = pages.approvals_page(pending, decided, csrf_of(secret))
        return self._render(request, "Approvals", user, secret, body)

    def _approval_rows(self, user: str) -> tuple[list[Any], list[Any]]:
        from sqlmodel import col, select

        from nightshift.agent.brain.wiring import local_now
        from nightshift.runtime.store.db import Approval

        self.w.audit.append(user, "web.read", payload={"page": "approvals"})
        pending = list(self.w.approvals.pending(local_now()))
        with self.w.store.session() as s:
            decided = list(
                s.exec(
                    select(Approval)
                    .where(col(Approval.state) != "pending")
                    .order_by(col(Approval.id).desc())
                    .limit(20)
                )
            )
        return pending, decided

    async def vote(
        self, request: Request, user: str, secret: str, form: dict[str, str]
    ) -> Response:
        approval_id = request.path_params["approval_id"]
        decision = form.get("decision")
        if decision not in ("approve", "reject"):
            return HTMLResponse("decision must be approve or reject", status_code=400)
        code, text = await run_in_threadpool(self._vote, user, approval_id, decision == "approve")
        pending, decided = await run_in_threadpool(self._approval_rows, user)
        body = pages.approvals_page(pending, decided, csrf_of(secret))
        return self._render(request, "Approvals", user, secret, body, status=text, code=code)

    def _vote(self, user: str, approval_id: int, approve: bool) -> tuple[int, str]:
        from nightshift.agent.brain.wiring import local_now

        word = "approve" if approve else "reject"
        try:
            before = self.w.approvals.get(approval_id)
            again = any(v.get("approve") == approve and v.get("as") == user for v in before.votes)
            row = self.w.approvals.vote(approval_id, user, approve, local_now())
        except UnknownApproval as exc:
            return 404, str(exc)
        except Refused as exc:
            return 403, f"refused: {exc}"
        if again:
            return 200, f"you already voted {word} on approval {approval_id}; counted once"
        if row.state != "pending" and not any(v.get("as") == user for v in row.votes):
            return 409, f"approval {approval_id} is already {row.state}"
        return 200, f"your {word} on approval {approval_id} counted; it is {row.state}"

    # ------------------------------------------------------------------------------ the night
    async def gantt(
        self, request: Request, user: str, secret: str, form: dict[str, str]
    ) -> Response:
        try:
            hours = max(1, min(int(request.query_params.get("hours", "24")), 168))
        except ValueError:
            hours = 24
        body = await run_in_threadpool(self._gantt, user, hours)
        return self._render(request, f"The night: last {hours} h", user, secret, body)

    def _gantt(self, user: str, hours: int) -> str:
        from sqlmodel import col, or_, select

        from nightshift.runtime.store.db import Attempt, Job, utcnow

        self.w.audit.append(user, "web.read", payload={"page": "gantt", "hours": hours})
        end = utcnow()
        start = end - timedelta(hours=hours)
        with self.w.store.session() as s:
            rows = list(
                s.exec(
                    select(Attempt, Job)
                    .join(Job, col(Job.id) == col(Attempt.job_id))
                    .where(or_(col(Attempt.ended_at).is_(None), col(Attempt.ended_at) >= start))
                    .where(col(Attempt.started_at) <= end)
                    .order_by(col(Attempt.started_at))
                    .limit(5000)
                )
            )
        return pages.gantt_page(rows, start, end, self.w.settings.tariff)

    # ------------------------------------------------------------------------------ compare
    async def compare(
        self, request: Request, user: str, secret: str, form: dict[str, str]
    ) -> Response:
        """`/compare?jobs=1,2,3` (or `jobs=1&jobs=2`, the jobs list's checkboxes): compare_jobs
        as the signed-in user, after the gate's decision (others' jobs only where the policy
        lets this user read them, rule others-job-logs)."""
        raw = ",".join(request.query_params.getlist("jobs"))
        try:
            ids = list(dict.fromkeys(int(x) for x in raw.split(",") if x.strip()))
        except ValueError:
            ids = []
        if len(ids) < 2:
            text = "jobs: name two to twenty job ids, e.g. /compare?jobs=3,4 (or tick them on the jobs list)"
            return self._render(
                request, "Compare", user, secret, pages.result_page(None, text), code=400
            )
        code, result = await run_in_threadpool(self._compare, user, ids)
        title = "Compare jobs " + ", ".join(map(str, ids))
        if isinstance(result, str):
            return self._render(
                request, title, user, secret, pages.result_page(None, result), code=code
            )
        return self._render(request, title, user, secret, pages.compare_page(result))

    def _compare(self, user: str, ids: list[int]) -> tuple[int, Any]:
        from nightshift.skills.registry import get_skill

        args: dict[str, Any] = {"job_ids": ids}
        try:
            self._decide(user, "compare_jobs", args)
            skill = get_skill("compare_jobs")
            return 200, skill.fn(self.w.context(user), skill.parse(args))
        except Refused as exc:
            return 403, str(exc)
        except NightshiftError as exc:  # an unknown job, more than twenty
            return 400, str(exc)

    # ------------------------------------------------------------------------------ report
    async def report(
        self, request: Request, user: str, secret: str, form: dict[str, str]
    ) -> Response:
        """The morning report (`nightshift report`, agent/doors/report.py) as a page, for a
        user the policy lets list jobs."""
        try:
            hours = max(1.0, min(float(request.query_params.get("hours", "24")), 168.0))
        except ValueError:
            hours = 24.0
        hours = int(hours) if hours.is_integer() else hours
        try:
            await run_in_threadpool(self._decide, user, "list_jobs", {})
        except Refused as exc:
            return self._render(
                request, "Report", user, secret, pages.result_page(None, str(exc)), code=403
            )
        body = await run_in_threadpool(self._report, hours)
        return self._render(request, f"The morning report: last {hours} h", user, secret, body)

    def _report(self, hours: float) -> str:
        from nightshift.agent.brain.wiring import local_now
        from nightshift.agent.doors.report import default_window, report_of, to_markdown

        r = report_of(self.w, *default_window(local_now(), hours))
        return pages.report_page(r, to_markdown(r), hours)

    # ------------------------------------------------------------------------------ submit
    async def submit(
        self, request: Request, user: str, secret: str, form: dict[str, str]
    ) -> Response:
        """The experiment form, and its submit_job call through the gate as the signed-in
        user (the owner is who is signed in; the form names no one). A field the form or the
        spec refuses comes back next to that field with what was typed; the nonce makes a
        form sent twice one job."""
        csrf = csrf_of(secret)
        if request.method == "GET":
            body = pages.submit_page({}, {}, csrf, secrets.token_hex(16))
            return self._render(request, "Submit an experiment", user, secret, body)
        values = {k: form.get(k, "")[:20_000] for k in pages.SUBMIT_FIELDS}
        nonce = form.get("nonce", "")
        if not NONCE.match(nonce):
            return self._render(
                request,
                "Refused",
                user,
                secret,
                pages.result_page(None, "unknown form: reload the page"),
                code=400,
            )
        built, errors = experiment_form.build(values)
        if built is None:  # field → what to fix
            body = pages.submit_page(values, errors, csrf, nonce)
            return self._render(request, "Submit an experiment", user, secret, body, code=400)
        code, text, job_id, field = await run_in_threadpool(self._submit, user, nonce, built)
        if job_id is None:
            body = pages.submit_page(values, {field: text}, csrf, nonce)
            return self._render(request, "Submit an experiment", user, secret, body, code=code)
        return self._render(
            request, f"Submitted: job {job_id}", user, secret, pages.result_page(job_id, text)
        )

    def _submit(
        self, user: str, nonce: str, args: dict[str, Any]
    ) -> tuple[int, str, int | None, str]:
        """(status, text, the job's id or None, the form field a refusal names)."""
        call_id = f"{user}/web-{nonce}"
        try:
            r: Any = self.w.gate.call(self.w.context(user, call_id), "submit_job", args, via="web")
        except ApprovalRequired as exc:
            return 202, f"waiting for approval {exc.approval_id}: {exc}", None, "form"
        except Refused as exc:
            return 403, f"refused: {exc}", None, "form"
        except NightshiftError as exc:
            return 400, str(exc), None, experiment_form.field_of(str(exc))
        again = " (this form was already sent: the same job)" if r.already_submitted else ""
        return 200, f"job {r.job_id} {r.name} queued, owner {user}{again}", r.job_id, ""


# ---------------------------------------------------------------------------------- helpers
def _secure(response: Response) -> Response:
    for k, v in HEADERS.items():
        response.headers.setdefault(k, v)
    return response


async def _form(request: Request) -> dict[str, str] | Response:
    """An urlencoded form body, bounded in size and time (body.py); the first value of each
    field."""
    try:
        body = await bounded_body(request, MAX_FORM)
    except BodyRefused as refused:
        return HTMLResponse(refused.text, refused.status, headers={"Connection": "close"})
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


def _same_origin(request: Request) -> bool:
    """A browser's Origin (where it sends one) names this host."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.headers.get("host", "")


def _safe_next(path: str | None) -> str:
    """Only a path on this site (no scheme, no //host)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


def _without_token(request: Request) -> str:
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    from urllib.parse import urlencode

    return request.url.path + (f"?{urlencode(rest)}" if rest else "")


def _summary(result: dict[str, Any]) -> str:
    """The job's move (`job 5: running → cancelled`), else the result's fields."""
    if "before" in result and "after" in result:
        return f"job {result.get('job_id')}: {result['before']} → {result['after']}"
    if "source_job_id" in result:
        return f"job {result.get('job_id')} queued from job {result['source_job_id']}"
    return ", ".join(f"{k}={v}" for k, v in list(result.items())[:6])
