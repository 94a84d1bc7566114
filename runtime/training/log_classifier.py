"""What a log's words say when no signature decides: a linear model learned from public logs.

The signatures of diagnose_failure are exact: when one matches, it is right nearly always, but on
logs from repositories nobody tuned them on they match too rarely (most misses there are
abstentions). A log's vocabulary still points somewhere — "stuck", "hangs" and a frozen epoch; a
"checkpoint" and "EOFError"; "Training finished" — and a linear model over word weights learns
that from many logs at once, which generalises better than one more signature per log.

The model is data (`diagnosis_model.json`, beside this file): TF-IDF word weights and one linear
score per category, fitted by `nightshift eval diagnosis-model` (evals/diagnosis_model.py, with
scikit-learn) on the corpus's tuning split only — never on the held-out repositories' logs — and
scored here in plain Python, so a diagnosis needs no scikit-learn, and gives the same numbers
(tests/test_log_classifier.py holds them to scikit-learn's own). Deterministic: the same lines
give the same verdict.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

MODEL_FILE = Path(__file__).with_name("diagnosis_model.json")
MAX_LINES = 400  # the model reads a log's last this many lines (as it was trained)
MAX_LINE_CHARS = 2000  # and each line's first this many characters
MAX_EVIDENCE_LINES = 3


@dataclass(frozen=True)
class LogModel:
    """A fitted model: token pattern, vocabulary (term → column), idf per column, and per
    category a weight per column and an intercept."""

    token_pattern: re.Pattern[str]
    vocabulary: dict[str, int]
    idf: tuple[float, ...]
    categories: tuple[str, ...]
    weights: tuple[tuple[float, ...], ...]  # [category][column]
    intercepts: tuple[float, ...]
    trained_on: dict[str, Any]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LogModel:
        terms = data["terms"]
        return cls(
            token_pattern=re.compile(data["token_pattern"]),
            vocabulary={t: i for i, t in enumerate(terms)},
            idf=tuple(float(x) for x in data["idf"]),
            categories=tuple(data["categories"]),
            weights=tuple(tuple(float(x) for x in row) for row in data["weights"]),
            intercepts=tuple(float(x) for x in data["intercepts"]),
            trained_on=dict(data.get("trained_on") or {}),
        )


@dataclass(frozen=True)
class Reading:
    """The model's reading of a log: the best category, how far ahead of the runner-up it is
    (in the model's score units), every category's score, and the lines that weigh most for it
    (0-based indexes into the lines given)."""

    category: str
    margin: float
    words: int  # how many distinct known words it was read from
    scores: dict[str, float]
    lines: tuple[int, ...]


@lru_cache(maxsize=1)
def load(path: Path = MODEL_FILE) -> LogModel | None:
    """The shipped model, or None where the file is missing (diagnosis then uses signatures
    alone)."""
    try:
        return LogModel.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None


def text_of(lines: Sequence[str]) -> list[str]:
    """The lines the model reads: the last MAX_LINES, each cut to MAX_LINE_CHARS."""
    return [line[:MAX_LINE_CHARS] for line in lines[-MAX_LINES:]]


def columns(model: LogModel, lines: Sequence[str]) -> list[list[int]]:
    """Per line the model reads (text_of), the vocabulary columns of its known words, in order."""
    vocab, pattern = model.vocabulary, model.token_pattern
    return [
        [vocab[t] for t in pattern.findall(line.lower()) if t in vocab] for line in text_of(lines)
    ]


def features(model: LogModel, lines: Sequence[str]) -> dict[int, float]:
    """TF-IDF as scikit-learn computes it (lower case, the token pattern, sublinear term
    frequency 1 + ln(tf), times idf, then L2-normalised): column → value."""
    return _tfidf(model, columns(model, lines))


def _tfidf(model: LogModel, per_line: list[list[int]]) -> dict[int, float]:
    counts = Counter(col for cols in per_line for col in cols)
    values = {col: (1.0 + math.log(n)) * model.idf[col] for col, n in counts.items()}
    norm = math.sqrt(sum(v * v for v in values.values()))
    return {col: v / norm for col, v in values.items()} if norm > 0 else {}


def scores(model: LogModel, x: dict[int, float]) -> dict[str, float]:
    return {
        cat: model.intercepts[k] + sum(v * model.weights[k][col] for col, v in x.items())
        for k, cat in enumerate(model.categories)
    }


def read(lines: Sequence[str], model: LogModel | None = None) -> Reading | None:
    """The model's reading of these lines (as pasted_log reads them), or None without a model or
    without a single known word."""
    model = model if model is not None else load()
    if model is None:
        return None
    per_line = columns(model, lines)
    x = _tfidf(model, per_line)
    if not x:
        return None
    by_cat = scores(model, x)
    ranked = sorted(by_cat.items(), key=lambda kv: (-kv[1], kv[0]))
    best, runner_up = ranked[0], ranked[1] if len(ranked) > 1 else (ranked[0][0], -math.inf)
    k = model.categories.index(best[0])
    return Reading(
        category=best[0],
        margin=best[1] - runner_up[1],
        words=len(x),
        scores=by_cat,
        lines=_weightiest_lines(model, per_line, len(lines), x, k),
    )


def _weightiest_lines(
    model: LogModel, per_line: list[list[int]], n_lines: int, x: dict[int, float], k: int
) -> tuple[int, ...]:
    """The lines whose words add most to category k's score (each word counted once, on the
    line where it first appears), best first; only lines that add something. `per_line` covers
    the last len(per_line) of the n_lines given."""
    offset = n_lines - len(per_line)
    seen: set[int] = set()
    gains: list[tuple[float, int]] = []
    for i, cols in enumerate(per_line):
        gain = 0.0
        for col in cols:
            if col not in seen:
                seen.add(col)
                gain += x[col] * model.weights[k][col]
        if gain > 0:
            gains.append((gain, i + offset))
    gains.sort(key=lambda g: (-g[0], g[1]))
    return tuple(i for _, i in gains[:MAX_EVIDENCE_LINES])
