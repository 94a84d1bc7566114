"""Specs and arguments written to hurt: a metric regex that backtracks catastrophically is matched
in linear time (RE2) through the real loop; a pattern RE2 cannot run is refused at submit naming
the field; nesting thousands deep and integers of thousands of digits are BadArguments naming
the field, from a YAML file, the library API, the gate and the CLI, never a RecursionError or a
ValueError, and the audit stays whole."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from sqlmodel import select

from nightshift.agent.brain.wiring import Wiring
from nightshift.agent.doors.api import Client
from nightshift.evals.fuzz_inputs import GOOD, hostile_param_dicts, hostile_spec_dicts, nested
from nightshift.runtime.errors import BadArguments, NightshiftError, SpecError
from nightshift.runtime.spec import MetricSpec, load_spec
from nightshift.runtime.store.db import AuditEvent
from nightshift.runtime.training import metric_sources
from nightshift.runtime.yamlfile import MAX_INT_DIGITS

from conftest import nightshift

# The finding: Python's `re` takes hours on "1" and 40 x's (it tries every split of the x's).
HOSTILE = r"(?P<step>\d+)(?P<loss>(x+x+)+y)"
LINE = "1" + "x" * 40


# Regular expressions ------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_backtracking_regex_reads_a_log_in_linear_time(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text((LINE + "\n") * 20_000 + "12 loss 0.5\n")
    spec = MetricSpec(source="log", regex=[HOSTILE, r"(?P<step>\d+) loss (?P<loss>\S+)"])
    start = time.monotonic()
    read = metric_sources.read_new(
        spec, log_path=log, metrics_file=tmp_path / "m.jsonl", search_roots=[], cursor={}
    )
    assert time.monotonic() - start < 1.0
    assert [(p.step, p.name, p.value) for p in read.points] == [(12, "loss", 0.5)]
    assert read.cursor["log"] == log.stat().st_size


@pytest.mark.timeout(60)
def test_the_loop_ticks_in_time_on_the_hostile_spec(home: Path) -> None:
    """The exact spec of the finding, run by the real loop: every step returns within a second
    while the program prints its line, and the job succeeds."""
    w = Wiring.load()
    prints = (
        "import time\nfor _ in range(50):\n    print('" + LINE + "', flush=True)\n"
        "    time.sleep(0.02)\nprint('7 loss 0.25', flush=True)"
    )
    spec = {
        "name": "hostile",
        "command": ["{python}", "-c", prints],
        "metrics": {"source": "log", "regex": [HOSTILE, r"(?P<step>\d+) loss (?P<loss>\S+)"]},
    }
    w.loop.step()  # warm: the first step imports the engine (numpy with it), a daemon's start
    job = Client(w).submit(spec=spec)
    slowest, end = 0.0, time.monotonic() + 45
    while w.store.job(job).state in ("queued", "running") and time.monotonic() < end:
        start = time.monotonic()
        w.loop.step()
        slowest = max(slowest, time.monotonic() - start)
        time.sleep(0.05)
    assert w.store.job(job).state == "succeeded"
    assert slowest < 1.0
    assert [(p.step, p.value) for p in w.store.metrics(job, "loss")] == [(7, 0.25)]


RE2_CANNOT = {
    "lookahead": r"step (?P<step>\d+)(?= ) loss (?P<loss>\S+)",
    "lookbehind": r"(?<=step )(?P<step>\d+) loss (?P<loss>\S+)",
    "backreference": r"(?P<q>['\"])(?P<step>\d+)(?P=q) loss (?P<loss>\S+)",
    "numbered backreference": r"(a)\1 (?P<step>\d+) (?P<loss>\S+)",
}


@pytest.mark.parametrize("case", sorted(RE2_CANNOT))
def test_a_pattern_re2_cannot_run_is_refused_naming_the_field(
    home: Path, tmp_path: Path, case: str
) -> None:
    pattern = RE2_CANNOT[case]
    doc = {
        **GOOD,
        "metrics": {"source": "log", "regex": ["(?P<step>\\d+) (?P<loss>\\S+)", pattern]},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    said = str(caught.value)
    assert caught.value.field == "metrics.regex" and caught.value.line is not None, said
    assert "regex[1] uses what the linear-time engine (RE2)" in said
    assert "no backreferences" in said and "Match the text around the value plainly" in said
    with pytest.raises(BadArguments, match=r"metrics\.regex.*RE2"):
        Client().submit(spec=doc)
    result = Client().call("config_validator", {"spec": doc})
    assert not result.valid  # type: ignore[attr-defined]
    assert [e.field for e in result.errors] == ["metrics.regex"]  # type: ignore[attr-defined]


def test_a_pattern_no_engine_compiles_says_so() -> None:
    with pytest.raises(ValueError, match=r"regex does not compile: missing \)"):
        MetricSpec(regex="(?P<step>\\d+ (?P<loss>\\S+)")


# Depth and size -------------------------------------------------------------------------------


def events(w: Wiring, action: str) -> list[AuditEvent]:
    with w.store.session() as s:
        return list(s.exec(select(AuditEvent).where(AuditEvent.action == action)))


@pytest.mark.parametrize(
    ("spec", "params", "field", "says"),
    [
        ({**GOOD, "parameters": {"x": nested(5000)}}, {}, "spec.parameters.x[0]", "deeper"),
        ({**GOOD, "priority": 10**5000}, {}, "spec.priority", f"longer than {MAX_INT_DIGITS}"),
        (GOOD, {"x": nested(5000, "dict")}, "params.x.k.k", "deeper"),
        (GOOD, {"lr": -(10**5000)}, "params.lr", "digits"),
        (GOOD, {"lr": list(range(300_000))}, "params.lr", "values"),
    ],
)
def test_out_of_bounds_arguments_are_bad_arguments_naming_the_field(
    home: Path, spec: dict, params: dict, field: str, says: str
) -> None:
    """Through the gate (the library client): refused before anything recurses, audited
    without the arguments, and the audit chain still verifies."""
    w = Wiring.load()
    with pytest.raises(BadArguments) as caught:
        Client(w).submit(spec=spec, params=params)
    said = str(caught.value)
    assert said.startswith(f"submit_job: invalid arguments: {field}") and says in said, said
    (event,) = events(w, "skill.bad_arguments")
    assert event.payload["args"] is None and event.payload["field"].startswith(field)
    assert w.audit.verify().ok


def test_config_validator_refuses_the_same(home: Path, tmp_path: Path) -> None:
    with pytest.raises(BadArguments, match=r"config_validator: invalid arguments: spec\.priority"):
        Client().call("config_validator", {"spec": {**GOOD, "priority": 10**5000}})
    deep = tmp_path / "deep.json"
    deep.write_text('{"lr": ' + "[" * 5000 + "]" * 5000 + "}")
    big = tmp_path / "big.json"
    big.write_text('{"lr": ' + "9" * 5000 + "}")
    for path, says in ((deep, "nested deeper than"), (big, "an integer longer than")):
        result = Client().call("config_validator", {"path": str(path)})
        assert not result.valid  # type: ignore[attr-defined]
        assert says in result.errors[0].message  # type: ignore[attr-defined]


def test_a_5000_digit_integer_in_a_yaml_spec_names_the_field_and_line(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: p\ncommand: [x]\nparameters:\n  lr: " + "9" * 5000 + "\n")
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert (caught.value.field, caught.value.line) == ("parameters.lr", 4)
    assert f"an integer longer than {MAX_INT_DIGITS} digits" in str(caught.value)
    path.write_text("name: p\ncommand: [x]\ndeadline: 2026-13-45\n")
    with pytest.raises(SpecError, match=r"s\.yaml:3: not valid YAML: cannot read this value"):
        load_spec(path)


def test_the_cli_says_one_line(home: Path, tmp_path: Path) -> None:
    """`nightshift submit` and `validate` on the finding's files: exit 2, one error, no
    traceback."""
    big = tmp_path / "big.yaml"
    big.write_text("name: p\ncommand: [x]\npriority: " + "9" * 5000 + "\n")
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: p\ncommand: [x]\nparameters: {x: " + "[" * 5000 + "]" * 5000 + "}\n")
    for path, field in ((big, "priority"), (deep, "parameters.x")):
        for command in ("submit", "validate"):
            r = nightshift(command, str(path))
            out = r.stdout + r.stderr
            assert r.returncode == 2 and "Traceback" not in out, out
            assert f"field '{field}" in out, out


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(spec=hostile_spec_dicts, params=hostile_param_dicts)
def test_fuzz_deep_wide_and_huge_through_the_gate(home: Path, spec: dict, params: dict) -> None:
    """Accepted, or a NightshiftError; never another exception, never slower than a few seconds;
    the same input checked by config_validator the same way."""
    client = Client()
    for call in (
        lambda: client.submit(spec=spec, params=params),
        lambda: client.call("config_validator", {"spec": spec}),
    ):
        start = time.monotonic()
        try:
            call()
        except NightshiftError:
            pass
        assert time.monotonic() - start < 5


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=hostile_spec_dicts)
def test_fuzz_deep_wide_and_huge_yaml_files(tmp_path_factory, spec: dict) -> None:
    """The same values written as YAML (flow style, so thousands deep is one line, integers in
    decimal): a spec or a SpecError from the file loader."""
    text = flow(spec)
    assume(len(text) < 100_000)  # PyYAML reads ~150 KB/s; the size limit has its own test
    path = tmp_path_factory.mktemp("fz") / "s.yaml"
    path.write_text(text)
    try:
        load_spec(path)
    except SpecError:
        pass


def flow(value: object) -> str:
    """YAML flow text of nested lists and mappings, written without recursion and with integers
    of any length (neither yaml nor json can write the fuzzed values)."""
    out: list[str] = []
    todo: list[object] = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, Text):
            out.append(v)
        elif isinstance(v, dict):
            todo.append(Text("}"))
            for i, (k, x) in reversed(list(enumerate(v.items()))):
                todo += [x, Text((", " if i else "") + json.dumps(str(k)) + ": ")]
            todo.append(Text("{"))
        elif isinstance(v, list):
            todo.append(Text("]"))
            for i, x in reversed(list(enumerate(v))):
                todo += [x, Text(", " if i else "")]
            todo.append(Text("["))
        elif isinstance(v, bool) or v is None:
            out.append(json.dumps(v))
        elif isinstance(v, int):
            out.append(decimal(v))
        elif isinstance(v, float):
            out.append({"inf": ".inf", "-inf": "-.inf", "nan": ".nan"}.get(repr(v), repr(v)))
        else:
            out.append(json.dumps(str(v)))
    return "".join(out)


class Text(str):
    """Already YAML."""


def decimal(v: int) -> str:
    """`str(v)` for an integer of any length (str refuses past 4,300 digits), 1,000 at a time."""
    sign, v, chunks = "-" if v < 0 else "", abs(v), []
    while True:
        v, low = divmod(v, 10**1000)
        chunks.append(low)
        if not v:
            break
    return sign + str(chunks[-1]) + "".join(f"{c:01000d}" for c in reversed(chunks[:-1]))


def test_a_surrogate_escape_is_a_spec_error_naming_the_field(tmp_path) -> None:
    """Found by the fuzz test above: YAML reads "\\ud800\\udc00" as two lone surrogates, which
    pydantic cannot encode (a UnicodeEncodeError, not a SpecError)."""
    path = tmp_path / "s.yaml"
    path.write_text(
        '{"name": "x", "command": ["a"], "parameters": {"lr": 0.1, "x": {"\\ud800\\udc00": 1}}}'
    )
    with pytest.raises(SpecError, match=r"parameters\.x.*lone surrogate"):
        load_spec(path)
