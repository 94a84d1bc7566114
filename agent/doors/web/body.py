"""One bounded read of a POST's body for every route of the daemon's web app (the channels'
callbacks in server.py, the dashboard's forms): a Content-Length is required and capped, and the
body must arrive within a deadline, so a client that sends headers and then trickles (or never
sends) its body holds a worker for READ_TIMEOUT_S at most, never for ever."""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect, Request

READ_TIMEOUT_S = 10.0


class BodyRefused(Exception):
    """The body was not read: the status and text to answer (the connection then closes)."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


async def bounded_body(request: Request, limit: int) -> bytes:
    """The request's body, at most `limit` bytes, read within READ_TIMEOUT_S; else BodyRefused
    (411 without a Content-Length, 413 past the limit, 408 too slow or gone)."""
    try:
        length = int(request.headers.get("content-length", ""))
    except ValueError:
        raise BodyRefused(411, "a Content-Length is required") from None
    if length < 0 or length > limit:
        raise BodyRefused(413, "too large")
    try:
        body = await asyncio.wait_for(request.body(), READ_TIMEOUT_S)
    except (TimeoutError, ClientDisconnect):
        raise BodyRefused(408, "the body took too long") from None
    if len(body) > limit:
        raise BodyRefused(413, "too large")
    return body
