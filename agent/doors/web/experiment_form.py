"""The dashboard's experiment form as submit_job's arguments, or what to fix, per form field.

The form is text a person typed: a name and a command (split into an argv as a shell would
split it, never run by one), or a whole spec YAML; GPUs; parameters as a YAML mapping; and when
(now, not before a start time, or in cheap hours). The spec is checked here with the same model
submit_job checks it with (runtime/spec.py), so a refusal lands next to the field that caused it
rather than as one message at the top; the gate still checks everything again.
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml
from pydantic import ValidationError

from nightshift.runtime.spec import ExperimentSpec

# A spec's top-level key → the form field that sets it.
FIELD_OF_KEY = {
    "name": "name",
    "command": "command",
    "resources": "gpus",
    "parameters": "params",
    "begin": "begin",
    "deadline": "deadline",
    "cost_class": "when",
}
WHENS = ("now", "begin", "cheap")


def build(values: dict[str, str]) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """(submit_job's arguments {"spec": …, "params": …, "cost_class": …}, {}), or (None,
    {field: what to fix})."""
    errors: dict[str, str] = {}
    spec_text, command = values.get("spec", "").strip(), values.get("command", "").strip()
    name = values.get("name", "").strip()
    spec: dict[str, Any] = {}
    if spec_text:
        try:
            loaded = yaml.safe_load(spec_text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            errors["spec"] = f"spec: not YAML{where}; paste the spec file's text as it is"
            loaded = {}
        if not isinstance(loaded, dict):
            errors.setdefault(
                "spec", "spec: a YAML mapping (name:, command:, …), not a list or text"
            )
            loaded = {}
        spec = dict(loaded)
        if command:
            errors["command"] = "command: leave it empty when a spec is given (the spec has one)"
    else:
        if not command:
            errors["command"] = "command: give the program to run, e.g. python train.py --lr {lr}"
        else:
            try:
                spec["command"] = shlex.split(command)
            except ValueError as exc:
                errors["command"] = f"command: {exc} (close the quote)"
    if name:
        spec["name"] = name
    elif "name" not in spec:
        errors["name"] = "name: give the experiment a name of letters, digits, . _ -"
    gpus = values.get("gpus", "").strip()
    if gpus:
        try:
            n = int(gpus)
        except ValueError:
            errors["gpus"] = f"gpus: {gpus!r} is not a whole number; write 0 to run on the CPU"
        else:
            spec["resources"] = {**(spec.get("resources") or {}), "gpus": n}
    params: dict[str, Any] = {}
    params_text = values.get("params", "").strip()
    if params_text:
        try:
            parsed = yaml.safe_load(params_text)
        except yaml.YAMLError:
            parsed = None
        if not isinstance(parsed, dict) or not all(isinstance(k, str) for k in parsed):
            errors["params"] = "params: a YAML mapping of name: value, one a line (lr: 0.1)"
        else:
            params = parsed
    when = values.get("when", "now") or "now"
    begin = values.get("begin", "").strip()
    if when not in WHENS:
        errors["when"] = "when: choose now, a start time, or cheap hours"
    elif when == "begin":
        if not begin:
            errors["begin"] = "begin: give the start time, HH:MM or an ISO date-time"
        spec["begin"] = begin
    elif begin:
        errors["begin"] = "begin: choose 'not before a time' under When, or leave it empty"
    if values.get("deadline", "").strip():
        spec["deadline"] = values["deadline"].strip()
    if not spec_text and params:  # a command's parameters are these; a spec's are overridden
        spec["parameters"], params = params, {}
    if errors:
        return None, errors
    try:
        ExperimentSpec.model_validate(spec)
    except ValidationError as exc:
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else ""
            field = FIELD_OF_KEY.get(key, "spec" if spec_text else "form")
            where = ".".join(map(str, err["loc"])) or "spec"
            errors.setdefault(field, f"{where}: {err['msg'].removeprefix('Value error, ')}")
        return None, errors
    args: dict[str, Any] = {"spec": spec}
    if params:
        args["params"] = params
    if when == "cheap":
        args["cost_class"] = "cost_sensitive"
    return args, {}


def field_of(message: str) -> str:
    """The form field a submit_job refusal names (its message starts with the field)."""
    head = message.split(":", 1)[0].strip().lower()
    for key, field in FIELD_OF_KEY.items():
        if head.startswith((key, f"spec.{key}")):
            return field
    return "params" if head.startswith("params") else "form"
