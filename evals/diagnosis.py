"""Failure diagnosis on real logs: diagnose_failure against a corpus of logs from public trackers.

`python -m nightshift.evals.diagnosis [--split held-out|tuning|all] [--csv PATH] [--markdown PATH]
[--corpus DIR]`

The corpus (`tests/fixtures/logs/corpus/<category>/`) holds one file per real failure log, retyped
from a GitHub issue, and a `sources.yaml` per folder naming each file's issue URL and what the
monitor would have seen: `exit_code`, `signal`, `monitor_says` (each may be null). The folder is
the expected category. Every log is diagnosed from its file (`log_path`) with that status.

The split is by repository, never by log: the logs of the repositories listed in
`evals/data/diagnosis_held_out_repos.txt` (HELD_OUT_FILE) are held out, read by this eval and never
by the rules; the signatures are tuned on the other repositories' logs (`tuning`) only. A log's
repository is the owner/name of its issue URL (lower case), or the site for a forum thread.

Printed: per expected category, n, how many were predicted as it, precision and recall; overall
accuracy; and every miss with its file, what was expected, what the skill said and why. A log on
which the skill raises counts as a miss, with category `error`. `--csv` writes one row per log.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from nightshift.evals.output import write_csv

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "logs" / "corpus"
SPLITS = ("held-out", "tuning", "all")


HELD_OUT_FILE = Path(__file__).resolve().parent / "data" / "diagnosis_held_out_repos.txt"


def repository_of(url: str) -> str:
    """`owner/name` of a GitHub URL (lower case); the site of any other."""
    m = re.match(r"https?://(?:www\.)?github\.com/([^/]+)/([^/#?]+)", url)
    return f"{m.group(1)}/{m.group(2)}".lower() if m else url.split("/")[2].lower()


def held_out_repositories(path: Path = HELD_OUT_FILE) -> frozenset[str]:
    """The repositories whose logs are held out from tuning (one per line, `#` comments)."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return frozenset(line.lower() for line in lines if line)


@dataclass(frozen=True)
class Case:
    category: str  # expected: the folder
    file: str
    path: Path
    url: str
    exit_code: int | None
    signal: int | None
    monitor_says: str | None
    note: str
    held_out: bool

    @property
    def slug(self) -> str:
        return f"{self.category}/{self.file}"

    @property
    def repository(self) -> str:
        return repository_of(self.url)


def load_corpus(root: Path = CORPUS, held_out: frozenset[str] | None = None) -> list[Case]:
    """Every log of the corpus with its sources.yaml entry, in a stable order; `held_out`: the
    held-out repositories (default: HELD_OUT_FILE's)."""
    held = held_out_repositories() if held_out is None else held_out
    cases = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        rows = yaml.safe_load((folder / "sources.yaml").read_text()) or []
        for row in rows:
            cases.append(
                Case(
                    category=folder.name,
                    file=row["file"],
                    path=folder / row["file"],
                    url=row["url"],
                    exit_code=row.get("exit_code"),
                    signal=row.get("signal"),
                    monitor_says=row.get("monitor_says"),
                    note=row.get("note") or "",
                    held_out=repository_of(row["url"]) in held,
                )
            )
    return sorted(cases, key=lambda c: c.slug)


def select(cases: list[Case], split: str) -> list[Case]:
    if split == "all":
        return cases
    return [c for c in cases if c.held_out == (split == "held-out")]


def _context() -> Any:
    from nightshift.skills.base import SkillContext

    # diagnose_failure reads nothing but its input; no store, settings or clock is needed.
    return SkillContext(store=None, settings=None, now=datetime(2026, 1, 1))  # type: ignore[arg-type]


def diagnose_case(case: Case, ctx: Any = None) -> dict[str, Any]:
    """One row: what the skill said on this log (category `error` if it raised)."""
    from nightshift.skills.diagnose_failure import diagnose_failure

    args: dict[str, Any] = {
        "log_path": str(case.path),
        "exit_code": case.exit_code,
        "signal": case.signal,
        "monitor_says": case.monitor_says,
    }
    t0 = time.perf_counter()
    try:
        # A read skill scored offline over a corpus: its own function, no gate to pass
        r = diagnose_failure.fn(
            ctx if ctx is not None else _context(), diagnose_failure.parse(args)
        )
        got, confidence, reasoning = r.category, r.confidence, r.reasoning
        action = r.remediation.action
    except Exception as exc:  # noqa: BLE001 - a raise is a result here, reported as a miss
        got, confidence, reasoning, action = "error", "", f"{type(exc).__name__}: {exc}", ""
    return {
        "category": case.category,
        "file": case.file,
        "repository": case.repository,
        "held_out": case.held_out,
        "got": got,
        "ok": got == case.category,
        "confidence": confidence,
        "action": action,
        "exit_code": case.exit_code,
        "signal": case.signal,
        "monitor_says": case.monitor_says,
        "ms": round((time.perf_counter() - t0) * 1e3, 2),
        "url": case.url,
        "reasoning": reasoning,
    }


def run(cases: list[Case]) -> list[dict[str, Any]]:
    ctx = _context()
    return [diagnose_case(c, ctx) for c in cases]


def per_category(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """n, predicted, correct, precision and recall per expected category (and any predicted one)."""
    cats = sorted({r["category"] for r in rows} | {r["got"] for r in rows})
    out = []
    for c in cats:
        n = sum(r["category"] == c for r in rows)
        predicted = sum(r["got"] == c for r in rows)
        correct = sum(r["category"] == c and r["ok"] for r in rows)
        out.append(
            {
                "category": c,
                "n": n,
                "predicted": predicted,
                "correct": correct,
                "precision": correct / predicted if predicted else None,
                "recall": correct / n if n else None,
            }
        )
    return out


def accuracy(rows: list[dict[str, Any]]) -> float:
    return sum(r["ok"] for r in rows) / len(rows) if rows else 0.0


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def confusion(rows: list[dict[str, Any]]) -> tuple[list[str], dict[tuple[str, str], int]]:
    """The categories seen (expected or said) and the count of each (expected, said) pair."""
    cats = sorted({r["category"] for r in rows} | {r["got"] for r in rows})
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        counts[r["category"], r["got"]] = counts.get((r["category"], r["got"]), 0) + 1
    return cats, counts


def confusion_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The confusion matrix: a row per expected category, a column per category said."""
    cats, counts = confusion(rows)
    short = {c: c.replace("_", " ") for c in cats}
    out = [
        "| expected ↓ said → | " + " | ".join(short[c] for c in cats) + " |",
        "| --- | " + " | ".join("---:" for _ in cats) + " |",
    ]
    for e in cats:
        if not any(r["category"] == e for r in rows):
            continue
        cells = [str(counts.get((e, g), "")) if (e, g) in counts else "" for g in cats]
        cells = [f"**{c}**" if c and e == g else c for c, g in zip(cells, cats, strict=True)]
        out.append(f"| {e} | " + " | ".join(cells) + " |")
    return out


def listed_misses(split: str, show: bool) -> bool:
    """Whether misses are listed one by one: not on the held-out split unless asked. Reading
    them is how a held-out log gets tuned on; their count and the confusion matrix say enough."""
    return show or split != "held-out"


def print_report(rows: list[dict[str, Any]], split: str, show_misses: bool = False) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    t = Table(title=f"diagnose_failure on real logs — split {split}: {len(rows)} logs")
    for col in ("category", "n", "predicted", "correct", "precision", "recall"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for c in per_category(rows):
        t.add_row(
            c["category"],
            str(c["n"]),
            str(c["predicted"]),
            str(c["correct"]),
            _fmt(c["precision"]),
            _fmt(c["recall"]),
        )
    t.add_section()
    ok = sum(r["ok"] for r in rows)
    t.add_row("overall accuracy", str(len(rows)), "", str(ok), "", f"{accuracy(rows):.3f}")
    console.print(t)
    misses = [r for r in rows if not r["ok"]]
    errors = sum(r["got"] == "error" for r in rows)
    console.print(f"misses: {len(misses)}; raised: {errors}")
    if misses and not listed_misses(split, show_misses):
        console.print(
            "(not listed: the held-out split is not for tuning; --show-misses lists them)"
        )
    elif misses:
        m = Table(title="misses")
        for col in ("file", "expected", "said", "why"):
            m.add_column(col, overflow="fold")
        for r in misses:
            m.add_row(escape(r["file"]), r["category"], r["got"], escape(r["reasoning"][:160]))
        console.print(m)


def markdown(
    rows: list[dict[str, Any]], cases: list[Case], split: str, show_misses: bool = False
) -> str:
    """The per-category table, the misses and the corpus composition, as Markdown."""
    out = [
        "| category | n | predicted | correct | precision | recall |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in per_category(rows):
        out.append(
            f"| {c['category']} | {c['n']} | {c['predicted']} | {c['correct']} | "
            f"{_fmt(c['precision'])} | {_fmt(c['recall'])} |"
        )
    ok = sum(r["ok"] for r in rows)
    out.append(f"| **overall accuracy** | {len(rows)} | | {ok} | | **{accuracy(rows):.3f}** |")
    out += ["", "Confusion matrix (rows: the expected category; columns: what was said):", ""]
    out += confusion_markdown(rows)
    misses = [r for r in rows if not r["ok"]]
    listed = listed_misses(split, show_misses)
    out += ["", f"Misses on split `{split}`: {len(misses)}" + (":" if misses and listed else ".")]
    if listed:
        out += [
            f"- `{r['category']}/{r['file']}` → said `{r['got']}` ({r['reasoning'][:140]})"
            for r in misses
        ]
    out += [
        "",
        "Corpus composition (logs per category; held-out = the logs of the held-out repositories):",
        "",
        "| category | logs | held-out | tuning |",
        "| --- | ---: | ---: | ---: |",
    ]
    for cat in sorted({c.category for c in cases}):
        mine = [c for c in cases if c.category == cat]
        held = sum(c.held_out for c in mine)
        out.append(f"| {cat} | {len(mine)} | {held} | {len(mine) - held} |")
    held = sum(c.held_out for c in cases)
    out.append(f"| **all** | {len(cases)} | {held} | {len(cases) - held} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m nightshift.evals.diagnosis", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--split",
        choices=SPLITS,
        default="held-out",
        help="which logs to diagnose (default held-out)",
    )
    ap.add_argument("--csv", type=Path, default=None, help="also write one row per log here")
    ap.add_argument(
        "--markdown",
        type=Path,
        default=None,
        help="also write the tables (and the corpus composition) as Markdown here",
    )
    ap.add_argument("--corpus", type=Path, default=CORPUS, help=f"corpus folder (default {CORPUS})")
    ap.add_argument(
        "--show-misses",
        action="store_true",
        help="list the held-out split's misses one by one (never while tuning the rules)",
    )
    args = ap.parse_args(argv)
    if not args.corpus.is_dir():
        print(f"error: no corpus folder at {args.corpus}", file=sys.stderr)
        return 2
    cases = load_corpus(args.corpus)
    rows = run(select(cases, args.split))
    if not rows:
        print("error: the split has no logs", file=sys.stderr)
        return 2
    print_report(rows, args.split, args.show_misses)
    if args.csv:
        write_csv(args.csv, rows)
        print(f"wrote {args.csv}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(rows, cases, args.split, args.show_misses))
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
