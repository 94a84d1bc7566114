"""A log reads the same however it was pasted: every log of the corpus's tuning split, put through
what platforms, terminals, forums and chat programs do to a log on its way to diagnose_failure,
gets the category it gets as it is. The ways are the ones people's pastes show: a markdown quote
or code block, Windows line ends, a forum's folded `<details>` block, a page's HTML entities, the
blanks a web page, a chat or a CJK editor leaves (no-break and ideographic spaces, tabs), colour
codes, an indenting paste; and, under the markup a person adds, a timestamp before every line (as
`docker logs -t` and `kubectl logs --timestamps` print it, a time zone's name too) and a rank label
(torchrun's `--tee`). Before stop 45, 66 of these readings (of 1,468 logs × 12 ways) changed the
verdict: a timezone pattern that ate the start of `OSError`, `ERROR` and `NCCL`; a glog or warning
level not seen behind a time or an indent; a fold's `</details>` read as the log's last line; a
no-break space in the shell's `Killed` line."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from nightshift.evals.diagnosis import Case, _context, load_corpus, select
from nightshift.skills.diagnose_failure import diagnose_failure

# What a person adds around a line when pasting (quote marks, bold, inline code's backtick, a
# fence): a platform's decoration goes under it, as the platform wrote it before the person
# copied it.
_MARKUP = re.compile(r"^(\s{0,3}(?:>\s?)*(?:\*\*)?`?)")
_FENCE = re.compile(r"^\s*(?:>\s?)*```")


def _each_line(add: Callable[[str], str]) -> Callable[[str], str]:
    """A platform's prefix or decoration on every written line, under the paster's markup."""

    def apply(text: str) -> str:
        out = []
        for line in text.splitlines(True):
            body = line.rstrip("\r\n")
            if not body.strip() or _FENCE.match(body):
                out.append(line)
                continue
            head = _MARKUP.match(body).group(1)  # type: ignore[union-attr]
            out.append(head + add(body[len(head) :]) + line[len(body) :])
        return "".join(out)

    return apply


_CTX = _context()  # diagnose_failure reads nothing but its input

PASTES: dict[str, Callable[[str], str]] = {
    "a markdown quote": lambda t: "".join("> " + line for line in t.splitlines(True)),
    "Windows line ends": lambda t: t.replace("\r\n", "\n").replace("\n", "\r\n"),
    "a code block": lambda t: "```text\n" + t.rstrip("\n") + "\n```\n",
    "inline code": lambda t: "`" + t.strip("\n") + "`\n",
    "a folded <details> block": lambda t: (
        "<details>\n<summary>Full log</summary>\n\n```\n" + t.rstrip("\n") + "\n```\n\n</details>\n"
    ),
    "HTML entities": lambda t: t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"),
    "no-break spaces": lambda t: t.replace("  ", "\u00a0 ").replace(" : ", "\u3000:\u3000"),
    "tabs for indents": lambda t: t.replace("    ", "\t"),
    "an indenting paste": lambda t: "".join("    " + line for line in t.splitlines(True)),
    "colour codes": _each_line(lambda s: "\x1b[0;31m" + s + "\x1b[0m"),
    "a platform's timestamps": _each_line(lambda s: "2024-05-01T12:00:00.123456789Z " + s),
    "a timestamp with its zone": _each_line(lambda s: "[2024-05-01 12:00:00,123 CEST] " + s),
    "a rank label": _each_line(lambda s: "[rank0]: " + s),
}


@pytest.fixture(scope="module")
def cases() -> list[tuple[Case, str, str]]:
    """The tuning split's logs, each with its text and the category it reads as."""
    out = []
    for case in select(load_corpus(), "tuning"):
        text = case.path.read_text(errors="replace")
        out.append((case, text, _category(case, text)))
    return out


def _category(case: Case, text: str) -> str:
    args = {
        "log_tail": text,
        "exit_code": case.exit_code,
        "signal": case.signal,
        "monitor_says": case.monitor_says,
    }
    return diagnose_failure.fn(_CTX, diagnose_failure.parse(args)).category


@pytest.mark.parametrize("paste", list(PASTES))
def test_a_log_reads_the_same_however_it_was_pasted(cases, paste):
    changed = [
        (case.file, was, now)
        for case, text, was in cases
        if (now := _category(case, PASTES[paste](text))) != was
    ]
    assert len(cases) > 1000
    assert changed == [], f"{len(changed)} of {len(cases)} logs read otherwise: {changed[:5]}"


def test_the_pastes_change_the_text(cases):
    """Each way of pasting changes many logs' text (so a test above cannot pass by doing nothing)."""
    for name, paste in PASTES.items():
        changed = sum(1 for _, text, _ in cases if paste(text) != text)
        assert changed > len(cases) // 10, (name, changed)
