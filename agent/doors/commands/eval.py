"""`nightshift eval SUITE [ARGS…]`: run one of the evals/ suites (each prints a table, writes CSV
and, where a picture helps, a plot). A suite is a module's `main(argv)`, or `module:function`."""

from __future__ import annotations

import importlib

import typer

SUITES = {
    "trajectories": ("nightshift.evals.trajectories", "goal → calls and outcome, per planner"),
    "recovery": ("nightshift.evals.recovery", "fault-injection recovery vs naive retry"),
    "simulate": ("nightshift.evals.simulate", "trace-driven scheduler simulation"),
    "scheduler-table": (
        "nightshift.evals.scheduler_table",
        "issue 31's table: every trace, baseline and nightshift, goals PASS/FAIL (one command)",
    ),
    "saving-bound": (
        "nightshift.evals.saving_bound",
        "the most any schedule can save beside the delay goals, per window (--from a "
        "scheduler-table CSV)",
    ),
    "scale": ("nightshift.evals.bench_scale", "store submissions/s, placement time, daemon memory"),
    "perf": ("nightshift.evals.perf", "agent step overhead, audit append/verify throughput"),
    "provenance": (
        "nightshift.evals.provenance_cost",
        "what recording an attempt's provenance adds to each launch",
    ),
    "mlflow": (
        "nightshift.evals.mlflow_cost",
        "the MLflow mirror: seconds to mirror a job of 1,000 to 100,000 metric points",
    ),
    "crash": ("nightshift.evals.crash_consistency", "daemon SIGKILLs: launches doubled, jobs lost"),
    "fuzz": ("nightshift.evals.fuzz_inputs", "fuzzed specs and goals: tracebacks, hangs"),
    "refusals": (
        "nightshift.evals.refusal_flood",
        "junk socket lines and forged callbacks: audit events and bytes added, before and after",
    ),
    "team": (
        "nightshift.evals.team_load",
        "submitters and daemons on one PostgreSQL store: jobs lost, run twice",
    ),
    "sweep": (
        "nightshift.evals.sweep_bench",
        "random vs TPE vs TPE + pruning on real training: trial time to the best of random",
    ),
    "diagnosis": (
        "nightshift.evals.diagnosis",
        "diagnose_failure on 4,005 real logs: held-out repositories' accuracy, per category "
        "(--local: on your corrections; --second-opinion: rules alone and rules + model)",
    ),
    "diagnosis-model": (
        "nightshift.evals.diagnosis_model",
        "fit the log model diagnose_failure consults on the tuning split (--write); --cv: "
        "its accuracy on repositories it was not fitted on",
    ),
    "diagnosis-readers": (
        "nightshift.evals.diagnosis_readers",
        "the rules beside two blind readings of 400 held-out logs: how much of the threads' "
        "labels the log text shows at all",
    ),
    "latency": (
        "nightshift.evals.cli_latency",
        "jobs, status, show and logs on 10,000 queued jobs: cold and warm seconds",
    ),
    "newcomer": (
        "nightshift.evals.newcomer",
        "README's first command on a fresh clone and home, then a researcher's first day",
    ),
    "metrics": (
        "nightshift.evals.metrics_scrape",
        "the daemon's /metrics scrape time with 1,000 and 10,000 jobs in the store",
    ),
    "dashboard": (
        "nightshift.evals.dashboard_pages",
        "the web dashboard's page times with 1,000 jobs in the store",
    ),
    "chat": (
        "nightshift.evals.chat_eval",
        "34 everyday requests (English, Chinese, planted instructions) through the model door: "
        "tool-choice accuracy, argument validity, tokens per step (--endpoint URL --model M; "
        "without: the scripted server)",
    ),
    "chat-cases": (
        "nightshift.evals.trajectories:chat_main",
        "the trajectory chat cases against a real model endpoint: pass rate per case",
    ),
}


def eval_cmd(ctx: typer.Context, suite: str = typer.Argument(..., help=" | ".join(SUITES))) -> None:
    """Run an eval suite; arguments after the suite name go to it (try `--help`)."""
    if suite not in SUITES:
        typer.echo(
            f"error: no suite '{suite}'; one of: "
            + ", ".join(f"{k} ({v[1]})" for k, v in SUITES.items()),
            err=True,
        )
        raise typer.Exit(2)
    module_name, _, function = SUITES[suite][0].partition(":")
    main = getattr(importlib.import_module(module_name), function or "main")
    raise typer.Exit(main(list(ctx.args)))


def register(app: typer.Typer) -> None:
    app.command(
        "eval",
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(eval_cmd)
