"""Failure diagnosis on real logs: diagnose_failure against a corpus of logs from public trackers.

`python -m nightshift.evals.diagnosis [--split held-out|tuning|all] [--csv PATH] [--markdown PATH]
[--corpus DIR] [--second-opinion] [--local] [--config PATH]`

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

`--local` measures the rules on the operator's own history instead of the corpus: every attempt a
person corrected (`nightshift diagnose JOB --correct CATEGORY`, the store's diagnosis_correction
rows), diagnosed again from the log excerpt kept with the correction and the attempt's exit
status; the person's category is the expected one.

`--second-opinion` also asks the configured model (llm.base_url, llm.model:
agent/brain/second_opinion.py) about every verdict the rules gave as unknown or low confidence,
and reports the rules alone and the rules + model separately: the second table takes the model's
category where its answer passed the checks, the rules' everywhere else.
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


class CorpusError(ValueError):
    """A corpus folder this eval cannot read (its message says which, and how to fix it)."""


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
        if not (folder / "sources.yaml").is_file():
            if any(folder.glob("*.log")):
                raise CorpusError(
                    f"{folder} holds logs but no sources.yaml: add one, a row per log (file, "
                    "url, exit_code, signal, monitor_says, note)"
                )
            continue  # a category with no logs yet
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


def print_report(
    rows: list[dict[str, Any]], split: str, show_misses: bool = False, title: str = ""
) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    t = Table(title=title or f"diagnose_failure on real logs — split {split}: {len(rows)} logs")
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


def table_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The per-category table and the overall accuracy, as Markdown lines."""
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
    return out


# ------------------------------------------------------------------------------ the operator's own
def local_cases(config: str | None = None) -> list[tuple[dict[str, Any], list[tuple[int, str]]]]:
    """Each correction in the store: (what the rules need to run again — the expected category,
    a label, the log excerpt and the status —, the excerpt as numbered lines), oldest first."""
    from sqlmodel import select

    from nightshift.agent.brain.wiring import Wiring
    from nightshift.runtime.store.db import DiagnosisCorrection

    w = Wiring.load(config)
    with w.store.session() as s:
        rows = s.exec(select(DiagnosisCorrection).order_by(DiagnosisCorrection.id)).all()
    out = []
    for c in rows:
        lines = c.log_excerpt.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        out.append(
            (
                {
                    "category": c.category,
                    "file": f"job {c.job_id} attempt {c.attempt_number}",
                    "corrected_by": c.corrected_by,
                    "corrected_at": c.corrected_at.isoformat(timespec="seconds"),
                    "log_tail": c.log_excerpt,
                    "first_line_no": c.first_line_no,
                    "exit_code": c.exit_code,
                    "signal": c.signal,
                    "monitor_says": c.monitor_says,
                    "monitor_detail": c.monitor_detail,
                },
                list(enumerate(lines, start=c.first_line_no)),
            )
        )
    return out


def diagnose_local(case: dict[str, Any], ctx: Any = None) -> dict[str, Any]:
    """One row for a correction: what the rules say now on its excerpt and status."""
    from nightshift.skills.diagnose_failure import diagnose_failure

    args: dict[str, Any] = {
        k: case[k] for k in ("log_tail", "exit_code", "signal", "monitor_says", "monitor_detail")
    }
    args["remember"] = False  # the rules alone: a correction would otherwise read itself
    if args["signal"] is not None and not 0 <= args["signal"] <= 64:
        args["signal"] = None
    t0 = time.perf_counter()
    try:
        r = diagnose_failure.fn(
            ctx if ctx is not None else _context(), diagnose_failure.parse(args)
        )
        got, confidence, reasoning = r.category, r.confidence, r.reasoning
    except Exception as exc:  # noqa: BLE001 - a raise is a result here, reported as a miss
        got, confidence, reasoning = "error", "", f"{type(exc).__name__}: {exc}"
    return {
        "category": case["category"],
        "file": case["file"],
        "corrected_by": case["corrected_by"],
        "corrected_at": case["corrected_at"],
        "got": got,
        "ok": got == case["category"],
        "confidence": confidence,
        "exit_code": case["exit_code"],
        "signal": case["signal"],
        "monitor_says": case["monitor_says"],
        "ms": round((time.perf_counter() - t0) * 1e3, 2),
        "reasoning": reasoning,
    }


# ------------------------------------------------------------------------------ rules + model
def add_second_opinions(
    rows: list[dict[str, Any]],
    windows: list[Any],
    ep: Any,
    client: Any = None,
) -> None:
    """Ask the model about each row the rules said unknown or low confidence for; `windows[i]`
    gives row i's numbered log lines (a callable, so only the rows asked are read). Adds
    `asked`, `model_accepted`, `model_said`, `model_note` and `combined` (the model's category
    where its answer was accepted, else the rules')."""
    from nightshift.agent.brain import second_opinion as so

    for r, get in zip(rows, windows, strict=True):
        r.update(asked=False, model_accepted=None, model_said=None, model_note="")
        r["combined"] = r["got"]
        if r["got"] == "error" or not so.wanted(r["got"], r["confidence"]):
            continue
        verdict = {"category": r["got"], "confidence": r["confidence"], "reasoning": r["reasoning"]}
        op = so.ask(ep, get(), verdict, client=client)
        r.update(asked=True, model_accepted=op.accepted, model_said=op.category, model_note=op.note)
        if op.accepted and op.category:
            r["combined"] = op.category


def combined(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as the rules + model would say them."""
    return [{**r, "got": r["combined"], "ok": r["combined"] == r["category"]} for r in rows]


def print_opinions(rows: list[dict[str, Any]], model: str) -> None:
    asked = [r for r in rows if r["asked"]]
    accepted = [r for r in asked if r["model_accepted"]]
    right = sum(r["model_said"] == r["category"] for r in accepted)
    was_right = sum(r["ok"] for r in asked)
    print(
        f"second opinion ({model}): asked on {len(asked)} of {len(rows)} verdicts (unknown or "
        f"low confidence; the rules were right on {was_right} of them); accepted "
        f"{len(accepted)}, right {right}; dropped {len(asked) - len(accepted)}"
    )
    reasons: dict[str, int] = {}
    for r in asked:
        if not r["model_accepted"]:
            key = r["model_note"].split(" (")[0].split(":")[0][:80]
            reasons[key] = reasons.get(key, 0) + 1
    for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  dropped {n}: {why}")


def markdown(
    rows: list[dict[str, Any]], cases: list[Case], split: str, show_misses: bool = False
) -> str:
    """The per-category table, the misses and the corpus composition, as Markdown."""
    out = table_markdown(rows)
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


def main(argv: list[str] | None = None, *, client: Any = None) -> int:
    """The eval; `client`: an OpenAI client to ask instead of the configured endpoint's own (a
    test's, pointed at the scripted server)."""
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
    ap.add_argument(
        "--local",
        action="store_true",
        help="measure the rules on this store's corrected history (`nightshift diagnose JOB "
        "--correct CATEGORY`) instead of the corpus",
    )
    ap.add_argument(
        "--second-opinion",
        action="store_true",
        help="also ask the configured model about unknown / low-confidence verdicts; report the "
        "rules alone and the rules + model separately",
    )
    ap.add_argument("--config", default=None, help="config file (the store, the model endpoint)")
    args = ap.parse_args(argv)
    ep = None
    if args.second_opinion:
        from nightshift.agent.brain.llm import NO_ENDPOINT
        from nightshift.agent.brain.second_opinion import configured
        from nightshift.runtime.config import load_settings
        from nightshift.runtime.errors import ConfigError

        try:
            ep = configured(load_settings(args.config))
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if ep is None:
            print(f"error: --second-opinion: {NO_ENDPOINT}", file=sys.stderr)
            return 2
    cases: list[Case] = []
    if args.local:
        split = "local"
        local = local_cases(args.config)
        ctx = _context()
        rows = [diagnose_local(c, ctx) for c, _ in local]
        windows: list[Any] = [
            (lambda numbered=numbered: _numbered_window(numbered)) for _, numbered in local
        ]
        if not rows:
            print(
                "error: no corrections in this store yet: `nightshift diagnose JOB --correct "
                "CATEGORY` records one",
                file=sys.stderr,
            )
            return 2
        title = f"diagnose_failure on this store's corrected history: {len(rows)} attempts"
    else:
        if not args.corpus.is_dir():
            print(f"error: no corpus folder at {args.corpus}", file=sys.stderr)
            return 2
        split = args.split
        try:
            cases = load_corpus(args.corpus)
        except CorpusError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        chosen = select(cases, split)
        rows = run(chosen)
        windows = [(lambda c=c: _file_window(c.path)) for c in chosen]
        title = ""
        if not rows:
            print("error: the split has no logs", file=sys.stderr)
            return 2
    if ep is not None:
        print_report(rows, split, args.show_misses, title=f"rules alone — {title or split}")
        add_second_opinions(rows, windows, ep, client=client)
        both = combined(rows)
        print_report(
            both, split, args.show_misses, title=f"rules + model ({ep.model}) — {title or split}"
        )
        print_opinions(rows, ep.model)
    else:
        print_report(rows, split, args.show_misses, title=title)
    if args.csv:
        write_csv(args.csv, rows)
        print(f"wrote {args.csv}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        text = (
            markdown(rows, cases, split, args.show_misses)
            if cases
            else "\n".join(table_markdown(rows)) + "\n"
        )
        if ep is not None:
            text += f"\nRules + model ({ep.model}):\n\n" + "\n".join(table_markdown(combined(rows)))
            text += "\n"
        args.markdown.write_text(text)
        print(f"wrote {args.markdown}")
    return 0


def _file_window(path: Path) -> list[tuple[int, str]]:
    from nightshift.agent.brain.second_opinion import read_window

    return read_window(path)[0]


def _numbered_window(numbered: list[tuple[int, str]]) -> list[tuple[int, str]]:
    from nightshift.agent.brain.second_opinion import window

    if not numbered:
        return []
    return window([t for _, t in numbered], numbered[0][0])


if __name__ == "__main__":
    sys.exit(main())
