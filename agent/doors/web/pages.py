"""The dashboard's HTML, rendered on the server: every value from the store goes through `e()`
(html.escape, quotes included) and nothing else builds markup from data. No inline script or
style (the Content-Security-Policy forbids them): the pages' small script reads `data-`
attributes. Pure functions of plain rows, so tests and the benchmark call them without a server.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from nightshift.runtime.store.db import Approval, Attempt, Job
from nightshift.runtime.store.lifecycle import JobState

ACTIONS = {  # button → (skill, label, what it does)
    "retry": ("retry_job", "Retry", "run the failed job once more"),
    "hold": ("pause_job", "Hold", "stop it at its checkpoint and keep it back"),
    "release": ("release_job", "Release", "let a held job run again"),
    "cancel": ("cancel_job", "Cancel", "end it for good"),
    "reproduce": ("reproduce_job", "Reproduce", "queue a new job from its provenance"),
}
STATES = tuple(s.value for s in JobState)


def e(value: Any) -> str:
    """Any value as escaped text (None: empty)."""
    return "" if value is None else html.escape(str(value), quote=True)


def when(t: datetime | None) -> str:
    return "" if t is None else t.strftime("%Y-%m-%d %H:%M:%S")


def layout(title: str, user: str, csrf: str, body: str, *, status: str = "") -> str:
    banner = f'<p class="banner" role="status">{e(status)}</p>' if status else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="csrf-token" content="{e(csrf)}">
<title>{e(title)} · nightshift</title>
<link rel="stylesheet" href="/static/dash.css">
<script src="/static/dash.js" defer></script>
</head><body>
<header><a class="brand" href="/">nightshift</a>
<nav><a href="/">Jobs</a> <a href="/approvals">Approvals</a> <a href="/gantt">Night</a></nav>
<form method="post" action="/logout" class="who"><span id="user">{e(user)}</span>
<input type="hidden" name="csrf" value="{e(csrf)}"><button type="submit">Sign out</button></form>
</header>
<main><h1>{e(title)}</h1>{banner}{body}</main>
</body></html>"""


def login_page(message: str = "", next_path: str = "/") -> str:
    note = f'<p class="error" role="alert">{e(message)}</p>' if message else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in · nightshift</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/static/dash.css"></head><body>
<main class="login"><h1>nightshift</h1>{note}
<form method="post" action="/login">
<label>Token <input type="password" name="token" autocomplete="off" required autofocus></label>
<input type="hidden" name="next" value="{e(next_path)}">
<button type="submit">Sign in</button></form>
<p class="hint">Make a token with <code>nightshift web token</code> on the daemon's machine:
it signs you in as the OS user who made it.</p></main></body></html>"""


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, cls: str = "") -> str:
    """Cells are markup already (escaped by the caller)."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    klass = f' class="{cls}"' if cls else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def jobs_page(
    jobs: Sequence[Job], filters: dict[str, str], owners: Sequence[str], more: bool, page: int
) -> str:
    state_opts = "".join(
        f'<option value="{s}"{" selected" if filters.get("state") == s else ""}>{s}</option>'
        for s in ("", *STATES)
    )
    owner_opts = "".join(
        f'<option value="{e(o)}"{" selected" if filters.get("owner") == o else ""}>{e(o)}</option>'
        for o in ("", *owners)
    )
    form = f"""<form method="get" action="/" class="filters">
<label>State <select name="state">{state_opts}</select></label>
<label>Owner <select name="owner">{owner_opts}</select></label>
<label>Name <input type="search" name="name" value="{e(filters.get("name", ""))}"></label>
<button type="submit">Filter</button></form>"""
    rows = [
        (
            f'<a href="/jobs/{j.id}">{j.id}</a>',
            f'<a href="/jobs/{j.id}">{e(j.name)}</a>',
            f'<span class="state {e(j.state)}">{e(j.state)}</span>',
            e(j.owner),
            e(j.priority),
            e(j.hold_reason if j.state == "queued" and j.hold_reason else j.reason),
            e(when(j.updated_at)),
        )
        for j in jobs
    ]
    pager = ""
    if page > 0 or more:
        q = {k: v for k, v in filters.items() if v}
        prev = f'<a href="/?{e(urlencode({**q, "page": page - 1}))}">newer</a>' if page > 0 else ""
        nxt = f'<a href="/?{e(urlencode({**q, "page": page + 1}))}">older</a>' if more else ""
        pager = f'<p class="pager">{prev} {nxt}</p>'
    listing = (
        table(["id", "name", "state", "owner", "priority", "reason", "updated"], rows, cls="jobs")
        if rows
        else "<p>No jobs match.</p>"
    )
    return form + listing + pager


def _json(value: Any) -> str:
    return e(json.dumps(value, indent=1, sort_keys=True, default=str))


def _kv(d: dict[str, Any]) -> str:
    rows = [
        (e(k), f"<pre>{_json(v)}</pre>" if isinstance(v, dict | list) else e(v))
        for k, v in sorted(d.items())
    ]
    return table(["", ""], rows, cls="kv")


def action_buttons(job: Job, csrf: str, nonce: str) -> str:
    forms = []
    for action, (skill, label, what) in ACTIONS.items():
        forms.append(
            f"""<form method="post" action="/jobs/{job.id}/action" class="action">
<input type="hidden" name="csrf" value="{e(csrf)}"><input type="hidden" name="nonce" value="{e(nonce)}">
<input type="hidden" name="action" value="{action}">
<button type="submit" name="go" value="{action}" id="btn-{action}" title="{e(skill)}: {e(what)}">{e(label)}</button></form>"""
        )
    return '<div class="actions">' + "".join(forms) + "</div>"


def job_page(
    job: Job,
    attempts: Sequence[Attempt],
    csrf: str,
    nonce: str,
    *,
    logs_refused: str | None,
    tensorboard: bool = False,
) -> str:
    facts = table(
        ["", ""],
        [
            ("state", f'<span class="state {e(job.state)}" id="job-state">{e(job.state)}</span>'),
            ("reason", e(job.hold_reason if job.state == "queued" else job.reason)),
            ("owner", e(job.owner)),
            ("priority", e(job.priority)),
            ("group", e(job.group)),
            ("created", e(when(job.created_at))),
            ("parameters", f"<pre>{_json(job.params)}</pre>"),
        ],
        cls="kv",
    )
    att_rows = [
        (
            e(a.number),
            e(a.state),
            e(a.outcome),
            e(a.cause),
            e(", ".join(map(str, a.gpus))),
            e(a.host or a.node),
            e(when(a.started_at)),
            e(when(a.ended_at)),
            e(a.exit_code if a.signal is None else f"signal {a.signal}"),
            e(a.last_step),
            e(a.last_loss),
        )
        for a in attempts
    ]
    atts = (
        table(
            ["#", "state", "outcome", "cause", "GPUs", "host", "started", "ended", "exit"]
            + ["step", "loss"],
            att_rows,
            cls="attempts",
        )
        if att_rows
        else "<p>No attempt yet.</p>"
    )
    diagnoses = "".join(
        f"<h3>Attempt {a.number}</h3>{_kv(a.diagnosis)}" for a in attempts if a.diagnosis
    )
    newest = next((a for a in reversed(attempts) if a.provenance), None)
    provenance = (
        f"<p>Attempt {newest.number}</p>{_kv(newest.provenance or {})}"
        if newest
        else "<p>No provenance recorded.</p>"
    )
    if logs_refused is None:
        tb_link = (
            f'<p><a id="tensorboard" href="/jobs/{job.id}/tensorboard/">Open in TensorBoard</a></p>'
            if tensorboard
            else ""
        )
        live = f"""<section class="live" data-job="{job.id}">
<h2>Metrics</h2><div id="curves" data-src="/jobs/{job.id}/metrics.json"><p>Loading…</p></div>
{tb_link}<h2>Log <small id="log-status"></small></h2>
<pre id="log" data-src="/jobs/{job.id}/log.json"></pre></section>"""
    else:
        live = f'<h2>Log and metrics</h2><p class="error">{e(logs_refused)}</p>'
    return (
        facts
        + action_buttons(job, csrf, nonce)
        + live
        + "<h2>Attempts</h2>"
        + atts
        + "<h2>Diagnosis</h2>"
        + (diagnoses or "<p>No diagnosis.</p>")
        + "<h2>Provenance</h2>"
        + provenance
    )


def confirm_page(job_id: int, action: str, request: dict[str, Any], csrf: str, nonce: str) -> str:
    """The full request, as a terminal's y/N shows it, with a button that confirms it."""
    skill = ACTIONS[action][0]
    return f"""<p>Approval {e(request.get("approval_id"))} (rule {e(request.get("rule"))}) asks
you to confirm this call yourself:</p>
<pre id="request">{_json({"skill": skill, "args": request.get("args")})}</pre>
<form method="post" action="/jobs/{job_id}/action" class="action">
<input type="hidden" name="csrf" value="{e(csrf)}"><input type="hidden" name="nonce" value="{e(nonce)}">
<input type="hidden" name="action" value="{e(action)}">
<input type="hidden" name="confirm" value="{e(request.get("approval_id"))}">
<button type="submit" id="btn-confirm">Yes, {e(ACTIONS[action][1].lower())}</button></form>
<p><a href="/jobs/{job_id}">No, back to the job</a></p>"""


def approvals_page(pending: Sequence[Approval], decided: Sequence[Approval], csrf: str) -> str:
    def buttons(a: Approval) -> str:
        return "".join(
            f"""<form method="post" action="/approvals/{a.id}/vote" class="action">
<input type="hidden" name="csrf" value="{e(csrf)}"><input type="hidden" name="decision" value="{d}">
<button type="submit" id="{d}-{a.id}">{d.capitalize()}</button></form>"""
            for d in ("approve", "reject")
        )

    def votes(a: Approval) -> str:
        return e(", ".join(f"{v['principal']}: {'yes' if v['approve'] else 'no'}" for v in a.votes))

    rows = [
        (
            e(a.id),
            e(a.skill),
            f"<pre>{_json(a.args)}</pre>",
            e(a.requester),
            e(a.rule),
            e(f"{sum(1 for v in a.votes if v['approve'])}/{a.quorum}"),
            votes(a),
            e(when(a.expires_at)),
            buttons(a),
        )
        for a in pending
    ]
    done = [
        (e(a.id), e(a.skill), f"<pre>{_json(a.args)}</pre>", e(a.requester), e(a.state), votes(a))
        for a in decided
    ]
    return (
        (
            table(
                ["id", "skill", "arguments", "requester", "rule", "yes", "votes", "expires", ""],
                rows,
                cls="approvals",
            )
            if rows
            else "<p>No approval is waiting.</p>"
        )
        + "<h2>Decided lately</h2>"
        + (
            table(["id", "skill", "arguments", "requester", "state", "votes"], done)
            if done
            else "<p>None.</p>"
        )
    )


def gantt_page(attempts: Sequence[tuple[Attempt, Job]], start: datetime, end: datetime) -> str:
    """Which GPU ran what, when: one lane per host and GPU, a bar per attempt (held ones
    hatched and marked), the hours along the top. An SVG drawn here: no script needed."""
    lanes: dict[str, list[tuple[Attempt, Job]]] = {}
    for a, j in attempts:
        for g in a.gpus or ["cpu"]:
            lanes.setdefault(f"{a.host or a.node or 'local'} · GPU {g}", []).append((a, j))
    if not lanes:
        return "<p>Nothing ran in this window.</p>"
    left, width, lane_h = 160, 900, 26
    span = max((end - start).total_seconds(), 1.0)

    def x(t: datetime) -> float:
        return left + width * min(max((t - start).total_seconds() / span, 0.0), 1.0)

    parts = []
    hour = start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    height = 30 + lane_h * len(lanes)
    while hour < end:
        parts.append(
            f'<line x1="{x(hour):.1f}" y1="20" x2="{x(hour):.1f}" y2="{height}" class="tick"/>'
            f'<text x="{x(hour):.1f}" y="14" class="hour">{hour:%H}h</text>'
        )
        hour += timedelta(hours=1)
    for i, (lane, bars) in enumerate(sorted(lanes.items())):
        y = 24 + i * lane_h
        parts.append(f'<text x="4" y="{y + 16}" class="lane">{e(lane)}</text>')
        for a, j in bars:
            x0, x1 = x(a.started_at), x(a.ended_at or end)
            held = a.outcome == "held"
            cls = f"bar {e(a.outcome or a.state)}" + (" held" if held else "")
            label = f"job {j.id} {j.name} #{a.number}: {a.outcome or a.state}"
            parts.append(
                f'<a href="/jobs/{j.id}"><rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 2):.1f}"'
                f' height="{lane_h - 6}" class="{cls}"><title>{e(label)}</title></rect></a>'
            )
            if held:
                parts.append(f'<text x="{x1 + 2:.1f}" y="{y + 15}" class="holdmark">⏸ hold</text>')
    svg = (
        f'<svg id="gantt" viewBox="0 0 {left + width + 60} {height}" role="img" '
        f'aria-label="attempts by GPU">{"".join(parts)}</svg>'
    )
    return f"<p>{e(when(start))} to {e(when(end))} UTC</p>{svg}"


def result_page(job_id: int | None, text: str) -> str:
    back = f'<p><a href="/jobs/{job_id}">Back to job {job_id}</a></p>' if job_id else ""
    return f'<p id="result">{e(text)}</p>{back}'
