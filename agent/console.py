"""The one place that prints: progress lines, tables, and errors as one clear line."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def error(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}")


def progress_printer(verbose: bool = False):
    """A callback for the graph that turns its events into readable lines."""
    seen_ticks: dict[int, tuple] = {}
    said_wait: dict[tuple[int, int], int] = {}

    def show(kind: str, data: dict[str, Any]) -> None:
        if kind == "plan" and data.get("kind") == "call":
            why = f"  [dim]{data.get('why')}[/]" if data.get("why") else ""
            console.print(f"[cyan]→[/] {data['skill']}{why}")
        elif kind == "verdict" and data["verdict"]["decision"] != "allow":
            v = data["verdict"]
            console.print(
                f"  [yellow]policy:[/] {v['decision']} by rule {v['rule']}"
                + (f" — {'; '.join(v['reasons'])}" if v.get("reasons") else "")
            )
        elif kind == "observe":
            console.print("  " + describe(data))
        elif kind == "watch":
            console.print(f"[cyan]→[/] watching job {data['job_id']}")
        elif kind == "attempt" and data.get("last_step") is not None:
            key = (data["number"], data.get("last_step"))
            if seen_ticks.get(data["job_id"]) != key:
                seen_ticks[data["job_id"]] = key
                console.print(
                    f"    attempt {data['number']}: step {data.get('last_step')}"
                    f" loss {_num(data.get('last_loss'))}"
                )
        elif kind == "backoff":
            # The retry backoff is silent otherwise: say what it waits for, then count down.
            left = max(0, round(data["seconds_left"]))
            key = (data["job_id"], data["attempt"])
            before = said_wait.get(key)
            if before is None:
                how = data["outcome"] + (
                    f", exit {data['exit_code']}" if data.get("exit_code") not in (None, 0) else ""
                )
                console.print(
                    f"    attempt {data['attempt']} {how}: attempt "
                    f"{data['attempt'] + 1} starts in {left} s (retry backoff; "
                    "retry_wait_s in the spec, retry.base_s in the config)"
                )
                said_wait[key] = left
            elif left < before and (left % 5 == 0 or left <= 3):
                console.print(f"      … {left} s")
                said_wait[key] = left
        elif kind == "finish":
            colour = "green" if data["ok"] else "red"
            console.print(
                f"[bold {colour}]{'done' if data['ok'] else 'failed'}:[/] {data['summary']}"
            )

    return show


def _num(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def describe(obs: dict[str, Any]) -> str:
    """One line for an observation, readable by a person at 3 a.m."""
    if obs["status"] != "ok":
        return f"[red]{obs['status']}:[/] {obs.get('error')}"
    r = obs.get("result") or {}
    skill = obs.get("skill")
    if obs["kind"] == "watch":
        att = r.get("attempt") or {}
        return (
            f"job {r.get('job_id')} {r.get('state')} after attempt {att.get('number')}"
            f" (exit {att.get('exit_code')}, last step {att.get('last_step')})"
            + (f": {r.get('reason')}" if r.get("reason") and r.get("state") != "succeeded" else "")
        )
    if skill == "gpu_health_check":
        return f"GPU health: {r.get('overall')} — {r.get('message')}"
    if skill == "config_validator":
        return (
            f"spec {'valid' if r.get('valid') else 'INVALID'}: {len(r.get('errors', []))} error(s), "
            f"{len(r.get('warnings', []))} warning(s)"
        )
    if skill == "submit_job":
        return f"queued job {r.get('job_id')} ({r.get('name')})"
    if skill == "diagnose_failure":
        return f"diagnosis: {r.get('category')} (retryable: {r.get('retryable')}) — {r.get('reasoning', '')}"
    if skill == "auto_resume":
        return (
            f"checkpoint: step {r.get('step')} at {r.get('path')}"
            if r.get("found")
            else f"no checkpoint: {r.get('message')}"
        )
    if skill == "resume_job":
        changed = {
            k: (r["params_before"].get(k), v)
            for k, v in r.get("params_after", {}).items()
            if r["params_before"].get(k) != v
        }
        return f"job {r.get('job_id')} requeued from step {r.get('resume_step')}" + (
            f", changed {changed}" if changed else ""
        )
    return f"{skill}: ok"


def table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    return t
