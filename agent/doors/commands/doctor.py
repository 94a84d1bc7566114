"""`nightshift doctor`: what this machine and configuration have, what answers, and what is
missing — the model endpoint (configured? does it answer `/models` and a chat completion with a
tool? do tool calls come back parsed?), the GPU probe, the store, dockerd, a Ray or Kubernetes
cluster, the daemon and the approval channels — each with the fix. It never prints the API key
(nor a channel's secret or the store's password), and never a traceback.

Exit code: 0 when nothing failed (warnings are things you may not need: no model endpoint, no
GPU, no dockerd unless the docker executor is configured), 5 when a check failed: the operator
fixes the configuration or the environment, as elsewhere in nightshift. An endpoint that does
not answer is 5 here and 5 from `nightshift chat --once` and `nightshift run` (llm.EXIT_ENDPOINT).

The tool call that comes back is checked, not only parsed: `doctor_ping`'s `word` must be
exactly "pong" (a server that HTML-escapes or pads arguments answered `pong&#34;`), and the
check says which tool-call mode the server gave: calls parsed by the server into `tool_calls`
(what the planner needs), or a call written as text in the content (not parsed: a template or
parser is missing).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

import typer
from rich.text import Text

from nightshift.agent.doors.console import console, say, table
from nightshift.runtime.errors import NightshiftError

if TYPE_CHECKING:
    from nightshift.agent.brain.llm import Endpoint
    from nightshift.runtime.config import Settings

Status = Literal["ok", "warn", "fail", "info"]
COLOURS = {"ok": "green", "warn": "yellow", "fail": "bold red", "info": "cyan"}
EXIT_FAILED = 5  # = llm.EXIT_ENDPOINT: one code for an endpoint failure, here and in chat/run
PING = "doctor_ping"
PONG = "pong"
PING_REPLY_TOKENS = 128  # sent as max_tokens: enough for one short tool call
PING_TOOL = {
    "type": "function",
    "function": {
        "name": PING,
        "description": "Answer a connection check.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string"}},
            "required": ["word"],
        },
    },
}
TOOL_PARSER_HINT = (
    "the server must parse tool calls for this model: llama.cpp server with --jinja, vLLM with "
    "--enable-auto-tool-choice --tool-call-parser NAME, Ollama with a model that supports tools"
)


@dataclass
class Check:
    area: str
    status: Status
    detail: str
    fix: str = ""


def doctor(
    config: str | None = typer.Option(
        None, "--config", help="Config file (default $NIGHTSHIFT_HOME/config.yaml)"
    ),
    timeout_s: float = typer.Option(
        20.0, "--timeout", min=0.1, help="Seconds each request to the model endpoint may take"
    ),
    as_json: bool = typer.Option(False, "--json", help="The checks as JSON"),
) -> None:
    """Check the model endpoint, GPU probe, store, dockerd, cluster, daemon and approval channels.
    Exit 0 when nothing failed, 5 when something must be fixed."""
    checks = run_checks(config, timeout_s)
    if as_json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        rows = [[c.area, Text(c.status, style=COLOURS[c.status]), c.detail, c.fix] for c in checks]
        console.print(
            table("nightshift doctor", ["check", "status", "detail", "fix"], rows, overflow="fold")
        )
        failed = [c.area for c in checks if c.status == "fail"]
        if failed:
            say("[bold red]{} check(s) failed:[/] {}", len(failed), ", ".join(failed))
        else:
            say("[green]nothing failed[/]")
    raise typer.Exit(EXIT_FAILED if any(c.status == "fail" for c in checks) else 0)


def run_checks(config: str | None, timeout_s: float) -> list[Check]:
    """Every check, in order; a check that breaks is a failed check, never a traceback."""
    from nightshift.runtime.config import load_settings_with_sources

    try:
        settings, sources = load_settings_with_sources(config)
    except NightshiftError as exc:
        return [Check("config", "fail", str(exc), "fix the file or variable it names")]
    checks = [
        Check(
            "config",
            "ok",
            f"NIGHTSHIFT_HOME {settings.home}; "
            + (
                f"{len(sources)} value(s) set ({', '.join(sorted(set(sources.values())))})"
                if sources
                else "all defaults"
            ),
        )
    ]
    for area, fn in (
        ("model endpoint", lambda: _model(settings, sources, timeout_s)),
        ("GPU probe", lambda: [_gpu(settings)]),
        ("store", lambda: [_store(settings)]),
        ("dockerd", lambda: [_docker(settings)]),
        ("cluster", lambda: _cluster(settings)),
        ("daemon", lambda: [_daemon(settings)]),
        ("approval channels", lambda: _channels(settings)),
    ):
        checks += _safely(area, fn)
    return checks


def _safely(area: str, fn: Callable[[], list[Check]]) -> list[Check]:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001  (the doctor reports; it does not crash)
        return [Check(area, "fail", f"the check itself failed: {type(exc).__name__}: {exc}")]


# ------------------------------------------------------------------------------ the model
def _model(settings: Settings, sources: dict[str, str], timeout_s: float) -> list[Check]:
    from nightshift.agent.brain.llm import endpoint

    try:
        ep = endpoint(settings)
    except NightshiftError as exc:
        return [Check("model endpoint", "fail", str(exc), "fix the key file's permissions")]
    if ep is None:
        missing = [k for k in ("base_url", "model") if not getattr(settings.llm, k)]
        return [
            Check(
                "model endpoint",
                "warn",
                f"not configured ({' and '.join('llm.' + m for m in missing)} unset): goal files "
                "and playbooks work; free-form chat and `planner: llm` need a model",
                "export OPENAI_BASE_URL=http://127.0.0.1:8080/v1 NIGHTSHIFT_MODEL=NAME "
                "(and OPENAI_API_KEY if the server needs one)",
            )
        ]
    key_from = sources.get("llm.api_key") or (
        f"file {settings.llm.api_key_file}" if settings.llm.api_key_file else None
    )
    checks = [
        Check(
            "model endpoint",
            "ok",
            f"{ep.model} at {ep.base_url} (from {sources.get('llm.base_url', 'defaults')}); "
            + (
                f"API key set ({key_from})"
                if key_from
                else "no API key (a local server needs none)"
            ),
        )
    ]
    from dataclasses import replace

    ep = replace(ep, timeout_s=min(ep.timeout_s, timeout_s), max_retries=0)
    client = ep.client()
    checks.append(_models(ep, client))
    if checks[-1].status == "fail" and "cannot reach" in checks[-1].detail:
        checks.append(Check("tool calls", "fail", "not tried: the endpoint does not answer"))
        return checks
    checks += _chat(ep, client)
    if any(c.area == "chat completion" and c.status == "ok" for c in checks):
        checks.append(_constrained(ep, client, settings.llm.tool_mode))
    return checks


def _models(ep: Endpoint, client: Any) -> Check:
    import openai

    from nightshift.agent.brain.llm import endpoint_failure

    try:
        listed = [m.id for m in client.models.list()]
    except openai.NotFoundError:
        return Check("GET /models", "warn", "not served (some servers lack it); trying a chat")
    except Exception as exc:  # noqa: BLE001
        return Check(
            "GET /models",
            "fail",
            endpoint_failure(ep, exc),
            "start the server, or fix OPENAI_BASE_URL / OPENAI_API_KEY",
        )
    if ep.model in listed:
        return Check("GET /models", "ok", f"answers; {len(listed)} model(s), {ep.model} among them")
    return Check(
        "GET /models",
        "warn",
        f"answers, but {ep.model} is not among {', '.join(listed[:8]) or 'none'}"
        + (" …" if len(listed) > 8 else ""),
        "set NIGHTSHIFT_MODEL to a listed name (some servers serve any name)",
    )


def _chat(ep: Endpoint, client: Any) -> list[Check]:
    from nightshift.agent.brain.llm import endpoint_failure
    from nightshift.prompts import load

    started = time.monotonic()
    try:
        resp = client.chat.completions.create(
            model=ep.model,
            messages=[{"role": "user", "content": load("doctor")}],
            tools=[PING_TOOL],
            tool_choice="auto",  # as the planner asks (llama-cpp-python: absent means "none")
            temperature=0,
            max_tokens=PING_REPLY_TOKENS,
        )
    except Exception as exc:  # noqa: BLE001
        return [
            Check("chat completion", "fail", endpoint_failure(ep, exc), "see the server's log"),
            Check("tool calls", "fail", "not tried: the chat completion failed"),
        ]
    took = time.monotonic() - started
    usage = getattr(resp, "usage", None)
    tokens = (
        f", {usage.prompt_tokens}+{usage.completion_tokens} tokens"
        if usage is not None and getattr(usage, "prompt_tokens", None) is not None
        else ""
    )
    choices = getattr(resp, "choices", None) or []
    if not choices:
        return [Check("chat completion", "fail", "answered without any choice", TOOL_PARSER_HINT)]
    msg = choices[0].message
    checks = [Check("chat completion", "ok", f"answered in {took:.2f} s{tokens}")]
    calls = [tc for tc in msg.tool_calls or [] if getattr(tc, "function", None) is not None]
    if not calls:
        said = (msg.refusal or msg.content or "").strip()
        if PING in said:
            what = f"mode: a call written as text, not parsed into tool_calls: {said[:120]!r}"
        elif said:
            what = f"text instead: {said[:120]!r}"
        else:
            what = "content null" if msg.content is None else f"empty content {msg.content!r}"
        checks.append(
            Check("tool calls", "fail", f"no tool call came back ({what})", TOOL_PARSER_HINT)
        )
        return checks
    fn = calls[0].function
    try:
        args = json.loads(fn.arguments or "{}")
    except ValueError:
        args = None
    if not isinstance(args, dict):
        checks.append(
            Check(
                "tool calls",
                "fail",
                f"{fn.name} came back with arguments that are not a JSON object: "
                f"{(fn.arguments or '')[:120]!r}",
                TOOL_PARSER_HINT,
            )
        )
    elif fn.name != PING:
        checks.append(
            Check(
                "tool calls",
                "warn",
                f"parsed, but the model called {fn.name!r}, not {PING}: it may choose tools poorly",
            )
        )
    elif args.get("word") != PONG:
        checks.append(
            Check(
                "tool calls",
                "fail",
                f"parsed, but the arguments are wrong: word is {args.get('word')!r}, not "
                f"{PONG!r}: the server or the model mangles arguments, and a job id or a path "
                "would be mangled the same way",
                "try another chat template or tool-call parser for this model, or a larger model",
            )
        )
    else:
        checks.append(
            Check(
                "tool calls",
                "ok",
                f"parsed: {fn.name}({json.dumps(args, ensure_ascii=False)}); mode: tool calls "
                "parsed by the server",
            )
        )
    return checks


def _constrained(ep: Endpoint, client: Any, mode: str) -> Check:
    """Whether the endpoint decodes under a JSON schema, in OpenAI's form (`json_schema`) or
    llama-cpp-python's (`json_object` with a `schema`), so the planner's calls can be made
    unbreakable (llm.tool_mode)."""
    from nightshift.prompts import load

    schema = {
        "type": "object",
        "properties": {"word": {"type": "string", "enum": [PONG]}},
        "required": ["word"],
    }
    forms = {
        "json_schema": {
            "type": "json_schema",
            "json_schema": {"name": "ping", "schema": schema, "strict": True},
        },
        "json_object": {"type": "json_object", "schema": schema},
    }
    said: dict[str, str] = {}
    offered: list[str] = []
    for name, form in forms.items():
        try:
            resp = client.chat.completions.create(
                model=ep.model,
                messages=[{"role": "user", "content": load("doctor_constrained")}],
                response_format=form,
                temperature=0,
                max_tokens=PING_REPLY_TOKENS,
            )
            content = (resp.choices[0].message.content or "") if resp.choices else ""
        except Exception as exc:  # noqa: BLE001  (a server that refuses the form: not offered)
            said[name] = f"HTTP {getattr(exc, 'status_code', '?')}"
            continue
        try:
            value = json.loads(content)
        except ValueError:
            value = None
        if value == {"word": PONG}:
            offered.append(name)
        else:
            said[name] = f"accepted but not enforced: {content[:60]!r}"
    using = f"the planner uses llm.tool_mode: {mode}"
    missed = "; ".join(f"{k}: {v}" for k, v in said.items())
    if mode != "tools" and mode not in offered:
        return Check(
            "constrained output",
            "fail",
            f"llm.tool_mode is {mode}, which this endpoint does not enforce ({missed})",
            f"llm.tool_mode: {offered[0]}" if offered else "llm.tool_mode: tools",
        )
    if offered:
        return Check(
            "constrained output",
            "ok",
            f"offered: response_format {' and '.join(offered)} decoded under the schema"
            + (f" ({missed})" if missed else "")
            + f"; {using}",
            ""
            if mode != "tools"
            else f"llm.tool_mode: {offered[0]} makes a small model's calls unbreakable",
        )
    return Check("constrained output", "info", f"not offered ({missed}); {using}")


# ------------------------------------------------------------------------------ the machine
def _gpu(settings: Settings) -> Check:
    from nightshift.runtime.gpu.gpu import make_probe

    probe = make_probe(settings)
    result = probe.read()
    n = len(result.gpus)
    if n:
        names = sorted({g.name or "?" for g in result.gpus})
        detail = f"{result.backend}: {n} GPU(s) ({', '.join(names)})"
        if result.error:
            return Check("GPU probe", "warn", f"{detail}; {result.error}", "`nightshift health`")
        return Check("GPU probe", "ok", detail)
    why = result.error or result.message or "no GPU visible"
    return Check(
        "GPU probe",
        "warn",
        f"{result.backend}: no GPU ({why}); CPU jobs only",
        "install the NVIDIA driver (NVML / nvidia-smi), or declare gpu.inventory",
    )


def _store(settings: Settings) -> Check:
    """The store opens and is at this release's schema (it is migrated if it is older)."""
    from nightshift.runtime.store.db import Store
    from nightshift.runtime.store.migrations import HEAD
    from nightshift.runtime.store.runs_binding import check_store_present

    url = settings.store_url
    shown = url.split("@")[-1] if "@" in url else url  # never the password
    try:
        check_store_present(url, settings.runs_dir)  # a vanished store is reported, not made
        store = Store(url, busy_timeout_s=min(settings.store.busy_timeout_s, 10.0))
    except NightshiftError as exc:
        return Check("store", "fail", str(exc), "fix store.url, or start the database it names")
    dialect = store.engine.dialect.name
    store.engine.dispose()
    return Check("store", "ok", f"{dialect} at {shown}, schema {HEAD}")


def _cluster(settings: Settings) -> list[Check]:
    """A Ray head's Jobs API or a Kubernetes API answers, with the rights the executor needs
    (looking a run up by its key is a read of each)."""
    kind = settings.executor.kind
    if kind not in ("ray", "kubernetes"):
        return []
    from nightshift.agent.brain.wiring import Wiring

    where = (
        settings.executor.ray_address
        if kind == "ray"
        else settings.executor.kubernetes.api_url or "the kubeconfig's cluster"
    )
    try:
        Wiring(settings).executor.find("nightshift-doctor")
    except (NightshiftError, ImportError) as exc:
        return [
            Check(
                f"cluster: {kind}",
                "fail",
                f"{where}: {exc}",
                "see the README, 'Beyond one machine'",
            )
        ]
    return [Check(f"cluster: {kind}", "ok", f"{where} answers")]


def _docker(settings: Settings) -> Check:
    from nightshift.runtime.executors.docker_executor import DEFAULT_DOCKER_HOST

    url = settings.executor.docker_url or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    needed = settings.executor.kind == "docker"
    bad: Status = "fail" if needed else "info"
    why_needed = (
        "executor.kind is docker: jobs need it"
        if needed
        else "only the docker executor needs it (executor.kind is local)"
    )
    try:
        answered = _docker_ping(url)
    except OSError as exc:
        return Check(
            "dockerd",
            bad,
            f"not reachable at {url} ({exc.strerror or exc}); {why_needed}",
            "start dockerd (`systemctl start docker`), join the docker group, or set "
            "executor.docker_url"
            if needed
            else "",
        )
    if answered is None:
        return Check("dockerd", "info", f"{url}: not checked (only unix:// and tcp:// are)")
    if not answered.startswith("OK"):
        return Check("dockerd", bad, f"{url} answered {answered[:80]!r}; {why_needed}")
    if needed:
        try:
            import docker  # noqa: F401
        except ImportError:
            return Check(
                "dockerd",
                "fail",
                f"answers at {url}, but the Docker SDK is not installed",
                "pip install 'nightshift[docker]'",
            )
    return Check("dockerd", "ok", f"answers at {url}" + ("" if needed else f"; {why_needed}"))


def _docker_ping(url: str, timeout_s: float = 3.0) -> str | None:
    """The body of dockerd's GET /_ping ("OK"), or None for a URL kind not checked here."""
    if url.startswith("unix://"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address: Any = url.removeprefix("unix://")
    elif url.startswith("tcp://"):
        host, _, port = url.removeprefix("tcp://").partition(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        address = (host, int(port.split("/")[0] or 2375))
    else:
        return None
    with sock:
        sock.settimeout(timeout_s)
        sock.connect(address)
        sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
        data = b""
        while len(data) < 4096:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    head, _, body = data.decode("latin-1").partition("\r\n\r\n")
    status = head.split(" ", 2)[1] if head.count(" ") >= 1 else "?"
    return body.strip() if status == "200" else f"HTTP {status}"


def _daemon(settings: Settings) -> Check:
    from nightshift.agent.doors.daemon import DaemonLock

    sock = settings.api_socket
    if DaemonLock.held(settings.home_path):
        answers = _unix_connects(str(sock))
        return Check(
            "daemon",
            "ok" if answers or not settings.api.serve else "warn",
            f"running (lock in {settings.home_path}); API socket {sock} "
            + ("accepts connections" if answers else "does not accept connections"),
        )
    if sock.exists() and _unix_connects(str(sock)):
        return Check("daemon", "ok", f"a daemon serves {sock} (another user's, or another home's)")
    return Check(
        "daemon",
        "info",
        f"not running (no lock in {settings.home_path}, socket {sock}): `nightshift run` runs "
        "the loop itself while its goal lasts",
        "`nightshift daemon` (or the systemd unit in the README) for unattended runs",
    )


def _unix_connects(path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2.0)
            s.connect(path)
        return True
    except OSError:
        return False


def _channels(settings: Settings) -> list[Check]:
    """Each configured channel's credentials (auth.test, gettoken), and how clicks come back."""
    from nightshift.agent.doors.channels.base import ChannelDown
    from nightshift.agent.doors.channels.service import build
    from nightshift.policies.engine import PolicyEngine
    from nightshift.policies.model import load_policy

    area = "approval channels"
    built = build(settings.channels, PolicyEngine(load_policy(settings.policy.file)))
    if not built.channels:
        return [
            Check(
                area,
                "info",
                "none configured: approvals are decided with `nightshift approve ID` / "
                "`nightshift reject ID`, in `nightshift chat`, or at the terminal that asked",
                "README, 'Approvals on Slack and WeChat Work', to add one",
            )
        ]
    listen = settings.channels.listen or "nowhere (channels.listen is null)"
    receive = {
        "slack": "Socket Mode"
        if built.socket_mode
        else f"interactivity URL https://<your host>/slack/interactivity → {listen}",
        "wechat": f"callback URL https://<your host>/wechat/callback → {listen}",
    }
    out = []
    for name, channel in built.channels.items():
        try:
            who = channel.probe()
        except ChannelDown as exc:
            out.append(Check(f"{area}: {name}", "fail", str(exc), "check the token or secret"))
            continue
        out.append(Check(f"{area}: {name}", "ok", f"{who}; clicks via {receive[name]}"))
    return out


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
