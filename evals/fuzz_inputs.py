"""Fuzzing what a user submits: spec and goal files of any text, structured specs with infinite,
NaN and huge numbers, and the same through the real `nightshift` command — counted, not sampled
until the first failure. The quick form of each property runs in tests/test_poison_input.py.

    python -m nightshift.evals.fuzz_inputs                 # 3,000 + 3,000 + 500 + 200 + 150 CLI
    python -m nightshift.evals.fuzz_inputs --scale 0.1     # a tenth of that
    python -m nightshift.evals.fuzz_inputs --json out.json

Per property: inputs tried, accepted, refused with a SpecError / NightshiftError naming a field,
anything else (a traceback: goal 0), the slowest input (a hang: goal none past 5 s), and for
submissions a store changed by a refusal (goal 0).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import reprlib
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from nightshift.runtime.spec import ExperimentSpec

GOOD = {"name": "p", "command": ["{python}", "-c", "pass", "{lr}"], "parameters": {"lr": 0.1}}
HANG_S = 5.0  # an input that takes longer than this to accept or refuse counts as a hang

# Strategies (the tests use the same ones) ---------------------------------------------------------
texts = st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1"))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=20,
)
KEYS = list(ExperimentSpec.model_fields) + ["resources.gpus", "extra"]
spec_dicts = st.dictionaries(st.sampled_from(KEYS), values, max_size=8).map(lambda d: {**GOOD, **d})
param_dicts = st.dictionaries(st.sampled_from(["lr", "x"]), values, max_size=2)


def nested(depth: int, kind: str = "list", leaf: Any = 0) -> Any:
    """`leaf` inside `depth` lists or single-key mappings, built without recursion."""
    out = leaf
    for _ in range(depth):
        out = [out] if kind == "list" else {"k": out}
    return out


# What would recurse past Python's limit or overflow its int-string conversion if nothing
# bounded it first: nesting thousands deep, wide containers, integers of thousands of digits.
huge_ints = st.integers(min_value=20, max_value=6000).flatmap(
    lambda n: st.sampled_from([10**n - 1, 1 - 10**n, 2 ** (n * 4)])
)
deep_values = st.builds(
    nested, st.integers(min_value=0, max_value=5000), st.sampled_from(["list", "dict"]), scalars
)
wide_values = st.integers(min_value=0, max_value=250_000).map(lambda n: list(range(n)))
hostile_values = huge_ints | deep_values | wide_values | values
hostile_spec_dicts = st.one_of(
    st.dictionaries(st.sampled_from(KEYS), hostile_values, min_size=1, max_size=2).map(
        lambda d: {**GOOD, **d}
    ),
    hostile_values.map(lambda v: {**GOOD, "parameters": {"lr": 0.1, "x": v}}),
)
hostile_param_dicts = st.dictionaries(st.sampled_from(["lr", "x"]), hostile_values, max_size=2)


class Row(BaseModel):
    prop: str
    tried: int = 0
    accepted: int = 0
    refused: int = 0
    tracebacks: int = 0
    store_changed_on_refusal: int = 0
    slowest_s: float = 0.0
    hangs: int = 0
    first_traceback: str = ""


def spec_or_goal_text(row: Row, tmp: Path) -> Callable[[str], None]:
    """Any text is a spec or goal, or a SpecError."""
    from nightshift.agent.brain.goals import load_goal
    from nightshift.runtime.errors import SpecError
    from nightshift.runtime.spec import load_spec

    def check(text: str) -> None:
        p = tmp / "f.yaml"
        p.write_bytes(text.encode("utf-8", "surrogatepass"))
        for load in (load_spec, load_goal):
            try:
                load(p)
                row.accepted += 1
            except SpecError:
                row.refused += 1

    return check


def spec_round_trip(row: Row, tmp: Path) -> Callable[[dict[str, Any]], None]:
    """A structured spec as YAML: refused, or accepted and then storable and renderable."""
    from nightshift.runtime.errors import SpecError
    from nightshift.runtime.spec import load_spec, stored_spec

    def check(data: dict[str, Any]) -> None:
        p = tmp / "s.yaml"
        try:
            p.write_text(yaml.safe_dump(data))
            spec = load_spec(p)
            spec.check_filled(spec.parameters)
        except (yaml.YAMLError, SpecError):
            row.refused += 1
            return
        stored_spec(spec.model_dump(mode="json"), spec.parameters)
        spec.render(
            spec.parameters,
            dict.fromkeys(("python", "checkpoint_dir", "metrics_file", "run_dir"), "v"),
        )
        row.accepted += 1

    return check


def counts(db: Path) -> tuple[int, int]:
    with sqlite3.connect(db) as c:
        return (
            c.execute("select count(*) from job").fetchone()[0],
            c.execute("select count(*) from auditevent where action like 'job.%'").fetchone()[0],
        )


def api_submit(row: Row, home: Path) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    """Through the real Client: a job, or a NightshiftError and the store unchanged."""
    from nightshift.agent.doors.api import Client
    from nightshift.runtime.errors import NightshiftError

    client = Client()
    client.submit(spec=GOOD)
    db = home / "nightshift.db"

    def check(data: dict[str, Any], params: dict[str, Any]) -> None:
        before = counts(db)
        try:
            client.submit(spec=data, params=params)
            row.accepted += 1
        except NightshiftError:
            row.refused += 1
            row.store_changed_on_refusal += counts(db) != before

    return check


def run_property(row: Row, strategy: Any, check: Callable[..., None], n: int, seed: int) -> None:
    """Hypothesis drives the inputs; every input is counted, the first unexpected error kept.
    A tuple of strategies gives `check` one argument each."""
    from hypothesis import seed as hseed

    several = isinstance(strategy, tuple)

    def timed(example: Any) -> None:
        row.tried += 1
        start = time.monotonic()
        try:
            check(*example) if several else check(example)
        except Exception:
            row.tracebacks += 1
            if not row.first_traceback:  # reprlib: the input may be nested thousands deep
                shown = reprlib.repr(example)
                row.first_traceback = f"input {shown:.300}\n{traceback.format_exc()}"
        took = time.monotonic() - start
        row.slowest_s = max(row.slowest_s, took)
        row.hangs += took > HANG_S

    runner = given(st.tuples(*strategy) if several else strategy)(timed)
    runner = settings(
        max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )(runner)
    hseed(seed)(runner)()


def cli_files(row: Row, home: Path, n: int, seed: int) -> None:
    """Fuzzed files through the real command (`submit`, `validate`, `run`): an exit code and a
    message, never a traceback or a hang."""
    rng = random.Random(seed)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_")},
        "NIGHTSHIFT_HOME": str(home),
        "COLUMNS": "200",
    }
    pieces = [
        "name: p\n",
        "command: [x, '{lr}']\n",
        "parameters: {lr: .inf}\n",
        "priority: 1e30\n",
        "depends_on: [p]\n",
        "a: &a [1]\nb: *a\n",
        "resources: {gpus: -3}\n",
        "checkpoint: {dir: /etc/x}\n",
        "steps: [{skill: cancel_job, args: {job_id: 99}}]\n",
        "goal: train\nspec: nope.yaml\n",
        "\x00\xff\xfe",
        "[" * 200,
        "x: " + "é" * 500 + "\n",
        "- - - -\n",
        "{",
    ]
    db = home / "nightshift.db"
    for i in range(n):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 4)))
        p = home / f"cli-{i}.yaml"
        p.write_bytes(text.encode("utf-8", "surrogateescape"))
        cmd = rng.choice(["submit", "validate", "run"])
        row.tried += 1
        before, start = counts(db), time.monotonic()
        try:
            res = subprocess.run(
                [sys.executable, "-m", "nightshift.agent.doors.cli", cmd, str(p)],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            row.hangs += 1
            continue
        row.slowest_s = max(row.slowest_s, time.monotonic() - start)
        out = res.stdout + res.stderr
        if "Traceback" in out or res.returncode not in (0, 1, 2, 3, 4, 5):
            row.tracebacks += 1
            if not row.first_traceback:
                row.first_traceback = f"{cmd} {text!r}\n{out[-1500:]}"
        elif res.returncode == 0:
            row.accepted += 1
        else:
            row.refused += 1
            row.store_changed_on_refusal += counts(db)[0] != before[0]


def run(
    scale: float = 1.0, seed: int = 0, say: Callable[[str], None] = lambda s: None
) -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="nightshift-fuzz-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        old = os.environ.get("NIGHTSHIFT_HOME")
        os.environ["NIGHTSHIFT_HOME"] = str(home)
        try:
            plan: list[tuple[str, Any, Callable[[Row], Callable[..., None]], int]] = [
                (
                    "spec and goal file of any text (2 loads each)",
                    texts,
                    lambda r: spec_or_goal_text(r, Path(tmp)),
                    3000,
                ),
                (
                    "structured spec, YAML round trip",
                    spec_dicts,
                    lambda r: spec_round_trip(r, Path(tmp)),
                    3000,
                ),
                (
                    "Client().submit(spec, params)",
                    (spec_dicts, param_dicts),
                    lambda r: api_submit(r, home),
                    500,
                ),
                (
                    "Client().submit, nested 5,000 deep, 250,000 wide, 6,000-digit integers",
                    (hostile_spec_dicts, hostile_param_dicts),
                    lambda r: api_submit(r, home),
                    200,
                ),
            ]
            for name, strategy, make, n in plan:
                row = Row(prop=name)
                say(f"{name}: {max(1, int(n * scale))} inputs")
                run_property(row, strategy, make(row), max(1, int(n * scale)), seed)
                rows.append(row)
            row = Row(prop="`nightshift submit|validate|run FILE`")
            say(f"cli: {max(1, int(150 * scale))} inputs")
            cli_files(row, home, max(1, int(150 * scale)), seed)
            rows.append(row)
        finally:
            if old is None:
                os.environ.pop("NIGHTSHIFT_HOME", None)
            else:
                os.environ["NIGHTSHIFT_HOME"] = old
    return rows


def _print(rows: list[Row]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="fuzzed input (goals: tracebacks 0, hangs 0, store changed on refusal 0)")
    for col in (
        "property",
        "tried",
        "accepted",
        "refused",
        "tracebacks",
        "hangs",
        "store changed",
        "slowest",
    ):
        t.add_column(col, justify="left" if col == "property" else "right")
    for r in rows:
        t.add_row(
            r.prop,
            str(r.tried),
            str(r.accepted),
            str(r.refused),
            str(r.tracebacks),
            str(r.hangs),
            str(r.store_changed_on_refusal),
            f"{r.slowest_s:.2f} s",
        )
    Console(width=120).print(t)
    for r in rows:
        if r.first_traceback:
            print(f"\nfirst unexpected error in {r.prop}:\n{r.first_traceback}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the inputs to try")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the rows here")
    ns = ap.parse_args(argv)
    rows = run(ns.scale, ns.seed, say=lambda s: print(s, file=sys.stderr, flush=True))
    _print(rows)
    if ns.json:
        Path(ns.json).write_text(json.dumps([r.model_dump() for r in rows], indent=1))
    bad = sum(r.tracebacks + r.hangs + r.store_changed_on_refusal for r in rows)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
