"""A real llama.cpp server (llama-cpp-python's) on loopback with a small GGUF model, a recording
proxy in front of it, and issue 32's measurement of the model door against it.

Why: the model door was only ever tested against our own scripted server (evals/openai_stub.py),
which accepts any schema and counts tokens as len(JSON)//4. A server nobody here wrote counts
tokens its own way, has a context limit and builds grammars from our schemas (and crashed on
some). This module measures the door as a lab would meet it, and re-runs the same measurement
on any nightshift tree (the "before" and "after" of issue 32):

    python -m nightshift.evals.llamacpp_server --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --server-python /work/llama-venv/bin/python --measure [--nightshift PATH]

`--nightshift` is the tree's `nightshift` command (default: the one beside this interpreter);
its own interpreter beside it gives the tool schemas. The measurement prints one table per part:
each tool schema sent alone with that tool forced (does the server survive building its
grammar?), `nightshift doctor`, and a dozen everyday requests (English and Chinese) through
`nightshift chat --once` against a daemon holding a succeeded, a failed and a running job. Per
request: the tools that ran, the exit code, the model steps, the prompt tokens of each step as
the SERVER counted them (usage.prompt_tokens, recorded by the proxy), context overflows, crashes
and seconds. The build and the model install are in docs/llamacpp.md.

Processes are started with argv lists and stopped by their PID (and a running job's process
group by the id its handle file records), never by name.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psutil

CHAT_FORMAT = "chatml-function-calling"
# "This model's maximum context length is 8192 tokens. However, you requested 8734 tokens (8734 in
# the messages, None in the completion)…" (llama_cpp/server/errors.py)
OVERFLOW_COUNT = re.compile(r"\((\d+) in the messages")
N_CTX = 8192
READY_S = 120.0  # loading a GGUF of a few hundred MB on a slow disk
TURN_S = 600.0  # one chat turn, at most: 30 steps of a small model on two cores can take long


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _signal_name(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
    return f"exit {code}"


# ------------------------------------------------------------------------------ the server
@dataclass
class LlamaServer:
    """`python -m llama_cpp.server` with one GGUF on 127.0.0.1, started and stopped by PID. Its
    output goes to `log` (it is where a crash's last words are)."""

    model: Path
    python: str = field(default_factory=lambda: sys.executable)
    port: int = 0
    n_ctx: int = N_CTX
    chat_format: str = CHAT_FORMAT
    log: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def argv(self) -> list[str]:
        return [
            self.python,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model),
            "--chat_format",
            self.chat_format,
            "--n_ctx",
            str(self.n_ctx),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]

    def start(self, ready_s: float = READY_S) -> LlamaServer:
        """Start it and wait until GET /v1/models answers; RuntimeError (with the log's end)
        when it dies or does not answer in time."""
        if not self.model.is_file():
            raise FileNotFoundError(f"--model {self.model}: no such GGUF file")
        self.port = self.port or free_port()
        if self.log is None:
            self.log = Path(tempfile.mkdtemp(prefix="llamacpp-")) / "server.log"
        out = self.log.open("ab")
        try:
            self.proc = subprocess.Popen(
                self.argv(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            out.close()
        self.starts += 1
        deadline = time.monotonic() + ready_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(
                    f"llama.cpp server ended ({self.exit_status()}) before it answered:\n"
                    + self.log_tail()
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return self
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"llama.cpp server did not answer within {ready_s:g} s")

    def models(self) -> list[str]:
        """The model ids GET /v1/models lists."""
        listed = httpx.get(f"{self.base_url}/models", timeout=30).json()
        return [str(m["id"]) for m in listed.get("data") or []]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_status(self) -> str:
        """`running`, `SIGSEGV` (a crash), `exit 1`…"""
        return _signal_name(None if self.proc is None else self.proc.poll())

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        """SIGTERM to its PID, SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 15) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------------ the proxy
@dataclass
class Exchange:
    """One chat completion through the proxy, as the server answered it."""

    status: int
    seconds: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tools_sent: list[str] = field(default_factory=list)
    max_tokens: int | None = None
    finish_reason: str | None = None
    tool_called: str | None = None
    error: str = ""

    @property
    def overflow(self) -> bool:
        """The server refused the prompt as longer than its context."""
        return self.status == 400 and "context" in self.error.lower()


class RecordingProxy:
    """An HTTP proxy on 127.0.0.1 that forwards everything to the server and records each chat
    completion's usage as the server counted it. Whoever talks to the model door (the chat, the
    doctor) is pointed at `base_url`; `exchanges[mark:]` are the ones since `mark`. The tools of
    every request are kept by name in `tools`: the schemas the door really sent."""

    def __init__(self, upstream: str, timeout_s: float = TURN_S):
        self.upstream = upstream.rstrip("/")
        self.timeout_s = timeout_s
        self.exchanges: list[Exchange] = []
        self.tools: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "start the proxy first"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    @property
    def mark(self) -> int:
        with self._lock:
            return len(self.exchanges)

    def since(self, mark: int) -> list[Exchange]:
        with self._lock:
            return list(self.exchanges[mark:])

    def start(self) -> RecordingProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:  # noqa: N802
                self._forward(None)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                self._forward(self.rfile.read(length) if length else b"")

            def _forward(self, body: bytes | None) -> None:
                status, data = proxy._relay(self.command, self.path, body, self.headers)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (its timeout): the exchange is recorded anyway

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False

        self._httpd = Server(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self._httpd.serve_forever, name="llamacpp-proxy", daemon=True
        ).start()
        return self

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> RecordingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _relay(self, method: str, path: str, body: bytes | None, headers: Any) -> tuple[int, bytes]:
        # The client's path starts with /v1 as the upstream's does: keep what follows it.
        tail = path[3:] if path.startswith("/v1") else path
        started = time.monotonic()
        try:
            resp = httpx.request(
                method,
                self.upstream + tail,
                content=body,
                headers={"Content-Type": headers.get("Content-Type") or "application/json"},
                timeout=self.timeout_s,
            )
            status, data = resp.status_code, resp.content
        except httpx.HTTPError as exc:
            status = 502
            data = json.dumps(
                {"error": {"message": f"proxy: the server did not answer: {exc!r}"}}
            ).encode()
        if method == "POST" and tail.rstrip("/").endswith("/chat/completions"):
            self._record(body or b"", status, data, time.monotonic() - started)
        return status, data

    def _record(self, body: bytes, status: int, data: bytes, seconds: float) -> None:
        try:
            request = json.loads(body)
        except ValueError:
            request = {}
        try:
            reply = json.loads(data)
        except ValueError:
            reply = {"error": {"message": data[:300].decode(errors="replace")}}
        tools = [t for t in request.get("tools") or [] if isinstance(t, dict)]
        ex = Exchange(
            status=status,
            seconds=round(seconds, 2),
            tools_sent=[str(t.get("function", {}).get("name")) for t in tools],
            max_tokens=request.get("max_tokens"),
        )
        if status == 200 and isinstance(reply, dict):
            usage = reply.get("usage") or {}
            ex.prompt_tokens = usage.get("prompt_tokens")
            ex.completion_tokens = usage.get("completion_tokens")
            choice = (reply.get("choices") or [{}])[0]
            ex.finish_reason = choice.get("finish_reason")
            calls = (choice.get("message") or {}).get("tool_calls") or []
            if calls:
                ex.tool_called = (calls[0].get("function") or {}).get("name")
        else:
            err = reply.get("error") if isinstance(reply, dict) else None
            message = err.get("message") if isinstance(err, dict) else (err or reply)
            ex.error = " ".join(str(message).split())[:300]
            # llama-cpp-python's overflow names the prompt as it counted it: keep that count.
            counted = OVERFLOW_COUNT.search(ex.error)
            if counted:
                ex.prompt_tokens = int(counted.group(1))
        with self._lock:
            self.exchanges.append(ex)
            for t in tools:
                self.tools.setdefault(str(t.get("function", {}).get("name")), t)


# ------------------------------------------------------------------------------ the schemas
def tree_tool_schemas(nightshift: str) -> list[dict[str, Any]]:
    """The tool schemas the tree's model door sends (agent.brain.llm.tool_schemas), read by the
    tree's own interpreter (the `python` beside its `nightshift`)."""
    python = str(Path(nightshift).with_name("python"))
    code = (
        "import json; from nightshift.agent.brain.llm import tool_schemas; "
        "print(json.dumps(tool_schemas()))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"cannot read the tree's tool schemas:\n{out.stderr[-2000:]}")
    return list(json.loads(out.stdout))


def schema_keywords(schema: Any) -> set[str]:
    """Every key used anywhere in a JSON schema (maxLength, pattern, anyOf…)."""
    found: set[str] = set()
    if isinstance(schema, dict):
        for k, v in schema.items():
            found.add(k)
            found |= schema_keywords(v)
    elif isinstance(schema, list):
        for v in schema:
            found |= schema_keywords(v)
    return found


def without(schema: Any, keyword: str) -> Any:
    """The schema with `keyword` dropped wherever it is a key."""
    if isinstance(schema, dict):
        return {k: without(v, keyword) for k, v in schema.items() if k != keyword}
    if isinstance(schema, list):
        return [without(v, keyword) for v in schema]
    return schema


# The keywords whose grammar rules llama.cpp repeats: a bound on a string's length or on an array
# of objects becomes that many copies of a rule, which its grammar parser refuses ("number of rules
# that are going to be repeated … exceeds sane defaults") before the server dies.
REPEATS = ("maxLength", "maxItems", "minItems")


@dataclass
class SchemaProbe:
    tool: str
    repeats: list[str]  # which of REPEATS the schema uses
    result: str  # ok | HTTP n | crash: SIGSEGV
    server_said: str = ""  # the grammar error the server logged, if any
    stripped: str = ""  # after a crash: the result with REPEATS dropped one by one


def probe_schema(server: LlamaServer, tool: dict[str, Any], model: str) -> tuple[str, str]:
    """One tool alone, that tool forced (so the server builds its grammar from the schema):
    `ok`, `HTTP n`, or `crash: SIGNAL` (the server is restarted); and the grammar error the
    server logged meanwhile."""
    name = tool["function"]["name"]
    logged = server.log.stat().st_size if server.log and server.log.exists() else 0
    try:
        resp = httpx.post(
            f"{server.base_url}/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": f"Call {name}."}],
                "tools": [tool],
                "tool_choice": {"type": "function", "function": {"name": name}},
                "temperature": 0,
                "max_tokens": 48,
            },
            timeout=TURN_S,
        )
        outcome = "ok" if resp.status_code == 200 else f"HTTP {resp.status_code}"
    except httpx.HTTPError as exc:
        outcome = f"no answer ({type(exc).__name__})"
    time.sleep(0.2)
    said = ""
    if server.log and server.log.exists():
        with server.log.open("rb") as f:
            f.seek(logged)
            for line in f.read().decode(errors="replace").splitlines():
                if "error parsing grammar" in line:
                    said = line.split("error parsing grammar:", 1)[-1].strip()[:90]
    if not server.alive():
        outcome = f"crash: {server.exit_status()}"
        server.restart()
    return outcome, said


def probe_schemas(
    server: LlamaServer, tools: list[dict[str, Any]], model: str
) -> list[SchemaProbe]:
    probes = []
    for tool in tools:
        params = tool.get("function", {}).get("parameters", {})
        used = [k for k in REPEATS if k in schema_keywords(params)]
        probe = SchemaProbe(tool["function"]["name"], used, *probe_schema(server, tool, model))
        if probe.result.startswith("crash") and used:
            stripped, dropped = tool, list[str]()
            for keyword in used:
                stripped, dropped = without(stripped, keyword), [*dropped, keyword]
                result, _ = probe_schema(server, stripped, model)
                probe.stripped = f"{result} without {'+'.join(dropped)}"
                if result == "ok":
                    break
        probes.append(probe)
    return probes


# ------------------------------------------------------------------------------ the world
REQUESTS: list[tuple[str, set[str]]] = [
    # (what a person types, the skills that answer it: one of them running ok is a hit)
    ("status", {"list_jobs"}),
    ("what is running?", {"list_jobs"}),
    ("why did job 2 fail?", {"diagnose_failure"}),
    ("show me the logs of job 1", {"job_logs"}),
    ("logs 2", {"job_logs"}),
    ("are the GPUs ok for an overnight run?", {"gpu_health_check"}),
    ("submit {world}/spec.yaml tonight when power is cheap", {"submit_job"}),
    ("what did last night cost?", {"list_jobs", "show_job", "compare_jobs"}),
    ("现在有哪些任务在跑？", {"list_jobs"}),
    ("任务2为什么失败了？", {"diagnose_failure"}),
    ("显示任务1的日志", {"job_logs"}),
    ("cancel job 3", {"cancel_job"}),
]

SPEC = """\
name: tiny
code:
  path: {examples}
command: ["{{python}}", "train_numpy.py", "--lr", "{{lr}}", "--steps", "{{steps}}",
          "--checkpoint-dir", "{{checkpoint_dir}}", "--metrics-file", "{{metrics_file}}"]
parameters: {{lr: 0.01, steps: 40}}
resources: {{gpus: 0, expected_duration_min: 1}}
checkpoint: {{dir: checkpoints, resume_arg: ["--resume", "{{checkpoint}}"], every_steps: 10}}
metrics: {{file: metrics.jsonl, name: loss, mode: min}}
"""

# A succeeded job, a failed one (a CUDA OOM in its log, no retries) and one still running (a
# bounded sleep: it ends by itself if everything else fails to stop it).
JOBS = [
    "print('step 1 loss 0.50'); print('step 2 loss 0.40')",
    "import sys; print('step 1 loss 0.90', flush=True); "
    "sys.exit('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB')",
    "import time\nfor i in range(900):\n    print(f'step {i} loss {1 / (i + 1):.4f}', flush=True)"
    "\n    time.sleep(1)",
]
STATES = ["succeeded", "failed", "running"]


@dataclass
class World:
    """A scratch NIGHTSHIFT_HOME under /tmp with a daemon holding JOBS in STATES."""

    nightshift: str
    home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ns-llamacpp-")))
    daemon: subprocess.Popen[bytes] | None = None
    settings: dict[str, str] = field(default_factory=dict)  # NIGHTSHIFT_LLM__… for the door

    @property
    def python(self) -> str:
        return str(Path(self.nightshift).with_name("python"))

    def env(self, base_url: str | None = None, model: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTSHIFT_", "OPENAI_"))}
        env.update(
            NIGHTSHIFT_HOME=str(self.home),
            NIGHTSHIFT_GPU__PROBE="none",
            NIGHTSHIFT_LOOP__POLL_INTERVAL_S="0.2",
        )
        if base_url and model:
            env.update(OPENAI_BASE_URL=base_url, NIGHTSHIFT_MODEL=model, **self.settings)
        return env

    def run(self, *args: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.nightshift, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.home,
            env=kw.get("env") or self.env(),
            stdin=subprocess.DEVNULL,
        )

    def start(self) -> World:
        code = "import nightshift.examples as e, os; print(os.path.dirname(e.__file__))"
        out = subprocess.run([self.python, "-c", code], capture_output=True, text=True, timeout=60)
        examples = Path(out.stdout.strip())
        (self.home / "world").mkdir()
        (self.home / "world" / "spec.yaml").write_text(SPEC.format(examples=examples))
        log = (self.home / "daemon.log").open("ab")
        try:
            self.daemon = subprocess.Popen(
                [self.nightshift, "daemon"],
                cwd=self.home,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        finally:
            log.close()
        for code in JOBS:
            r = self.run("submit", "--json", "--", self.python, "-c", code)
            if r.returncode != 0:
                raise RuntimeError(f"submit failed: {r.stdout}{r.stderr}")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.states() == STATES:
                return self
            time.sleep(0.5)
        raise RuntimeError(f"the world's jobs are {self.states()}, not {STATES}")

    def states(self) -> list[str]:
        r = self.run("jobs", "--json")
        rows = json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else []
        rows = rows.get("jobs", rows) if isinstance(rows, dict) else rows
        return [str(j.get("state")) for j in sorted(rows, key=lambda j: j["id"])]

    def stop(self) -> None:
        """The daemon by its PID, then each run still alive by the process group its handle
        file records (runs outlive the daemon by design)."""
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.daemon.wait(timeout=30)
        for handle in (self.home / "runs" / "handles").glob("*.json"):
            with contextlib.suppress(ValueError, OSError, KeyError, TypeError, psutil.Error):
                run = json.loads(handle.read_text())
                pid, pgid = int(run["pid"]), int(run["pgid"])
                # Only the process the handle names, still alive (a reused id is someone else's).
                if pgid > 1 and abs(psutil.Process(pid).create_time() - run["create_time"]) < 1:
                    os.killpg(pgid, signal.SIGTERM)


# ------------------------------------------------------------------------------ the measurement
@dataclass
class Turn:
    request: str
    expected: set[str]
    exit_code: int | None
    seconds: float
    tools: list[str]  # skill:status of each call, in order
    exchanges: list[Exchange]
    answer: str = ""
    crashed: str = ""

    @property
    def hit(self) -> bool:
        """One of the expected skills ran, or waits for a person's approval (a destructive
        call's right outcome)."""
        return any(
            t.split(":")[0] in self.expected and t.endswith((":ok", ":pending")) for t in self.tools
        )

    @property
    def prompts(self) -> list[int]:
        """Each step's prompt tokens as the server counted them (an overflowed one too)."""
        return [e.prompt_tokens for e in self.exchanges if e.prompt_tokens is not None]

    def steps_text(self) -> str:
        return " / ".join(
            f"{e.prompt_tokens}{' (overflow)' if e.overflow else ''}"
            for e in self.exchanges
            if e.prompt_tokens is not None
        )


def chat_turn(
    world: World,
    proxy: RecordingProxy,
    server: LlamaServer,
    model: str,
    text: str,
    expected: set[str],
    turn_s: float = TURN_S,
) -> Turn:
    """One `nightshift chat --once TEXT --json` against the proxy; a turn that runs past
    `turn_s` is ended (exit `timeout`)."""
    mark, started = proxy.mark, time.monotonic()
    try:
        r = world.run(
            "chat", "--once", text, "--json", timeout=turn_s, env=world.env(proxy.base_url, model)
        )
        code: int | None = r.returncode
        lines = r.stdout.splitlines()
    except subprocess.TimeoutExpired as exc:
        code = None
        lines = (
            (exc.stdout or b"").decode(errors="replace").splitlines()
            if isinstance(exc.stdout, bytes)
            else (exc.stdout or "").splitlines()
        )
    seconds = time.monotonic() - started
    cards: dict[str, str] = {}
    answer = ""
    for line in lines:
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("kind") == "tool":
                cards[event["call_id"]] = f"{event['skill']}:{event['status']}"
            elif event.get("kind") == "answer":
                answer = str(event.get("text") or "")
    turn = Turn(
        text,
        expected,
        code,
        round(seconds, 1),
        list(cards.values()),
        proxy.since(mark),
        answer=" ".join(answer.split()),
    )
    if not server.alive():
        turn.crashed = server.exit_status()
        server.restart()
    return turn


@dataclass
class DoctorRun:
    exit_code: int
    rows: list[str]
    exchanges: list[Exchange]


def run_doctor(world: World, proxy: RecordingProxy, model: str) -> DoctorRun:
    """`nightshift doctor --json`: its model rows (the endpoint, /models, the chat, the tool
    call) and its exit code."""
    mark = proxy.mark
    r = world.run("doctor", "--json", timeout=TURN_S, env=world.env(proxy.base_url, model))
    try:
        checks = json.loads(r.stdout)
    except ValueError:
        checks = [{"area": "output", "status": "?", "detail": r.stdout[-300:] + r.stderr[-300:]}]
    model_areas = ("model endpoint", "GET /models", "chat completion", "tool calls")
    rows = [
        f"{c.get('area')}: {c.get('status')}: {c.get('detail')}"
        for c in checks
        if isinstance(c, dict) and c.get("area") in model_areas
    ]
    return DoctorRun(r.returncode, rows, proxy.since(mark))


# ------------------------------------------------------------------------------ the tables
def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(head: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (it goes into docs/llamacpp.md as it is printed)."""
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def _ends(text: str, head: int = 70, tail: int = 90) -> str:
    """A long answer's start and end (an endpoint failure's advice is at its end)."""
    return text if len(text) <= head + tail + 3 else f"{text[:head]} … {text[-tail:]}"


def turns_table(turns: list[Turn]) -> str:
    rows = []
    for t in turns:
        over = sum(e.overflow for e in t.exchanges)
        errors = sorted({e.error[:80] for e in t.exchanges if e.error and not e.overflow})
        rows.append(
            [
                t.request,
                "yes" if t.hit else "no",
                ", ".join(t.tools) or "none",
                "timeout" if t.exit_code is None else t.exit_code,
                len(t.exchanges),
                t.steps_text() or "-",
                over or "-",
                t.crashed or "-",
                t.seconds,
                "; ".join(errors) or _ends(t.answer) or "-",
            ]
        )
    return table(
        [
            "request",
            "right tool",
            "tools (skill:status)",
            "exit",
            "model steps",
            "prompt tokens per step (server)",
            "overflows",
            "server crash",
            "s",
            "error or answer",
        ],
        rows,
    )


def summary_table(turns: list[Turn]) -> str:
    prompts = [p for t in turns for p in t.prompts]
    model_turns = [t for t in turns if t.exchanges]
    first = [t.prompts[0] for t in model_turns if t.prompts]
    second = [t.prompts[1] for t in model_turns if len(t.prompts) > 1]
    overflowed = [t for t in turns if any(e.overflow for e in t.exchanges)]
    rows: list[list[Any]] = [
        ["requests", len(turns)],
        ["right tool ran (or awaits approval)", f"{sum(t.hit for t in turns)} of {len(turns)}"],
        ["requests that reached the model", len(model_turns)],
        ["prompt tokens, step 1 (min-max)", f"{min(first)}-{max(first)}" if first else "-"],
        ["prompt tokens, step 2 (min-max)", f"{min(second)}-{max(second)}" if second else "-"],
        ["prompt tokens per step, max", max(prompts) if prompts else "-"],
        ["requests with a context overflow", len(overflowed)],
        ["server crashes", sum(bool(t.crashed) for t in turns)],
        [
            "seconds per model turn (mean)",
            round(sum(t.seconds for t in model_turns) / len(model_turns), 1)
            if model_turns
            else "-",
        ],
    ]
    return table(["figure", "value"], rows)


def probes_table(probes: list[SchemaProbe]) -> str:
    return table(
        ["tool", "length/count bounds", "forced call", "server logged", "after a crash"],
        [[p.tool, ", ".join(p.repeats), p.result, p.server_said, p.stripped] for p in probes],
    )


def doctor_table(d: DoctorRun) -> str:
    rows = [[row] for row in d.rows]
    rows.append([f"exit {d.exit_code}"])
    for e in d.exchanges:
        rows.append(
            [
                f"server counted {e.prompt_tokens}+{e.completion_tokens} tokens, "
                f"HTTP {e.status}, tool {e.tool_called}, {e.seconds} s"
            ]
        )
    return table(["nightshift doctor (model rows)"], rows)


# ------------------------------------------------------------------------------ the command
def measure(args: argparse.Namespace) -> int:
    server = LlamaServer(Path(args.model), python=args.server_python, n_ctx=args.n_ctx)
    world = World(args.nightshift)
    for setting in args.set:
        key, _, value = setting.partition("=")
        if not key.startswith("NIGHTSHIFT_") or not value:
            raise SystemExit(
                f"--set {setting}: give NIGHTSHIFT_…=VALUE, e.g. NIGHTSHIFT_LLM__TIMEOUT_S=600"
            )
        world.settings[key] = value
    out: list[str] = [
        f"# llama.cpp measurement: {Path(args.model).name} (n_ctx {args.n_ctx}, {CHAT_FORMAT})",
        f"nightshift: {args.nightshift}; scratch home: {world.home}; settings beyond the "
        f"README's: {' '.join(args.set) or 'none'}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
    ]

    def show(text: str) -> None:
        out.append(text)
        print(text, flush=True)

    for line in out:
        print(line, flush=True)
    server.log = world.home / "llama-server.log"
    server.start()
    # The name the door sends is the one the server lists (README: "the model's name there").
    model_name = args.model_name or server.models()[0]
    proxy = RecordingProxy(server.base_url, timeout_s=args.turn_s).start()
    try:
        if not args.skip_schemas:
            tools = tree_tool_schemas(args.nightshift)
            show(f"\n## Each tool schema alone, that tool forced ({len(tools)} tools)\n")
            show(probes_table(probe_schemas(server, tools, model_name)))
        world.start()
        show("\n## nightshift doctor\n")
        show(doctor_table(run_doctor(world, proxy, model_name)))
        if not server.alive():
            show(f"server crash during doctor: {server.exit_status()}")
            server.restart()
        turns = []
        chosen = [
            (text, expected)
            for text, expected in REQUESTS
            if not args.only or any(o in text for o in args.only)
        ]
        for text, expected in chosen[: args.limit or None]:
            text = text.format(world=world.home / "world")
            turn = chat_turn(world, proxy, server, model_name, text, expected, args.turn_s)
            print(
                f"  {text!r}: exit {turn.exit_code}, {turn.tools}, prompts {turn.prompts}, "
                f"{turn.seconds} s",
                flush=True,
            )
            turns.append(turn)
        show("\n## Everyday requests (`nightshift chat --once TEXT`)\n")
        show(turns_table(turns))
        show("")
        show(summary_table(turns))
        sizes = sorted({len(e.tools_sent) for t in turns for e in t.exchanges})
        show(
            f"\ntools sent per step: {sizes or '-'}; "
            f"max_tokens sent: {sorted({str(e.max_tokens) for t in turns for e in t.exchanges})}; "
            f"server starts: {server.starts}"
        )
    finally:
        proxy.close()
        world.stop()
        server.stop()
    if args.out:
        Path(args.out).write_text("\n".join(out) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m nightshift.evals.llamacpp_server", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", required=True, help="A GGUF file (docs/llamacpp.md installs two)")
    p.add_argument(
        "--server-python",
        default=os.environ.get("NIGHTSHIFT_LLAMACPP_PYTHON") or sys.executable,
        help="The interpreter that has llama-cpp-python[server] (env NIGHTSHIFT_LLAMACPP_PYTHON)",
    )
    p.add_argument("--n-ctx", type=int, default=N_CTX)
    p.add_argument(
        "--model-name", help="The name the door sends (default: the one /v1/models lists)"
    )
    p.add_argument(
        "--nightshift",
        default=shutil.which("nightshift", path=str(Path(sys.executable).parent)) or "nightshift",
        help="The measured tree's `nightshift` command (its `python` must be beside it)",
    )
    p.add_argument("--measure", action="store_true", help="Run the measurement, print tables")
    p.add_argument("--skip-schemas", action="store_true", help="Leave out the schema probes")
    p.add_argument("--limit", type=int, default=0, help="Only the first N requests")
    p.add_argument(
        "--only", action="append", default=[], help="Only the requests containing this text"
    )
    p.add_argument("--turn-s", type=float, default=TURN_S, help="One request's time limit")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NIGHTSHIFT_X__Y=V",
        help="A setting for the door beyond the README's (default: none), e.g. "
        "NIGHTSHIFT_LLM__TIMEOUT_S=600",
    )
    p.add_argument("--out", help="Also write the tables to this file")
    p.add_argument("--serve", action="store_true", help="Only start the server; stop on Ctrl-C")
    args = p.parse_args(argv)
    if args.measure:
        return measure(args)
    if args.serve:
        with LlamaServer(Path(args.model), python=args.server_python, n_ctx=args.n_ctx) as srv:
            print(
                f"serving {args.model} at {srv.base_url} (pid {srv.proc.pid if srv.proc else '?'})"
            )
            with contextlib.suppress(KeyboardInterrupt):
                while srv.alive():
                    time.sleep(1)
            print(f"server {srv.exit_status()}")
        return 0
    p.error("say --measure or --serve")
    return 2


if __name__ == "__main__":
    sys.exit(main())
