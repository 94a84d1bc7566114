"""A scripted OpenAI-compatible server on loopback, so the real `openai` client can be tested
(and the trajectory evals run) with no model anywhere.

    with StubServer([reply_tools(tool_call("gpu_health_check")), reply_text("fine")]) as srv:
        client = OpenAI(base_url=srv.base_url, api_key="k")
        ...
        srv.requests[0].json["messages"]       # what the model was sent
        srv.requests[0].headers["authorization"]

`POST /v1/chat/completions` answers from the script: a list of replies taken one per request
(a request after the last one gets a 500 naming the overrun, and is counted in `overruns`), or
a callable given the request's JSON that returns the reply, so a test can react to what is in
the messages. A reply is a dict:

    {"tool_calls": [...], "content": None, "refusal": None, "finish_reason": None, "usage": None}
    {"status": 429, "headers": {"Retry-After": "1"}, "body": {...}}     an HTTP error
    {"delay_s": 3.0, ...}                                               sleep first, then answer

`tool_call(name, arguments)` builds a tool call; `arguments` given as a str is sent verbatim
(malformed JSON). Without `usage` the reply reports len(JSON)//4 tokens for the request and the
reply. `GET /v1/models` lists the model. The server binds 127.0.0.1 on a free port and serves
from a daemon thread; every request is recorded in `requests`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = dict[str, Any]
Script = list[Reply] | Callable[[dict[str, Any]], Reply]


def tool_call(name: str, arguments: dict[str, Any] | str | None = None, id: str = "") -> Reply:
    """One OpenAI-style tool call; a str `arguments` goes out verbatim."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return {
        "id": id or f"call_{name}",
        "type": "function",
        "function": {"name": name, "arguments": text},
    }


def reply_tools(*calls: Reply, content: str | None = None) -> Reply:
    return {"tool_calls": list(calls), "content": content, "finish_reason": "tool_calls"}


def reply_text(text: str) -> Reply:
    return {"content": text, "finish_reason": "stop"}


def reply_refusal(text: str) -> Reply:
    return {"content": None, "refusal": text, "finish_reason": "stop"}


def reply_null() -> Reply:
    """An assistant message with `content: null` and no tool call."""
    return {"content": None, "finish_reason": "stop"}


def http_error(status: int, message: str = "", headers: dict[str, str] | None = None) -> Reply:
    body = {"error": {"message": message or f"stub error {status}", "type": "stub", "code": None}}
    return {"status": status, "headers": headers or {}, "body": body}


@dataclass
class Recorded:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    json: Any
    at: float = field(default_factory=time.monotonic)


class StubServer:
    """The scripted server; a context manager, or `start()` and `close()`."""

    def __init__(self, script: Script | None = None, *, model: str = "stub-model"):
        self.script: Script = script if script is not None else []
        self.model = model
        self.requests: list[Recorded] = []
        self.overruns = 0
        self._lock = threading.Lock()
        self._next = 0
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._url = ""
        self._thread: threading.Thread | None = None

    # life -----------------------------------------------------------------------------------
    def start(self) -> StubServer:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # quiet: the tests read `requests`

            def do_GET(self) -> None:  # noqa: N802
                stub._record(self, None)
                if self.path.rstrip("/").endswith("/models"):
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": [
                                {
                                    "id": stub.model,
                                    "object": "model",
                                    "created": 0,
                                    "owned_by": "stub",
                                }
                            ],
                        },
                    )
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"null")
                except ValueError:
                    body = None
                stub._record(self, body)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                reply = stub._reply(body if isinstance(body, dict) else {})
                delay = float(reply.get("delay_s") or 0)
                if delay and stub._stop.wait(delay):
                    return  # closing
                if "status" in reply:
                    self._send(int(reply["status"]), reply.get("body") or {}, reply.get("headers"))
                    return
                self._send(200, stub._completion(body if isinstance(body, dict) else {}, reply))

            def _send(
                self, status: int, payload: Any, headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (a timeout): nothing to answer

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="openai-stub", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT/v1 (still known after close)."""
        assert self._url, "start the server first"
        return self._url

    # what was asked -------------------------------------------------------------------------
    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the chat completion requests, in order."""
        return [r.json for r in self.requests if r.path.endswith("/chat/completions")]

    def _record(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        with self._lock:
            self.requests.append(
                Recorded(
                    handler.command,
                    handler.path,
                    {k.lower(): v for k, v in handler.headers.items()},
                    body,
                )
            )

    def _reply(self, request: dict[str, Any]) -> Reply:
        if callable(self.script):
            try:
                return self.script(request)
            except Exception as exc:  # noqa: BLE001  (a broken script is a 500, and visible)
                return http_error(500, f"stub script raised {type(exc).__name__}: {exc}")
        with self._lock:
            i = self._next
            self._next += 1
        if i >= len(self.script):
            self.overruns += 1
            return http_error(
                500, f"stub script has {len(self.script)} replies; this is request {i + 1}"
            )
        return self.script[i]

    def _completion(self, request: dict[str, Any], reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
        if reply.get("refusal") is not None:
            message["refusal"] = reply["refusal"]
        if reply.get("tool_calls"):
            message["tool_calls"] = reply["tool_calls"]
        usage = reply.get("usage") or {
            "prompt_tokens": len(
                json.dumps([request.get("messages"), request.get("tools")], default=str)
            )
            // 4,
            "completion_tokens": len(json.dumps(message)) // 4,
        }
        usage = {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
        return {
            "id": f"chatcmpl-stub-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": request.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": reply.get("finish_reason")
                    or ("tool_calls" if reply.get("tool_calls") else "stop"),
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
