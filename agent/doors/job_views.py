"""How the read commands print a job: the rows of `nightshift jobs` and their "why", one job in
full (`show`), a log's lines (`logs`), the summary of `status`. Plain functions of the results, with
no command-line parsing here, so a fast answer (quick.py) and the full path print alike.
"""

from __future__ import annotations

import json
from typing import Any

from nightshift.agent.doors.console import console, print_table, say

# The job states in the order `status` counts them; the newest this many queued / failed are shown.
STATES = ("running", "queued", "paused", "failed", "succeeded", "cancelled")
STATUS_SHOWN = 5


def _steps(a: Any) -> str:
    return f"{a.start_step}→{'?' if a.last_step is None else a.last_step}"


def _value(v: Any) -> str:
    """A parameter's value as a person reads it: a parameter an attempt did not have is unset."""
    return "unset" if v is None else str(v)


def _resume_line(r: Any) -> str | None:
    """Where the job's next attempt would start, for a job that can have one: a waiting or
    stopped job's next attempt, a failed job's retry; nothing for a finished job."""
    if r.state in ("succeeded", "cancelled") or not (r.resume_from or r.resume_step):
        return None
    where = r.resume_from or f"step {r.resume_step}"
    if r.resume_from and r.resume_step is not None:
        where += f" (step {r.resume_step})"
    if r.state == "failed":
        return f"`nightshift retry {r.job_id}` resumes from {where}"
    return f"next attempt resumes from {where}"


def _resumed(a: Any) -> str | None:
    if not a.resumed_from:
        return None
    step = a.resumed_from_step
    return a.resumed_from if step is None else f"{a.resumed_from} @ step {step}"


def print_attempt_diagnosis(number: int, d: Any, *, log_path: str | None = None) -> None:
    """One attempt's diagnosis, whole: category, the line that shows it and where, the summary,
    the recommended action. Log text is printed as data (say escapes it)."""
    retry = "a retry can help" if d.retryable else "a retry will not help"
    say("  attempt {}: [bold]{}[/] ({} confidence; {})", number, d.category, d.confidence, retry)
    if d.evidence:
        where = d.where()
        if where == "monitor":
            say("    evidence (the loop): {}", d.evidence, soft_wrap=True)
        else:
            of = f" of {log_path}" if log_path and d.source == "log" else ""
            say("    evidence, {}{}: {}", where, of, d.evidence, soft_wrap=True)
    say("    summary: {}", d.summary, soft_wrap=True)
    for m in getattr(d, "machine", None) or []:
        # what the machine said as the attempt ended, each with its source (the kernel's words
        # are data too: say escapes them)
        if isinstance(m, dict):
            say("    machine, {}: {}", m.get("source"), m.get("text"), soft_wrap=True)
    say("    fix: {} [dim]({})[/]", d.fix, d.action, soft_wrap=True)
    if d.changes:
        say("    changes: {}", ", ".join(f"{k} = {v}" for k, v in d.changes.items()))
    op = getattr(d, "second_opinion", None)
    if op is not None:
        print_second_opinion(op, indent="    ")


def print_second_opinion(
    op: Any, *, indent: str = "", quotes: dict[int, str] | None = None
) -> None:
    """A model's second opinion, labelled as the model's (never the rules' verdict); `quotes`:
    the cited lines' text, where the caller has the log."""
    if not op.accepted:
        say(
            "{}second opinion ({}, a model): dropped — {}",
            indent,
            op.model,
            op.note,
            soft_wrap=True,
        )
        return
    lines = ", ".join(str(n) for n in op.lines)
    say(
        "{}second opinion ({}, a model, not the rules): [bold]{}[/], lines {} — {}",
        indent,
        op.model,
        op.category,
        lines,
        op.note,
        soft_wrap=True,
    )
    for n in op.lines:
        if quotes and n in quotes:
            say("{}  {}: {}", indent, n, quotes[n], soft_wrap=True)


def print_show(r: Any) -> None:
    """One job in full, as `nightshift show` prints it: show_job's result, or the same computed
    from the rows (quick.py)."""
    say(
        "[bold]job {}[/] {}: [bold]{}[/]{}",
        r.job_id,
        r.name,
        r.state,
        f" — {r.reason}" if r.reason else "",
    )
    say(
        "  owner {}, priority {}, attempts {} of at most {}, steps lost in all {}",
        r.owner,
        r.priority,
        len(r.attempts),
        r.max_attempts,
        r.steps_lost_total,
    )
    if getattr(r, "reproduces", None) is not None:
        say("  reproduces job {} (nightshift compare {} {})", r.reproduces, r.reproduces, r.job_id)
    say("  folder {}\n  checkpoints {}", r.workspace, r.checkpoint_dir)
    resume = _resume_line(r)
    if resume:
        say("  {}", resume)
    for k in r.good_checkpoints:
        say("  kept good checkpoint: step {}, {} MB, {}", k.step, f"{k.bytes / 1e6:.1f}", k.path)
    rows = []
    for a in r.attempts:
        changes = ", ".join(
            f"{k} {_value(c.before)}→{_value(c.after)}" for k, c in a.param_changes.items()
        )
        how = a.outcome or a.state
        if a.signal:
            how += f" (signal {a.signal})"
        elif a.exit_code not in (None, 0):
            how += f" (exit {a.exit_code})"
        rows.append(
            [
                a.number,
                a.started_at.strftime("%m-%d %H:%M:%S"),
                None if a.duration_s is None else f"{a.duration_s:.0f}s",
                _steps(a),
                how,
                a.cause or (a.diagnosis.category if a.diagnosis else None),
                a.steps_lost,
                changes or None,
                _resumed(a),
            ]
        )
    print_table(
        "attempts",
        ["#", "started", "ran", "steps", "ended", "cause", "lost", "changed", "resumed from"],
        rows,
    )
    for a in r.attempts:
        if a.diagnosis is not None:
            print_attempt_diagnosis(a.number, a.diagnosis, log_path=a.log_path)
            if a.evidence and a.evidence != a.diagnosis.evidence:
                say("    the loop saw: {}", a.evidence, soft_wrap=True)
        elif a.evidence:
            say("  attempt {}: {}", a.number, a.evidence, soft_wrap=True)
    print_provenance(r.attempts)


def print_provenance(attempts: list[Any]) -> None:
    """Each attempt's provenance: the first recorded in full, then for each later one what
    changed (another commit, a dirty tree, other packages, another driver, ...)."""
    shown = False
    for a in attempts:
        rec = getattr(a, "provenance", None)
        flags = list(getattr(a, "provenance_changes", None) or [])
        if not isinstance(rec, dict):
            continue
        if not shown:
            for line in provenance_lines(a.number, rec):
                say("{}", line, soft_wrap=True)
            shown = True
        elif flags:
            say("  [yellow]attempt {} changed:[/] {}", a.number, "; ".join(flags), soft_wrap=True)
        else:
            say("  attempt {}: same provenance", a.number)
    if not shown and attempts:
        say("  provenance: not recorded (attempts started before nightshift kept it)")


def provenance_lines(number: int, rec: dict[str, Any]) -> list[str]:
    """One attempt's provenance record as `show` prints it (values are data, printed as such)."""

    def get(*path: str) -> Any:
        cur: Any = rec
        for p in path:
            cur = cur.get(p) if isinstance(cur, dict) else None
        return cur

    out = [
        f"  provenance of attempt {number} (read in {rec.get('capture_s', '?')} s, host {rec.get('host')}):"
    ]
    git = rec.get("git") or {}
    if git.get("commit"):
        code = f"{git.get('repo')} @ {git['commit'][:12]}"
        code += f" (branch {git['branch']})" if git.get("branch") else " (detached)"
        if git.get("dirty"):
            code += ", DIRTY"
            if git.get("diff_sha256"):
                code += (
                    f": diff {git['diff_sha256'][:12]} ({git.get('diff_files')} file(s), "
                    f"{git.get('diff_bytes')} bytes, kept)"
                )
            if git.get("untracked_count"):
                names = ", ".join(git.get("untracked") or [])
                code += f"; {git['untracked_count']} untracked: {names[:200]}"
        else:
            code += ", clean"
        out.append(f"    code    {code}")
    else:
        out.append(f"    code    {rec.get('code_dir')}: {git.get('note', 'no git commit')}")
    py = rec.get("python") or {}
    if py.get("interpreter"):
        pk = (
            f"{py.get('packages_count')} packages {py['packages_sha256'][:12]}"
            if py.get("packages_sha256")
            else "package list still being read"
            if py.get("pending")
            else "no package list"
        )
        out.append(
            f"    python  {py['interpreter']} {py.get('version') or ''} ({py.get('manager')}), {pk}"
        )
    image = rec.get("image") or {}
    if image:
        out.append(f"    image   {image.get('ref')} → {image.get('pinned') or image.get('digest')}")
    seed = rec.get("seed")
    out.append(
        f"    seed    {seed} ({rec.get('seed_from')})" if seed is not None else "    seed    none"
    )
    out.append(f"    argv    {json.dumps(rec.get('argv') or [])}")
    if rec.get("env"):
        out.append(f"    env     {', '.join(f'{k}={v}' for k, v in rec['env'].items())}")
    for d in rec.get("data") or []:
        if d.get("files") is None:
            out.append(f"    data    {d.get('path')}: {d.get('note')}")
            continue
        line = f"    data    {d.get('path')}: {d.get('files')} file(s), {d.get('bytes')} bytes"
        line += f", fingerprint {str(d.get('fingerprint'))[:12]}"
        if d.get("sha256"):
            line += f", sha256 {d['sha256'][:12]}"
        line += " (first files only)" if d.get("truncated") else ""
        out.append(line + (f"; {d['note']}" if d.get("note") else ""))
    devices = get("gpu", "devices") or []
    if not devices:
        out.append(f"    gpus    none ({get('gpu', 'note') or 'not recorded'})")
    for g in devices:
        if g.get("name") is None and g.get("note"):
            out.append(f"    gpu {g.get('index')}   {g['note']}")
            continue
        versions = [
            f"{label} {g.get(key) or 'not read'}"
            + (f" ({g[key + '_note']})" if not g.get(key) and g.get(key + "_note") else "")
            for label, key in (("driver", "driver_version"), ("CUDA", "cuda_version"))
        ]
        out.append(f"    gpu {g.get('index')}   {g.get('name')}, {', '.join(versions)}")
    notes = [
        f"{k}: {v['note']}"
        for k, v in rec.items()
        if isinstance(v, dict) and v.get("note") and k != "gpu"
    ]
    notes += [
        f"data {d.get('path')}: {d['note']}"
        for d in rec.get("data") or []
        if d.get("note") and d.get("files") is not None
    ]
    out += [f"    note    {n}" for n in notes]
    if get("gpu", "note") and devices:
        out.append(f"    note    gpu: {get('gpu', 'note')}")
    return out


def print_logs(job_id: int, lines: list[str], log_path: str | None) -> None:
    for line in lines:
        console.out(line, highlight=False)  # log text is data: printed, never interpreted
    if log_path is None:
        say("job {} has no attempt yet, so no log", job_id)


def job_row(j: Any, attempts: int, diagnosis: Any, newest: Any) -> dict[str, Any]:
    """One row of `jobs`, from the store's rows or the daemon's list_jobs alike; `newest` has
    the newest attempt's last_step and last_loss (None: no attempt)."""
    return {
        "id": j.id,
        "name": j.name,
        "state": j.state,
        "priority": j.priority,
        "cost_class": j.cost_class,
        "attempts": attempts,
        "group": j.group,
        "why": why_of(j.state, j.reason, j.hold_reason, diagnosis),
        "diagnosis": diagnosis.model_dump() if diagnosis else None,
        "last_step": None if newest is None else newest.last_step,
        "last_loss": None if newest is None else newest.last_loss,
    }


def why_of(state: str, reason: str | None, hold_reason: str | None, diagnosis: Any) -> str | None:
    """The "why" of one row: why a queued job waits, why a job stopped; for a failed job, and a
    queued one retrying after a failure, its newest attempt's diagnosis first (category and
    evidence, cut short; only a failed attempt has one), ahead of the wait."""
    why = hold_reason if state == "queued" else reason
    if diagnosis is None or state not in ("failed", "queued"):
        return why
    brief = diagnosis.brief()
    if state == "queued":
        return f"{brief} · {why or 'retry queued'}"
    return str(brief)


def answer_jobs(rows: list[dict[str, Any]], *, as_json: bool) -> None:
    """`nightshift jobs`: the rows as a table, or as JSON."""
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        print_jobs(rows)


def answer_status(
    rows: list[dict[str, Any]], paused: dict[str, Any] | None, *, as_json: bool
) -> None:
    """`nightshift status`: the summary of the rows, printed or as JSON."""
    summary = status_summary(rows, paused)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print_status(summary)


def print_jobs(out: list[dict[str, Any]]) -> None:
    print_table(
        "jobs",
        ["id", "name", "state", "prio", "cost", "attempts", "why"],
        [
            [
                r["id"],
                r["name"],
                r["state"],
                r["priority"],
                r["cost_class"],
                r["attempts"],
                r["why"],
            ]
            for r in out
        ],
    )


def status_summary(
    rows: list[dict[str, Any]], paused: dict[str, Any] | None, shown: int = STATUS_SHOWN
) -> dict[str, Any]:
    """What `nightshift status` says, from the rows of `jobs`: how many jobs are in each state,
    the kill switch, every running job, the queued ones that run next (highest priority first)
    and the newest failures."""
    counts = {state: 0 for state in STATES}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    queued = sorted(
        (r for r in rows if r["state"] == "queued"), key=lambda r: (-r["priority"], r["id"])
    )
    return {
        "jobs": len(rows),
        "counts": counts,
        "paused": paused,
        "running": [r for r in rows if r["state"] == "running"],
        "queued_next": queued[:shown],
        "failed_newest": [r for r in reversed(rows) if r["state"] == "failed"][:shown],
    }


def print_status(s: dict[str, Any]) -> None:
    """The summary: one line of counts, the kill switch, then short tables; `jobs` has the rest."""
    if s["jobs"] == 0:
        say("no jobs yet: `nightshift submit SPEC` (or `nightshift submit -- CMD`) queues one")
    else:
        counts = ", ".join(f"{n:,} {state}" for state, n in s["counts"].items() if n)
        say("{} job{}: {}", f"{s['jobs']:,}", "" if s["jobs"] == 1 else "s", counts)
    if s["paused"] is not None:
        p = s["paused"]
        say(
            "[bold red]PAUSED[/] by {}: {} — only reads run until `nightshift resume`",
            p.get("by"),
            p.get("reason"),
        )
    if s["running"]:
        print_table(
            "running",
            ["id", "name", "attempt", "step", "loss"],
            [
                [
                    r["id"],
                    r["name"],
                    r["attempts"],
                    r["last_step"],
                    None if r["last_loss"] is None else f"{r['last_loss']:.4f}",
                ]
                for r in s["running"]
            ],
        )
    if s["queued_next"]:
        print_table(
            "next up",
            ["id", "name", "prio", "why"],
            [[r["id"], r["name"], r["priority"], r["why"]] for r in s["queued_next"]],
        )
    if s["failed_newest"]:
        print_table(
            "newest failures",
            ["id", "name", "why"],
            [[r["id"], r["name"], r["why"]] for r in s["failed_newest"]],
        )
    if s["jobs"]:
        say("[dim]`nightshift jobs` lists every job; `nightshift why JOB` says why one failed[/]")
