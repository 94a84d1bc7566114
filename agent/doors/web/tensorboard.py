"""TensorBoard itself for a job, at /jobs/{id}/tensorboard/ on the dashboard's one app.

The job page draws the scalars nightshift reads; a researcher who logs images, histograms, text
or a hundred scalars expects TensorBoard. This is TensorBoard's own WSGI application (its
`program` flags and `backend.application`), over the folders below the job's folder that hold
event files (found as metric_sources finds them: no link followed, bounded), with its
`path_prefix` set to the route's, run as ASGI through a2wsgi. Who may see it is the dashboard's
business (sign-in, the job_logs decision); this module only serves.

A few boards are kept (LRU, the evicted one closed): each rereads its event files every
RELOAD_S in a thread of its own, so a live run's curves move. A folder that holds a link named
like an event file is left out (TensorBoard would open what it points to, as the daemon).
TensorBoard's HTML keeps its own CSP (its frontend needs inline styles and eval) with
frame-ancestors 'none' added; nothing it answers is cached. tensorboard stays optional: without
it the page says how to install it.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from nightshift.runtime.engine import job_paths, metric_roots
from nightshift.runtime.training import metric_sources

if TYPE_CHECKING:
    from nightshift.runtime.config import Settings
    from nightshift.runtime.store.db import Job

MAX_BOARDS = 4  # TensorBoards kept at once; each holds its runs' data in memory
RELOAD_S = 5.0  # how often a board rereads its event files
INSTALL_HINT = (
    "TensorBoard is not installed where the daemon runs: pip install 'nightshift[tensorboard]' "
    "there and restart the daemon."
)
FRAMING = "; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

Runs = dict[str, Path]  # run name → folder of event files


def missing() -> str | None:
    """The install hint when TensorBoard (or the WSGI bridge) cannot be imported, else None."""
    try:
        import a2wsgi  # noqa: F401
        import tensorboard.program  # noqa: F401
    except ImportError:
        return INSTALL_HINT
    return None


def job_runs(settings: Settings, job: Job) -> Runs:
    """The job's TensorBoard runs: each folder of event files below its folder (and its
    checkpoint folder where that lies elsewhere), named by its path there."""
    roots = metric_roots(job_paths(settings, job))
    runs: Runs = {}
    for folder in metric_sources.event_folders(roots):
        root = next(r for r in roots if folder.is_relative_to(r))
        rel = folder.relative_to(root).as_posix()
        if not _linked_events(folder):
            runs[rel if root == roots[0] else f"{root.name}/{rel}"] = folder
    return runs


def _linked_events(folder: Path) -> bool:
    """A link named like an event file in `folder` (TensorBoard reads every such name there)."""
    try:
        return any("tfevents" in e.name and e.is_symlink() for e in os.scandir(folder))
    except OSError:
        return True


class Board:
    """One job's TensorBoard: the WSGI app as ASGI, and the thread that rereads its runs."""

    def __init__(self, prefix: str, runs: Callable[[], Runs], say: Callable[[str], None]):
        from a2wsgi import WSGIMiddleware
        from tensorboard import program
        from tensorboard.backend import application
        from tensorboard.backend.event_processing import data_ingester
        from tensorboard.backend.event_processing.data_provider import MultiplexerDataProvider
        from tensorboard.backend.event_processing.plugin_event_multiplexer import (
            EventMultiplexer,
        )

        self.runs, self.say = runs, say
        first = runs()
        logdir = str(next(iter(first.values()))) if first else "."
        tb = program.TensorBoard()
        tb.configure(logdir=logdir, path_prefix=prefix, reload_interval=RELOAD_S)
        self.mux = EventMultiplexer(
            size_guidance=data_ingester.DEFAULT_SIZE_GUIDANCE,
            tensor_size_guidance=dict(data_ingester.DEFAULT_TENSOR_SIZE_GUIDANCE),
            max_reload_threads=1,
        )
        self._add(first)
        self.mux.Reload()
        wsgi = application.TensorBoardWSGIApp(
            tb.flags,
            tb.plugin_loaders,
            MultiplexerDataProvider(self.mux, logdir),
            tb.assets_zip_provider,
            self.mux,
        )
        self.app = WSGIMiddleware(wsgi, workers=4)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._reload, name="tensorboard", daemon=True)
        self._thread.start()

    def _add(self, runs: Runs) -> None:
        for name, folder in runs.items():
            self.mux.AddRun(str(folder), name)

    def _reload(self) -> None:
        while not self._stop.wait(RELOAD_S):
            try:
                self._add(self.runs())
                self.mux.Reload()
            except Exception as exc:  # a file gone mid-read: said, the next round tries again
                self.say(f"tensorboard reload failed: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        self._stop.set()
        self.app.executor.shutdown(wait=False)


class Boards:
    """The TensorBoards of one dashboard, by job, the least recently used closed past
    MAX_BOARDS."""

    def __init__(self, settings: Settings, say: Callable[[str], None]):
        self.settings, self.say = settings, say
        self._lock = threading.Lock()
        self._boards: OrderedDict[int, Board] = OrderedDict()

    def has_events(self, job: Job) -> bool:
        return bool(job_runs(self.settings, job))

    def _board(self, job: Job) -> Board | str:
        """The job's board, made on first use; else why there is none."""
        hint = missing()
        if hint is not None:
            return hint
        with self._lock:
            board = self._boards.get(job.id)  # type: ignore[arg-type]
            if board is not None:
                self._boards.move_to_end(job.id)  # type: ignore[arg-type]
                return board
            if not job_runs(self.settings, job):
                return (
                    f"job {job.id} has no TensorBoard event files (events.out.tfevents.*) below "
                    "its folder yet"
                )
            board = Board(
                f"/jobs/{job.id}/tensorboard", lambda: job_runs(self.settings, job), self.say
            )
            self._boards[job.id] = board  # type: ignore[index]
            while len(self._boards) > MAX_BOARDS:
                self._boards.popitem(last=False)[1].close()
            return board

    async def respond(self, request: Request, job: Job) -> Response | str:
        """TensorBoard's answer to `request`, or why there is none (a sentence for the page)."""
        board = await run_in_threadpool(self._board, job)
        if isinstance(board, str):
            return board
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def send(message: Any) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await board.app(request.scope, request.receive, send)  # type: ignore[arg-type]
        return _answer(start.get("status", 500), start.get("headers", []), b"".join(chunks))

    def close(self) -> None:
        with self._lock:
            while self._boards:
                self._boards.popitem()[1].close()


def _answer(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> Response:
    """TensorBoard's response with the dashboard's rules: never cached, never framed."""
    response = Response(body, status_code=status)
    kept = [
        (k, v)
        for k, v in headers
        if k.lower() not in (b"content-length", b"cache-control", b"expires")
    ]
    response.raw_headers = kept + [
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
    ]
    csp = response.headers.get("content-security-policy")
    if csp is not None:
        response.headers["content-security-policy"] = csp.rstrip("; ") + FRAMING
    return response
