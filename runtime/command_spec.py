"""A plain command line as an experiment spec, as `sbatch --wrap` makes a job of one: what
`nightshift submit [options] -- CMD ARGS…` queues, so a user starts without writing YAML.

The result is a spec mapping for `submit_job(spec=…)`, the same skill, policy and audit as a
YAML spec; the command stays an argv list (each word one item, braces taken literally), never a
shell string.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path, PurePath
from typing import Any

from nightshift.runtime.errors import BadArguments
from nightshift.runtime.spec import HH_MM, MAX_GPUS

NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
NAME_MAX = 100
# What a command's progress looks like in its output, for its metrics (RE2): "step 120 loss 0.41",
# "Step 120/1000, loss=0.41", "step: 120 | loss: 4.1e-01". A plain command runs in the user's
# folder, not the job's, so the log is where its progress shows.
PROGRESS = (
    r"(?i)\bstep\b\W*(?P<step>\d+)\b.*?\bloss\b\W*"
    r"(?P<value>[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf))"
)
# Interpreters whose first argument that is not an option names the program worth naming a job
# after (`python train.py` is "train", not "python").
INTERPRETERS = re.compile(r"^(python[0-9.]*|bash|sh|zsh|node|ruby|perl|Rscript|julia)$")


def command_spec(
    argv: list[str],
    *,
    cwd: Path,
    name: str | None = None,
    gpus: int = 0,
    after: str | None = None,
    cheap: bool = False,
    retries: int = 0,
    at: str | None = None,
) -> dict[str, Any]:
    """The spec of one run of `argv` in `cwd`: metrics found automatically (the step and loss
    its output prints, as in "step 120 loss 0.41"), no checkpoint, `retries`
    more attempts when it fails (default none: with no checkpoint a retry starts again from
    scratch; `nightshift retry JOB` is one more by hand). BadArguments names the option at fault."""
    if not argv or not argv[0]:
        raise BadArguments(
            "-- CMD: give the command after `--`, e.g. nightshift submit -- python train.py"
        )
    if len(argv) == 1 and " " in argv[0].strip():
        raise BadArguments(
            f"-- {argv[0]!r} is one argument with spaces, not a command line: write its words "
            f"as separate arguments (nightshift submit -- {argv[0].strip()}); for a shell "
            "line, name the shell: nightshift submit -- bash -c '…'"
        )
    if not 0 <= gpus <= MAX_GPUS:
        raise BadArguments(f"--gpus {gpus}: give a number of GPUs from 0 to {MAX_GPUS}")
    if not 0 <= retries <= 100:
        raise BadArguments(f"--retries {retries}: give a number from 0 to 100")
    job_name = default_name(argv) if name is None else name
    if not NAME.match(job_name) or len(job_name) > NAME_MAX:
        raise BadArguments(
            f"--name {job_name!r}: use letters, digits, '_', '.' and '-' only "
            f"(at most {NAME_MAX}), e.g. --name train-small"
        )
    spec: dict[str, Any] = {
        "name": job_name,
        "code": {"path": str(cwd)},
        "command": [_literal(a) for a in argv],
        "resources": {"gpus": gpus},
        "metrics": {"source": "auto", "regex": PROGRESS},
        "retries": retries,
    }
    if after is not None:
        spec["depends_on"] = [after]
    if cheap:
        spec["cost_class"] = "cost_sensitive"
    if at is not None:
        spec["begin"] = _time_of(at)
    return spec


def _time_of(at: str) -> str:
    """`--at` as the spec's `begin`: HH:MM (the next such local time) or an ISO date-time."""
    text = at.strip()
    if HH_MM.match(text):
        return text
    try:
        datetime.fromisoformat(text)
    except ValueError:
        raise BadArguments(
            f"--at {at!r}: write HH:MM (e.g. 23:00, the next one from now) or an ISO date-time "
            "(e.g. 2026-12-05T23:00)"
        ) from None
    return text


def default_name(argv: list[str]) -> str:
    """The job's name from its program: `python train.py --lr 1` → "train", `./run.sh` →
    "run", `python -c …` → "python"; characters a name may not hold become '-'."""
    program = PurePath(argv[0]).name
    if INTERPRETERS.match(program):
        script = next((a for a in argv[1:] if not a.startswith("-")), None)
        if argv[1:2] == ["-m"] and len(argv) > 2:  # python -m pkg.train → "pkg.train"
            program = argv[2] + ".py"
        elif script is not None and argv[1:2] != ["-c"]:
            program = PurePath(script).name
    stem = program.rsplit(".", 1)[0] if "." in program[1:] else program
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.")[:NAME_MAX]
    return cleaned or "command"


def _literal(arg: str) -> str:
    """An argument as it is: a spec's command items are templates, where `{` and `}` are
    written `{{` and `}}`."""
    return arg.replace("{", "{{").replace("}", "}}")
