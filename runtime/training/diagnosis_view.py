"""A stored diagnosis as the read commands show it, without pydantic: where its evidence is, the
short "why" of `nightshift jobs`, and the row read back as the `Diagnosis` model would read it.

`Diagnosis` (attempt_diagnosis.py) is the model the loop writes and the skills return; its
`where` and `brief` are these functions. A read command that answers without importing pydantic
(`jobs`, `show`: runtime/store/quick_read.py) reads a row through `DiagnosisView.stored`, which
takes only a row that needs no coercion — every field of its type, as the loop writes them — and
says `NotPlain` of anything else, so the command takes the full path and shows what the model
shows. tests/test_fast_answers.py holds the two to the same output.
"""

from __future__ import annotations

from typing import Any

BRIEF_CHARS = 72

# The model's fields in its order: (name, the types a plain row holds, required, default).
FIELDS: tuple[tuple[str, tuple[type, ...], bool, Any], ...] = (
    ("category", (str,), True, None),
    ("confidence", (str,), True, None),
    ("retryable", (bool,), True, None),
    ("line_no", (int, type(None)), False, None),
    ("evidence", (str, type(None)), False, None),
    ("source", (str, type(None)), False, None),
    ("summary", (str,), True, None),
    ("action", (str,), True, None),
    ("fix", (str,), True, None),
    ("changes", (dict,), False, {}),
    ("machine", (list,), False, []),
    # A person's remembered correction and a model's second opinion (nested models): only their
    # absence is plain.
    ("remembered", (type(None),), False, None),
    ("second_opinion", (type(None),), False, None),
)
# Where a piece of the machine's evidence is from, as `why` and `show` say it.
MACHINE_SOURCES = {
    "exit_status": "exit status",
    "cgroup": "the run's cgroup",
    "kernel_log": "kernel log",
    "disk": "free space",
    "gpu_xid": "GPU driver (Xid)",
    "metrics": "recorded metrics",
}


class NotPlain(ValueError):
    """A stored diagnosis that only the model can read (or refuse): take the full path."""


def where(evidence: str | None, line_no: int | None, source: str | None) -> str:
    """Where the evidence is: `line 12`, `kernel log line 3`, `monitor`, or ""."""
    if evidence is None or line_no is None:
        return ""
    if source == "monitor":
        return "monitor"
    if source in ("kernel_log", "gpu_xid") and line_no:
        return f"kernel log line {line_no}"
    if source in MACHINE_SOURCES:
        return MACHINE_SOURCES[source]
    return f"line {line_no}"


def brief(category: str, evidence: str | None, summary: str, width: int = BRIEF_CHARS) -> str:
    """`category: evidence` (or the summary when no line shows it), cut to `width`: the "why" of
    `nightshift jobs`."""
    text = f"{category}: {evidence or summary}"
    return text if len(text) <= width else text[: width - 1] + "…"


class DiagnosisView:
    """A plain stored diagnosis, with the model's attributes and methods."""

    category: str
    confidence: str
    retryable: bool
    line_no: int | None
    evidence: str | None
    source: str | None
    summary: str
    action: str
    fix: str
    changes: dict[str, Any]
    machine: list[dict[str, Any]]
    remembered: None
    second_opinion: None

    def __init__(self, values: dict[str, Any]):
        self._values = values
        for name, value in values.items():
            setattr(self, name, value)

    @classmethod
    def stored(cls, raw: Any) -> DiagnosisView | None:
        """The row's diagnosis (None: it has none); NotPlain when the model must read it."""
        if raw is None:
            return None
        if not isinstance(raw, dict) or set(raw) - {f[0] for f in FIELDS}:
            raise NotPlain("not a plain diagnosis")
        values: dict[str, Any] = {}
        for name, types, required, default in FIELDS:
            if name not in raw:
                if required:
                    raise NotPlain(f"no {name}")
                values[name] = (
                    type(default)(default) if isinstance(default, dict | list) else default
                )
                continue
            value = raw[name]
            # bool is an int to isinstance; the model reads an int line number, not True
            if type(value) not in types:
                raise NotPlain(f"{name} is a {type(value).__name__}")
            if name == "machine" and not all(
                type(item) is dict and all(type(k) is str for k in item) for item in value
            ):
                raise NotPlain("machine holds more than mappings")
            values[name] = value
        return cls(values)

    def model_dump(self) -> dict[str, Any]:
        return dict(self._values)

    def where(self) -> str:
        return where(self.evidence, self.line_no, self.source)

    def brief(self, width: int = BRIEF_CHARS) -> str:
        return brief(self.category, self.evidence, self.summary, width)
