"""How far any reader of the log alone can get on this corpus: the rules beside two blind readings.

`nightshift eval diagnosis-readers [--readings CSV] [--corpus DIR]`

The corpus's labels come from the issue threads: what the thread established, which the log
alone may not show (a bare `Killed` the thread traced to a person, a traceback whose cause the
thread never found, labelled `unknown`). To know what share of the labels a reader of the log
can reach at all, two readers labelled 400 held-out logs from the log text and the monitor's
status alone, under anonymous file names (evals/data/diagnosis_blind_reading_brief.txt says how;
their answers are READINGS). This eval scores, on those same logs and against the threads'
labels: each reader, the rules as they stand, and the rules on the logs both readers read as the
thread did (the logs whose label the text shows): that last figure is what is left to win by
reading better; the rest is the labels' own ceiling for any log reader.

The readings are data, fixed once made; the rules' figures move with the rules. A second file,
READINGS_TUNING_MISSES, holds the same two readers' labels (with the words that decided each) of
the 493 tuning logs that the rules with a model fitted on the other folds misread at stop 52
(`nightshift eval diagnosis-model --cv`): the logs both read as the thread did are what reading
better could still win there; pass it with `--readings` (its "rules" column is the shipped rules
and log model, fitted on those very logs: not a generalisation figure).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from nightshift.evals.diagnosis import CORPUS, Case, CorpusError, load_corpus, run

READINGS = Path(__file__).resolve().parent / "data" / "diagnosis_blind_readings.csv"
READINGS_TUNING_MISSES = READINGS.with_name("diagnosis_blind_readings_tuning_misses.csv")
READERS = ("a", "b")


@dataclass(frozen=True)
class Reading:
    log: str  # the corpus slug, category/file: the category is the thread's label
    said: dict[str, str]  # reader → category
    confidence: dict[str, str]  # reader → high / medium / low

    @property
    def thread(self) -> str:
        return self.log.split("/", 1)[0]


def load_readings(path: Path = READINGS) -> list[Reading]:
    with path.open(newline="") as f:
        return [
            Reading(
                log=row["log"],
                said={r: row[f"reader_{r}"] for r in READERS},
                confidence={r: row[f"confidence_{r}"] for r in READERS},
            )
            for row in csv.DictReader(f)
        ]


@dataclass(frozen=True)
class Scores:
    """Right answers per category and in all, against the threads' labels, for each reader and
    the rules; and the rules on the logs both readers read as the thread did."""

    n: dict[str, int]  # category → logs
    right: dict[str, dict[str, int]]  # who ("reader a", "reader b", "rules") → category → right
    readable: int  # logs both readers read as the thread did
    rules_on_readable: int

    def total(self, who: str) -> int:
        return sum(self.right[who].values())


def score(readings: Sequence[Reading], rules_said: dict[str, str]) -> Scores:
    """`rules_said`: log slug → the rules' category."""
    who = [f"reader {r}" for r in READERS] + ["rules"]
    n: dict[str, int] = {}
    right: dict[str, dict[str, int]] = {w: {} for w in who}
    readable = rules_on_readable = 0
    for rd in readings:
        cat = rd.thread
        n[cat] = n.get(cat, 0) + 1
        said = {f"reader {r}": rd.said[r] for r in READERS} | {"rules": rules_said[rd.log]}
        for w in who:
            right[w][cat] = right[w].get(cat, 0) + (said[w] == cat)
        if all(rd.said[r] == cat for r in READERS):
            readable += 1
            rules_on_readable += said["rules"] == cat
    return Scores(n=n, right=right, readable=readable, rules_on_readable=rules_on_readable)


def _pct(a: int, b: int) -> str:
    return f"{a} ({a / b:.1%})" if b else "–"


def print_scores(s: Scores, console: Console) -> None:
    total = sum(s.n.values())
    t = Table(
        title=f"the threads' labels read back from {total} held-out logs: recall per category"
    )
    t.add_column("category")
    t.add_column("n", justify="right")
    for who in s.right:
        t.add_column(who, justify="right")
    for cat in sorted(s.n):
        t.add_row(
            cat, str(s.n[cat]), *(f"{s.right[w].get(cat, 0) / s.n[cat]:.2f}" for w in s.right)
        )
    t.add_row("all", str(total), *(_pct(s.total(w), total) for w in s.right), end_section=True)
    console.print(t)
    console.print(
        f"logs both readers read as the thread did: {_pct(s.readable, total)}; the rules read "
        f"{_pct(s.rules_on_readable, s.readable)} of them"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="nightshift eval diagnosis-readers", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--readings", type=Path, default=READINGS, help=f"default {READINGS}")
    ap.add_argument("--corpus", type=Path, default=CORPUS, help=f"default {CORPUS}")
    args = ap.parse_args(argv)
    try:
        readings = load_readings(args.readings)
        cases = {c.slug: c for c in load_corpus(args.corpus)}
    except (OSError, KeyError, CorpusError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = [rd.log for rd in readings if rd.log not in cases]
    if missing:
        print(
            f"error: {len(missing)} read logs are not in the corpus (first: {missing[0]}): "
            "--corpus names the corpus they were drawn from",
            file=sys.stderr,
        )
        return 2
    chosen: list[Case] = [cases[rd.log] for rd in readings]
    rules_said = {c.slug: row["got"] for c, row in zip(chosen, run(chosen), strict=True)}
    print_scores(score(readings, rules_said), Console(width=120))
    return 0


if __name__ == "__main__":
    sys.exit(main())
