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
<nav><a href="/">Jobs</a> <a href="/submit">Submit</a> <a href="/approvals">Approvals</a>
<a href="/gantt">Night</a> <a href="/report">Report</a></nav>
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
    jobs: Sequence[Job],
    holds: dict[int, str],
    filters: dict[str, str],
    owners: Sequence[str],
    more: bool,
    page: int,
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
            f'<input type="checkbox" name="jobs" value="{j.id}" form="compare" '
            f'aria-label="compare job {j.id}">',
            f'<a href="/jobs/{j.id}">{j.id}</a>',
            f'<a href="/jobs/{j.id}">{e(j.name)}</a>',
            f'<span class="state {e(j.state)}">{e(j.state)}</span>',
            e(j.owner),
            e(j.priority),
            e(holds[j.id] if j.state == "queued" and j.id in holds else j.reason),
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
        '<form method="get" action="/compare" id="compare" class="compare-form">'
        '<button type="submit" id="btn-compare">Compare selected</button></form>'
        + table(
            ["", "id", "name", "state", "owner", "priority", "reason", "updated"], rows, cls="jobs"
        )
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
    reproduces: int | None = None,
    hold: str | None = None,
) -> str:
    source = (
        f'<p class="related">Reproduces job <a href="/jobs/{reproduces}">{reproduces}</a>: '
        f'<a id="compare-source" href="/compare?jobs={reproduces},{job.id}">compare them</a></p>'
        if reproduces
        else ""
    )
    facts = source + table(
        ["", ""],
        [
            ("state", f'<span class="state {e(job.state)}" id="job-state">{e(job.state)}</span>'),
            ("reason", e(hold if job.state == "queued" and hold else job.reason)),
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


HOLD_MARKS = {  # an attempt stopped to wait, as the Gantt marks it (Outcome in lifecycle.py)
    "held": "⏸ hold",  # a person held it
    "paused": "⏸ cheap hours over",  # the tariff's cheap window closed
}


def gantt_page(
    attempts: Sequence[tuple[Attempt, Job]],
    start: datetime,
    end: datetime,
    tariff: Any = None,
) -> str:
    """Which GPU ran what, when: one lane per host and GPU, a bar per attempt (held ones
    hatched and marked), the hours along the top, and behind them the tariff's price bands
    (runtime/scheduling/tariff.py) over the window, with a legend. An SVG drawn here: no script
    needed."""
    lanes: dict[str, list[tuple[Attempt, Job]]] = {}
    for a, j in attempts:
        for g in a.gpus or ["cpu"]:
            lanes.setdefault(f"{a.host or a.node or 'local'} · GPU {g}", []).append((a, j))
    if not lanes and tariff is None:
        return "<p>Nothing ran in this window.</p>"
    left, width, lane_h = 160, 900, 26
    span = max((end - start).total_seconds(), 1.0)

    def x(t: datetime) -> float:
        return left + width * min(max((t - start).total_seconds() / span, 0.0), 1.0)

    parts = []
    hour = start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    height = 30 + lane_h * max(len(lanes), 1)
    legend = ""
    if tariff is not None:
        bands, legend = tariff_bands(
            tariff.pieces(start, end), tariff.prices(), tariff.currency, x, 20, height - 20
        )
        parts.extend(bands)
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
            mark = HOLD_MARKS.get(a.outcome or "")
            held = mark is not None
            cls = f"bar {e(a.outcome or a.state)}" + (" held" if held else "")
            label = f"job {j.id} {j.name} #{a.number}: {a.outcome or a.state}"
            parts.append(
                f'<a href="/jobs/{j.id}"><rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 2):.1f}"'
                f' height="{lane_h - 6}" class="{cls}"><title>{e(label)}</title></rect></a>'
            )
            if held:
                parts.append(f'<text x="{x1 + 2:.1f}" y="{y + 15}" class="holdmark">{mark}</text>')
    svg = (
        f'<svg id="gantt" viewBox="0 0 {left + width + 60} {height}" role="img" '
        f'aria-label="attempts by GPU">{"".join(parts)}</svg>'
    )
    empty = "" if lanes else "<p>Nothing ran in this window.</p>"
    return f"<p>{e(when(start))} to {e(when(end))} UTC</p>{empty}{svg}{legend}"


def result_page(job_id: int | None, text: str) -> str:
    back = f'<p><a href="/jobs/{job_id}">Back to job {job_id}</a></p>' if job_id else ""
    return f'<p id="result">{e(text)}</p>{back}'


# ---------------------------------------------------------------------------------- compare
SERIES = 7  # colours of overlaid curves (dash.css .s0 … .s6)


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.6g}"


def compare_page(result: Any) -> str:
    """compare_jobs' answer (skills/compare_jobs.py) side by side: parameters (those that differ
    marked), final and best metric, provenance differences from the first job, and the curves
    overlaid in one SVG drawn here (each job its colour, named in the legend)."""
    jobs = result.jobs
    head = ["", *(f"job {j.job_id}" for j in jobs)]
    links = ["", *(f'<a href="/jobs/{j.job_id}">{e(j.name)}</a>' for j in jobs)]
    facts: list[list[str]] = [
        links,
        ["state", *(f'<span class="state {e(j.state)}">{e(j.state)}</span>' for j in jobs)],
        ["attempts", *(e(j.attempts) for j in jobs)],
        ["metric", *(e(f"{j.metric} ({j.mode})") for j in jobs)],
        [
            "final",
            *(
                e(f"{_num(j.final)} @ step {j.final_step}") if j.final is not None else ""
                for j in jobs
            ),
        ],
        [
            "best",
            *(
                e(f"{_num(j.best)} @ step {j.best_step}") if j.best is not None else ""
                for j in jobs
            ),
        ],
    ]
    differ = set(result.params_differ)
    keys = sorted({k for j in jobs for k in j.params})
    params = [
        [
            f'<span class="{"differs" if k in differ else ""}">{e(k)}</span>',
            *(e(json.dumps(j.params.get(k), default=str)) if k in j.params else "—" for j in jobs),
        ]
        for k in keys
    ]
    diff_rows = [
        (
            f"job {j.job_id}",
            e(d.field),
            f"<pre>{_json(d.first)}</pre>",
            f"<pre>{_json(d.this)}</pre>",
        )
        for j in jobs[1:]
        for d in j.differences
    ]
    no_prov = [j.job_id for j in jobs if j.provenance is None]
    prov_note = (
        f"<p>No provenance recorded for job {', '.join(map(str, no_prov))}.</p>" if no_prov else ""
    )
    return (
        table(head, facts, cls="compare")
        + "<h2>Curves</h2>"
        + overlay_svg([(j.job_id, j.name, j.metric, j.curve) for j in jobs])
        + "<h2>Parameters</h2>"
        + (table(["parameter", *head[1:]], params, cls="compare") if params else "<p>None.</p>")
        + f"<h2>Provenance differences from job {jobs[0].job_id}</h2>"
        + prov_note
        + (
            table(["job", "field", f"job {jobs[0].job_id}", "this job"], diff_rows, cls="diffs")
            if diff_rows
            else "<p>None.</p>"
        )
    )


def overlay_svg(curves: Sequence[tuple[int, str, str, Sequence[tuple[int, float]]]]) -> str:
    """Each (job id, name, metric, points) as one polyline on shared axes, with a legend."""
    pts = [p for _, _, _, c in curves for p in c]
    if not pts:
        return '<p id="overlay">No metric points yet.</p>'
    W, H, L, B, T = 760, 300, 64, 28, 14
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)

    def sx(x: float) -> float:
        return L + (W - L - 10) * ((x - x0) / (x1 - x0) if x1 > x0 else 0.5)

    def sy(y: float) -> float:
        return H - B - (H - B - T) * ((y - y0) / (y1 - y0) if y1 > y0 else 0.5)

    parts = [
        f'<line x1="{L}" y1="{H - B}" x2="{W - 10}" y2="{H - B}" class="axis"/>',
        f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" class="axis"/>',
        f'<text x="2" y="{T + 8}" class="tick">{y1:.4g}</text>',
        f'<text x="2" y="{H - B}" class="tick">{y0:.4g}</text>',
        f'<text x="{L}" y="{H - 8}" class="tick">step {x0}</text>',
        f'<text x="{W - 90}" y="{H - 8}" class="tick">step {x1}</text>',
    ]
    legend = []
    for i, (job_id, name, metric, curve) in enumerate(curves):
        colour = f"s{i % SERIES}"
        if curve:
            d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in curve)
            parts.append(
                f'<polyline points="{d}" class="series {colour}" data-job="{job_id}">'
                f"<title>{e(f'job {job_id} {name}: {metric}')}</title></polyline>"
            )
        legend.append(
            f'<li><span class="swatch {colour}"></span>'
            f"job {job_id} {e(name)} · {e(metric)}{'' if curve else ' (no points)'}</li>"
        )
    svg = (
        f'<svg id="overlay" class="overlay" viewBox="0 0 {W} {H}" role="img" '
        f'aria-label="metric curves overlaid">{"".join(parts)}</svg>'
    )
    return svg + f'<ul class="legend">{"".join(legend)}</ul>'


# ---------------------------------------------------------------------------------- report
def report_page(report: Any, markdown: str, hours: float) -> str:
    """`nightshift report` as HTML: its headline lines (to_markdown's, as the terminal prints
    them), failures by cause and the jobs table."""
    head = markdown.split("## Jobs")[0]
    items = [x.removeprefix("- ") for x in head.splitlines() if x.startswith("- ")]
    choose = "".join(
        f'<a href="/report?hours={h}"{" class=current" if h == hours else ""}>{h} h</a> '
        for h in (12, 24, 72, 168)
    )
    causes = sorted(report.failures_by_cause.items(), key=lambda x: -x[1])
    jobs = [
        (
            f'<a href="/jobs/{j.id}">{j.id}</a>',
            e(j.name),
            f'<span class="state {e(j.state)}">{e(j.state)}</span>',
            e(j.attempts),
            "" if j.final_metric is None else e(f"{j.metric} {j.final_metric:.4g}"),
            e(j.reason),
        )
        for j in report.jobs
    ]
    return (
        f'<p class="window">{e(when(report.since))} – {e(when(report.until))} UTC · {choose}</p>'
        + '<ul id="headline">'
        + "".join(f"<li>{e(x)}</li>" for x in items)
        + "</ul>"
        + (
            "<h2>Failures by cause</h2>"
            + table(["cause", "attempts"], [(e(c), e(n)) for c, n in causes], cls="causes")
            if causes
            else ""
        )
        + "<h2>Jobs</h2>"
        + (
            table(["id", "name", "state", "attempts", "final", "note"], jobs, cls="report")
            if jobs
            else "<p>No job in this window.</p>"
        )
    )


# ---------------------------------------------------------------------------------- submit
SUBMIT_FIELDS = ("name", "command", "spec", "gpus", "params", "when", "begin", "deadline")


def submit_page(
    values: dict[str, str], errors: dict[str, str], csrf: str, nonce: str, *, note: str = ""
) -> str:
    """The experiment form: a name and command, or a whole spec YAML; GPUs, parameters and when.
    A field the server refused says why next to it, and every field keeps what was typed."""

    def err(field: str) -> str:
        msg = errors.get(field)
        return f'<span class="error field-error" id="error-{field}">{e(msg)}</span>' if msg else ""

    def text(field: str, label: str, hint: str = "", kind: str = "text") -> str:
        return (
            f'<label>{e(label)} <input type="{kind}" name="{field}" id="f-{field}" '
            f'value="{e(values.get(field, ""))}" placeholder="{e(hint)}"></label>{err(field)}'
        )

    chosen = values.get("when") or "now"
    whens = "".join(
        f'<label class="radio"><input type="radio" name="when" value="{v}" id="when-{v}"'
        f"{' checked' if chosen == v else ''}> {e(label)}</label>"
        for v, label in (
            ("now", "now"),
            ("begin", "not before a time (the start time below)"),
            ("cheap", "in cheap hours (cost_sensitive: waits for the tariff's cheap band)"),
        )
    )
    top = (
        f'<p class="error" role="alert" id="error-form">{e(errors["form"])}</p>'
        if "form" in errors
        else ""
    )
    return f"""{top}{f'<p class="banner" role="status">{e(note)}</p>' if note else ""}
<form method="post" action="/submit" class="submit" id="submit-form">
<input type="hidden" name="csrf" value="{e(csrf)}"><input type="hidden" name="nonce" value="{e(nonce)}">
<fieldset><legend>What to run</legend>
{text("name", "Name", "resnet-night")}
{text("command", "Command", "python train.py --lr {lr}")}
<p class="hint">An argv, split as a shell would split it but never run by one; {{name}} is a
parameter. Or paste a whole spec instead:</p>
<label>Spec YAML <textarea name="spec" id="f-spec" rows="8" cols="70">{e(values.get("spec", ""))}</textarea></label>{err("spec")}
</fieldset>
<fieldset><legend>How</legend>
{text("gpus", "GPUs", "0", "number")}
<label>Parameters <textarea name="params" id="f-params" rows="3" cols="40" placeholder="lr: 0.1">{e(values.get("params", ""))}</textarea></label>{err("params")}
<p class="hint">YAML mapping: the spec's parameters (with a command) or overrides of them (with a spec).</p>
</fieldset>
<fieldset><legend>When</legend>{whens}{err("when")}
{text("begin", "Start time", "07:00 or 2026-12-05T07:00")}
{text("deadline", "Deadline", "HH:MM or an ISO date-time (optional)")}
</fieldset>
<button type="submit" id="btn-submit">Submit</button></form>"""


# ---------------------------------------------------------------------------------- tariff
def tariff_bands(
    pieces: Sequence[tuple[datetime, datetime, float, str | None]],
    prices: Sequence[float],
    currency: str,
    x: Any,
    top: float,
    height: float,
) -> tuple[list[str], str]:
    """Each tariff piece as a band behind the Gantt's bars, shaded by its price's rank among
    the week's prices (cheapest lightest), and the legend naming each window and price."""
    rank = {p: i for i, p in enumerate(sorted(set(prices)))}
    levels = max(len(rank) - 1, 1)
    bands: list[str] = []
    seen: dict[str, int] = {}
    for start, end, price, name in pieces:
        level = round(3 * rank.get(price, 0) / levels)  # 0 cheapest … 3 dearest
        label = f"{name or 'default'}: {price:g} {currency}/kWh"
        seen.setdefault(label, level)
        bands.append(
            f'<rect x="{x(start):.1f}" y="{top}" width="{max(x(end) - x(start), 0.5):.1f}" '
            f'height="{height}" class="band price-{level}"><title>{e(label)}</title></rect>'
        )
    legend = "".join(
        f'<li><span class="swatch price-{level}"></span>{e(label)}</li>'
        for label, level in sorted(seen.items(), key=lambda kv: kv[1])
    )
    return bands, f'<ul class="legend" id="tariff-legend">{legend}</ul>'
