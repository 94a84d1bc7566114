"""The daemon's one HTTP application: Starlette under uvicorn, in a thread of its own.

It serves what the daemon answers over HTTP: GET /healthz; the channels' callbacks (POST
/slack/interactivity, GET and POST /wechat/callback: routes handed in, each a plain function of
the request that the channel modules verify); GET /metrics when a `Metrics` is handed in; the
web dashboard's pages when a `Dashboard` is (agent/doors/web/dashboard.py: its own sign-in,
CSRF and headers). Loopback by default (`web.listen`, else `channels.listen`).

The limits of the hand-written server it replaces hold as they were: each remote address has a
cap on its open connections (a connection past it is answered 503 and closed before anything is
read; `channels.callback_max_connections_per_peer`, `callback_max_connections` in all) and a token
bucket on its requests to the callbacks (429 with Retry-After; `channels.callback_requests_per_s`,
`callback_burst`); a body is bounded (413 past MAX_BODY, 411 without a Content-Length) and read
within body.READ_TIMEOUT_S (body.py, as the dashboard's forms are), as are a new connection's first request headers; no traceback reaches the
client or the terminal. A route's work (verifying, the store) runs in a worker thread, never on
the event loop. The refusal tally's closed minutes are written twice a second and at `stop`.
"""

from __future__ import annotations

import asyncio
import math
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route as StarletteRoute
from uvicorn.protocols.http.h11_impl import H11Protocol

from nightshift.agent.doors.web import body as bodies
from nightshift.agent.doors.web.body import BodyRefused, bounded_body
from nightshift.policies.refusal_tally import RateLimits, RefusalLog
from nightshift.runtime.config import ChannelsSettings

if TYPE_CHECKING:
    from nightshift.agent.doors.web.dashboard import Dashboard
    from nightshift.agent.doors.web.metrics import Metrics

MAX_BODY = 64 * 1024
BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)

# method, query, headers, body, the remote address → status, text
Route = Callable[[str, dict[str, str], dict[str, str], bytes, str], tuple[int, str]]


class WebServer:
    """The application on host:port (bound at construction: OSError if it cannot listen; port
    0 picks a free one). `routes` are the callbacks by path; `metrics` serves /metrics;
    `refusals` (the channels' desk's) tallies requests refused for their rate."""

    def __init__(
        self,
        listen: str,
        routes: dict[str, Route],
        say: Callable[[str], None],
        *,
        limits: ChannelsSettings | None = None,
        refusals: RefusalLog | None = None,
        metrics: Metrics | None = None,
        dashboard: Dashboard | None = None,
    ):
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        self.routes, self.say, self.refusals, self.metrics = routes, say, refusals, metrics
        self.dashboard = dashboard
        self.limits = limits or ChannelsSettings()
        self.rates = RateLimits(self.limits.callback_requests_per_s, self.limits.callback_burst)
        self._open: Counter[str] = Counter()
        self._open_lock = threading.Lock()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, int(port)))
            self.sock.listen(128)
            self.sock.setblocking(False)
        except OSError:
            self.sock.close()
            raise
        self.app = self._app()
        config = uvicorn.Config(
            self.app,
            http=_protocol(self),
            lifespan="off",
            log_config=None,
            log_level="critical",  # nothing to the terminal: refusals are audited
            access_log=False,
            server_header=False,
            timeout_keep_alive=5,
        )
        self.uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="web", daemon=True)
        self._thread.start()
        if self.refusals is not None:  # the callbacks' refusal tally, written as it goes
            self._flusher = threading.Thread(target=self._flush_loop, name="web-tally", daemon=True)
            self._flusher.start()
        end = time.monotonic() + 10
        while not self.uvicorn.started and self._thread.is_alive() and time.monotonic() < end:
            time.sleep(0.01)

    def _serve(self) -> None:
        try:
            asyncio.run(self.uvicorn.serve(sockets=[self.sock]))
        except BaseException as exc:  # said, never a traceback on the terminal
            self.say(f"the HTTP endpoint stopped: {type(exc).__name__}: {exc}")

    def _flush_loop(self) -> None:
        while not self._stop.wait(0.5):
            self.flush_refusals()

    def stop(self) -> None:
        self._stop.set()
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        self.sock.close()
        self.flush_refusals(final=True)

    def flush_refusals(self, *, final: bool = False) -> None:
        if self.refusals is None:
            return
        try:
            self.refusals.flush(final=final)
        except Exception as exc:  # the store busy or gone: said, the endpoint goes on
            self.say(f"could not audit channel.refused_aggregate: {type(exc).__name__}: {exc}")

    # --------------------------------------------------------------------------- connections
    def admit(self, peer: str) -> bool:
        """Count a new connection from `peer`, or False when its cap or the total is reached."""
        with self._open_lock:
            if (
                self._open[peer] >= self.limits.callback_max_connections_per_peer
                or self._open.total() >= self.limits.callback_max_connections
            ):
                return False
            self._open[peer] += 1
            return True

    def release(self, peer: str) -> None:
        with self._open_lock:
            self._open[peer] -= 1
            if self._open[peer] <= 0:
                del self._open[peer]

    # --------------------------------------------------------------------------- requests
    def rate_limited(self, path: str, address: str, forwarded: str | None) -> float:
        """0 when the address is within its rate; else the seconds to wait (the refusal is
        tallied)."""
        wait = self.rates.take(address, time.monotonic())
        if wait <= 0 or self.refusals is None:
            return wait
        channel = path.strip("/").split("/")[0] or "callback"
        why = (
            f"rate limited: more than {self.limits.callback_burst} requests at once or "
            f"{self.limits.callback_requests_per_s:g} a second from {address} "
            "(channels.callback_burst, channels.callback_requests_per_s)"
        )
        try:
            self.refusals.refused(
                address,
                "rate_limited",
                why,
                actor="system",
                payload={
                    "channel": channel,
                    "reason": why,
                    "user": None,
                    "approval_id": None,
                    "peer": forwarded,
                    "source": address,
                },
                about={"peer": address},
            )
        except Exception as exc:
            self.say(f"could not audit channel.refused: {type(exc).__name__}: {exc}")
        return wait

    def _app(self) -> Starlette:
        async def healthz(request: Request) -> Response:
            return _text(200, "ok")

        async def callback(request: Request) -> Response:
            path = request.url.path
            route = self.routes[path]
            body = b""
            if request.method == "POST":
                try:
                    body = await bounded_body(request, MAX_BODY)
                except BodyRefused as refused:
                    return _text(refused.status, refused.text, close=True)
            address = request.client.host if request.client else ""
            forwarded = request.headers.get("x-forwarded-for")
            wait = await run_in_threadpool(self.rate_limited, path, address, forwarded)
            if wait > 0:
                return _text(429, "rate limited", retry_after=wait)
            query = dict(request.query_params)
            headers = {k.lower(): v for k, v in request.headers.items()}
            try:
                status, text = await run_in_threadpool(
                    route, request.method, query, headers, body, address
                )
            except Exception as exc:  # a bug must not take the endpoint down or leak a trace
                self.say(f"callback {path} failed: {type(exc).__name__}: {exc}")
                status, text = 500, "error"
            return _text(status, text)

        routes = [StarletteRoute("/healthz", healthz, methods=["GET"])]
        routes += [StarletteRoute(p, callback, methods=["GET", "POST"]) for p in self.routes]
        if self.metrics is not None:
            metrics = self.metrics

            async def scrape(request: Request) -> Response:
                try:
                    data = await run_in_threadpool(metrics.exposition)
                except Exception as exc:  # the store busy or gone: said, a 503 to the scraper
                    self.say(f"/metrics failed: {type(exc).__name__}: {exc}")
                    return _text(503, "metrics unavailable")
                return Response(data, media_type=metrics.content_type)

            routes.append(StarletteRoute("/metrics", scrape, methods=["GET"]))
        if self.dashboard is not None:
            routes += self.dashboard.routes()
        return Starlette(routes=routes)


def _text(
    status: int, text: str, *, retry_after: float | None = None, close: bool = False
) -> Response:
    headers = {}
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    if close:  # the body was not read: the connection cannot carry another request
        headers["Connection"] = "close"
    return PlainTextResponse(text, status_code=status, headers=headers)


def _protocol(server: WebServer) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the connection caps and a deadline on the first request."""

    class Capped(H11Protocol):
        _peer: str | None = None
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            peername = transport.get_extra_info("peername")
            peer = str(peername[0]) if peername else ""
            if not server.admit(peer):
                try:
                    transport.write(BUSY)
                finally:
                    transport.close()
                return
            self._peer = peer
            super().connection_made(transport)
            self._deadline = self.loop.call_later(bodies.READ_TIMEOUT_S, self._silent)

        def _silent(self) -> None:
            """A connection that sent no request line and headers in time is closed."""
            if self.scope is None and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._peer is not None:
                super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._peer is None:
                return
            if self._deadline is not None:
                self._deadline.cancel()
            server.release(self._peer)
            self._peer = None
            super().connection_lost(exc)

    return Capped
