"""Planners decide the next call from the goal and what has happened so far.

The deterministic planner runs goal-file steps and the built-in playbooks (train, recover, health)
without any model call. Every planner returns the same three kinds of action, so the graph, the
policy gate and the evals treat them alike.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from nightshift.agent.brain.goals import Goal


class Call(BaseModel):
    kind: Literal["call"] = "call"
    skill: str
    args: dict[str, Any] = Field(default_factory=dict)
    why: str = ""


class Watch(BaseModel):
    kind: Literal["watch"] = "watch"
    job_id: int
    wait: bool = Field(True, description="Wait until the job settles; False: just look at it now")
    why: str = ""


class Finish(BaseModel):
    kind: Literal["finish"] = "finish"
    ok: bool
    summary: str
    bad_input: bool = Field(False, description="Failed on invalid input the user must fix (exit 2)")
    operator: bool = Field(
        False, description="Failed on what the operator must fix: the model endpoint (exit 5)"
    )


Action = Call | Watch | Finish


class Observation(BaseModel):
    """What one action produced; planners read only these (and the goal)."""

    call_id: str
    kind: Literal["call", "watch"]
    skill: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    status: Literal["ok", "error", "denied", "rejected"]
    result: dict[str, Any] | None = None
    error: str | None = None
    bad_input: bool = False
    step_id: str | None = None


def _ok_result(obs: Observation) -> dict[str, Any]:
    """The result of an observation the planner has checked is ok: the graph records one for
    every successful call and watch."""
    assert obs.result is not None, f"observation {obs.call_id} is ok but has no result"
    return obs.result


class Planner(Protocol):
    name: str

    def next(self, goal: Goal, history: list[Observation]) -> Action: ...


def action_from_tool_call(tool_call: dict[str, Any]) -> Action:
    """An OpenAI-style tool call ({"function": {"name", "arguments": JSON text}}) as an action.
    Arguments that are not a JSON object become an empty call whose skill input model then
    rejects them with field errors, which go back to the planner as an observation."""
    fn = tool_call.get("function") or {}
    name = str(fn.get("name") or "")
    raw = fn.get("arguments") or "{}"
    try:
        args = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except (ValueError, TypeError):
        args = {"__unparsed_arguments__": str(raw)[:500]}
    if not isinstance(args, dict):
        args = {"__unparsed_arguments__": str(raw)[:500]}
    if name == "finish":
        return Finish(ok=bool(args.get("ok", True)), summary=str(args.get("summary", "")))
    if name == "watch_job" and isinstance(args.get("job_id"), int):
        return Watch(job_id=args["job_id"])
    return Call(skill=name, args=args, why="planned by model")


# Attempt outcomes the monitor decided; diagnose_failure takes its word for them.
MONITOR_OUTCOMES = ("stalled", "timeout", "lost", "diverged")

REF = re.compile(r"^\$\{([A-Za-z0-9_-]+)\.([A-Za-z0-9_.]+)\}$")


def _resolve(value: Any, results: dict[str, dict[str, Any]]) -> Any:
    """Replace a whole-string `${step.field}` with that field of an earlier step's result."""
    if isinstance(value, str):
        m = REF.match(value)
        if m:
            step, path = m.groups()
            if step not in results:
                raise KeyError(f"${{{step}.{path}}}: no earlier step with id '{step}' succeeded")
            cur: Any = results[step]
            for part in path.split("."):
                cur = cur[int(part)] if isinstance(cur, list) else cur[part]
            return cur
        return value
    if isinstance(value, dict):
        return {k: _resolve(v, results) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, results) for v in value]
    return value


class DeterministicPlanner:
    """Goal-file steps and playbooks; no model, same history → same next action."""

    name = "deterministic"

    def next(self, goal: Goal, history: list[Observation]) -> Action:
        bad = next((o for o in history if o.status != "ok"), None)
        if bad is not None:
            what = bad.skill or "watch"
            return Finish(
                ok=False, summary=f"{what} {bad.status}: {bad.error}", bad_input=bad.bad_input
            )
        if goal.steps is not None:
            return self._steps(goal, history)
        if goal.goal == "chat":
            return Finish(
                ok=False,
                summary="free-form goals need a model endpoint: set OPENAI_BASE_URL and "
                "NIGHTSHIFT_MODEL (`nightshift doctor` checks them)",
                bad_input=True,
            )
        if goal.goal == "health":
            if not history:
                return Call(skill="gpu_health_check", args={}, why="goal: health")
            return Finish(ok=True, summary=_ok_result(history[-1]).get("message", "health checked"))
        if goal.goal == "recover":
            return self._recover(goal.job_id, history, watch=goal.watch)
        return self._train(goal, history)

    # explicit steps -------------------------------------------------------------------------
    def _steps(self, goal: Goal, history: list[Observation]) -> Action:
        assert goal.steps is not None
        if len(history) >= len(goal.steps):
            return Finish(ok=True, summary=f"{len(goal.steps)} step(s) done")
        results = {o.step_id: (o.result or {}) for o in history if o.step_id}
        step = goal.steps[len(history)]
        try:
            if step.watch is not None:
                return Watch(
                    job_id=int(_resolve(step.watch, results)), why=f"step {len(history) + 1}"
                )
            return Call(
                skill=step.skill or "",
                args=_resolve(step.args, results),
                why=f"step {len(history) + 1}" + (f" ({step.id})" if step.id else ""),
            )
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            return Finish(
                ok=False,
                summary=f"step {len(history) + 1}: cannot fill arguments: {exc}",
                bad_input=True,
            )

    # train playbook ---------------------------------------------------------------------------
    def _train(self, goal: Goal, history: list[Observation]) -> Action:
        done = {o.skill: o for o in history if o.kind == "call"}
        if "gpu_health_check" not in done:
            return Call(skill="gpu_health_check", args={}, why="check GPUs before placing work")
        if "config_validator" not in done:
            spec = goal.spec_args()
            args = {"path": spec["spec_path"]} if "spec_path" in spec else spec
            return Call(skill="config_validator", args=args, why="validate the spec")
        check = done["config_validator"].result or {}
        if not check.get("valid", False):
            errs = "; ".join(
                f"{e.get('field')}: {e.get('message')}" for e in check.get("errors", [])
            )
            return Finish(ok=False, summary=f"spec is invalid: {errs}", bad_input=True)
        if "submit_job" not in done:
            args = {**goal.spec_args(), "params": goal.params}
            if goal.priority is not None:
                args["priority"] = goal.priority
            return Call(skill="submit_job", args=args, why="queue the run")
        submitted = _ok_result(done["submit_job"])
        job_id = submitted["job_id"]
        after = history[[o.skill for o in history].index("submit_job") + 1 :]
        if not after:
            need = submitted.get("gpus", 0)
            health = done["gpu_health_check"].result or {}
            healthy = sum(
                1 for g in health.get("gpus", []) if g.get("verdict") in ("OK", "WARNING")
            )
            if need > healthy:
                return Finish(
                    ok=False,
                    summary=(
                        f"job {job_id} needs {need} GPU(s) but the health check found {healthy} healthy "
                        f"({health.get('overall')}): it stays queued for a daemon to place once GPUs "
                        "are healthy; fix them or lower resources.gpus"
                    ),
                )
        return self._recover(job_id, after, watch=True)

    def _recover(self, job_id: int, history: list[Observation], watch: bool) -> Action:
        """Watch the job; on a failed attempt diagnose → find a checkpoint → resume with the fix;
        a paused job (stopped at a checkpoint by the loop) resumes from its newest checkpoint."""
        if history and history[-1].skill == "resume_job" and not watch:
            r = history[-1].result or {}
            return Finish(
                ok=True, summary=f"job {job_id} requeued from step {r.get('resume_step')}"
            )
        if not history:  # the daemon hands over a settled job and must not block on it
            return Watch(job_id=job_id, wait=watch, why="look at the job")
        if history[-1].skill in ("resume_job", "submit_job"):
            return Watch(job_id=job_id, why="wait for the run to end")
        last = history[-1]
        if last.kind == "watch":
            job = last.result or {}
            state = job.get("state")
            if state == "succeeded":
                why = f" ({job.get('reason')})" if job.get("reason") else ""
                return Finish(ok=True, summary=f"job {job_id} succeeded{why}")
            if state == "paused":
                return Call(
                    skill="auto_resume",
                    why=f"job {job_id} was paused at a checkpoint",
                    args={"checkpoint_dir": job.get("checkpoint_dir")},
                )
            if state != "failed":
                return Finish(ok=False, summary=f"job {job_id} is {state}: {job.get('reason')}")
            att = job.get("attempt") or {}
            monitor = att.get("outcome") if att.get("outcome") in MONITOR_OUTCOMES else None
            args = {
                "log_path": att.get("log_path"),
                "exit_code": att.get("exit_code"),
                "signal": att.get("signal"),
                "monitor_says": monitor,
                "params": job.get("params"),
                "knobs": job.get("knobs"),
            }
            if monitor and att.get("evidence"):
                args["monitor_detail"] = att["evidence"]
            return Call(
                skill="diagnose_failure",
                why=f"attempt {att.get('number')} {att.get('outcome') or 'failed'}",
                args=args,
            )
        if last.skill == "diagnose_failure":
            diag = last.result or {}
            job = _last_watch(history)
            if not diag.get("retryable"):
                plan = (diag.get("remediation") or {}).get("message", "")
                return Finish(
                    ok=False,
                    summary=f"job {job_id} failed: {diag.get('category')} "
                    f"(not retryable). {plan}".strip(),
                )
            attempts = job.get("failures", job.get("attempts", 0))
            limit = job.get("max_attempts", 1)
            runs = job.get("attempt_history") or []
            if (
                len(runs) >= 2
                and runs[-2].get("cause") == diag.get("category")
                and runs[-1].get("last_step") is not None
                and runs[-2].get("last_step") == runs[-1].get("last_step")
            ):
                # No progress between the two attempts; an unknown step is not the same step.
                return Finish(
                    ok=False,
                    summary=(
                        f"job {job_id} failed twice the same way ({diag.get('category')} at step "
                        f"{runs[-1].get('last_step')}) despite the remedy: not retrying blindly. "
                        f"{(diag.get('remediation') or {}).get('message', '')}".strip()
                    ),
                )
            if attempts >= limit:
                return Finish(
                    ok=False,
                    summary=f"job {job_id} failed {attempts} time(s); retries "
                    f"exhausted (spec.retries={limit - 1})",
                )
            if diag.get("category") == "nan_loss" and (job.get("knobs") or {}).get("learning_rate"):
                return Call(
                    skill="tune_lr",
                    why="the loss went NaN: find where it diverged",
                    args={"job_id": job_id, "mode": "divergence"},
                )
            bad = (job.get("attempt") or {}).get("first_bad_step")
            return self._find_checkpoint(job, max_step=None if bad is None else max(0, bad - 2))
        if last.skill == "tune_lr":
            tune = last.result or {}
            began = tune.get("divergence_step")
            # Not tune's resume_from_step: it knows only the checkpoints recorded in the store
            # (nightshift's kept copies); auto_resume searches every file at or before the bound.
            # The loss at step c+1 is the first measured on c's weights.
            limit = None if began is None else max(0, began - 2)
            bad = (_last_watch(history).get("attempt") or {}).get("first_bad_step")
            if bad is not None:  # what the monitor saw first bounds what tune_lr read
                limit = max(0, bad - 2) if limit is None else min(limit, max(0, bad - 2))
            return self._find_checkpoint(_last_watch(history), max_step=limit)
        if last.skill == "auto_resume":
            found = last.result or {}
            diag = next(
                (o.result or {} for o in reversed(history) if o.skill == "diagnose_failure"), {}
            )
            tune = next((o.result or {} for o in reversed(history) if o.skill == "tune_lr"), {})
            changes = tune.get("changes") or (diag.get("remediation") or {}).get("changes") or {}
            cause = diag.get("category")
            return Call(
                skill="resume_job",
                why=f"resume after {cause or 'pause'}",
                args={
                    "job_id": job_id,
                    "checkpoint": found.get("path") if found.get("found") else None,
                    "step": found.get("step") if found.get("found") else None,
                    "param_changes": changes,
                },
            )
        return Finish(ok=False, summary=f"recover: nothing planned after {last.skill}")

    @staticmethod
    def _find_checkpoint(job: dict[str, Any], max_step: int | None) -> Call:
        att = job.get("attempt") or {}
        args: dict[str, Any] = {
            "checkpoint_dir": job.get("checkpoint_dir"),
            "current_step": att.get("last_step"),
        }
        if job.get("good_checkpoint_dir"):  # nightshift's own copies of good checkpoints
            args["search_dirs"] = [job["good_checkpoint_dir"]]
        if job.get("steps_per_epoch"):
            args["steps_per_epoch"] = job["steps_per_epoch"]
        if max_step is not None:
            args["max_step"] = max_step
        return Call(
            skill="auto_resume",
            why="find the newest valid checkpoint"
            + (f" at or before step {max_step}" if max_step is not None else ""),
            args=args,
        )


def _last_watch(history: list[Observation]) -> dict[str, Any]:
    return next((o.result or {} for o in reversed(history) if o.kind == "watch"), {})
