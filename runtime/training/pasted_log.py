"""Read a log as people paste it: what a line says once the decoration around it is taken off.

A log reaches diagnose_failure as the process wrote it, or as someone pasted it into an issue:
behind markdown quote marks (`> `), with colour codes (or what is left of them once the escape
byte is lost: `[31m`), behind timestamps, log levels and rank labels (`2024-01-02 03:04:05,678 -
INFO -`, `[rank0]:`, `[default0]:`, `0: `, `W0302 19:39:39.186000 1 f.py:2]`), with a progress
bar's carriage-return redraws on one line, with a long message wrapped onto the next line, and
with Windows paths. The functions here are pure: they take text and return text, never read a
file, and do bounded work per line (each pattern is linear, prefixes are taken off a bounded
number of times).

`views(lines)` is what the signatures are matched on: for each line, its main reading (the last
carriage-return segment, decoration off) first, then its other readings (the earlier segments,
and the line joined to the next one when a message looks wrapped). Each view keeps the index of
its original line, so evidence is quoted from the original text with its own line number.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_PREFIXES = 6  # decoration taken off one line at most this many times
WRAP_MIN_CHARS = 60  # a line shorter than this is not read as wrapped onto the next one

# Colour and cursor codes, whole (ESC [ ... letter, OSC ... BEL) or as remnants a paste leaves
# when the escape byte is dropped or shown as `^[`: `[31m`, `[0m`, `[1;32m`, `[m`, `^[[D`.
_ANSI = re.compile(
    r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\n]{0,200}\x07|\^\[\[[0-9;]*[A-Za-z]"
    r"|(?<!\[)\[\d{1,3}(?:;\d{1,3}){0,4}m(?!\])"
    # the bare reset `[m`, but not code's `metrics[metric_to_check]` or `x[m]`
    r"|(?<!\[)\[m(?![\w\]])"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_ENTITY = re.compile(r"&(?:lt|gt|amp|quot|apos|#\d{1,6}|#x[0-9a-fA-F]{1,5});")
# Blanks a copy from a web page, a chat or a CJK editor leaves (a no-break space, an ideographic
# space) and tabs: read as one space each, so `line 3: 1234<tab>Killed` reads as the shell prints
# it; zero-width characters and a byte-order mark: dropped.
_SPACES = str.maketrans(
    dict.fromkeys([0x09, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x202F, 0x205F, 0x3000], " ")
    | dict.fromkeys([0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF], None)
)
# Markdown quote marks (nested too; indented too, as a paste into an indented block leaves
# them), and a code fence's opening a paste may leave on a line.
_QUOTE = re.compile(r"^[ \t]*(?:>\s?){1,8}|^\s*```\w*\s*")
# A line that is only the HTML a forum folds a pasted log in (`<details><summary>log</summary>`,
# `</details>`, `<pre>`): nothing the program wrote.
_FOLD = re.compile(
    r"^\s*(?:<(?:/?(?:details|summary|pre|code|p|div)|br)\s*/?>\s*|<details\s[^>\n]{0,80}>\s*"
    r"|<summary>[^<\n]{0,200}</summary>\s*)+$",
    re.IGNORECASE,
)
# Inline code's delimiters at a line's ends (a fence, three or more, is a _QUOTE)
_SPAN_OPEN = re.compile(r"^(\s*)`{1,2}(?!`)")
_SPAN_CLOSE = re.compile(r"(?<!`)`{1,2}\s*$")
# A line set in Markdown bold as a whole (`**RuntimeError: …**`): the emphasis off.
_BOLD = re.compile(r"^(\s*)\*\*(?=[^\s*])(.+?)(?<=[^\s*])\*\*\s*$")  # not `***** x *****`
# A time zone's abbreviation after a timestamp (`UTC`, `CEST`, `UTC+8`): named ones only, so that
# a level (`ERROR`), a library (`NCCL`) or an exception (`OSError`) after the time is left alone.
_ZONE = (
    r"(?:UTC|GMT)(?:[+-]\d{1,2}(?::?\d\d)?)?\b|(?:[ECMPAH][SD]T|CES?T|EES?T|WES?T|BST|IST|JST|KST"
    r"|HKT|SGT|MSK|AES?T|AEDT|NZ[SD]T)\b"
)
# A time at the start of a line, with its separator: an ISO-like timestamp, bare or bracketed
# (`2024-01-02 03:04:05,678 - `, `2024-01-02T03:04:05.123456789Z `), or a time of day alone
# (`12:01:02 `, `[12:01:02.123]`)
_TIME = (
    r"\[?\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?"
    rf"(?: ?(?:{_ZONE}))?\]?\s*(?:[-|:]\s*)?"
    r"|\[?\d\d:\d\d:\d\d(?:[.,]\d{1,9})?\]?\s*(?:[-|:]\s+)?"
)
# A launcher's rank or process label: `[rank0]: `, `[default0]:`, `[1,0]<stderr>:`, `(pid=12) `, `0: `
_LABEL = (
    r"\[(?:rank|default|local_rank|RANK)\s?\d{1,5}\]:?\s*"
    r"|\[\d{1,5},\d{1,5}\]<std(?:out|err)>:\s*"
    r"|\((?:[\w.]{1,60} )?pid=\d+(?:, ip=[\d.]+)?\)\s*"
    r"|\d{1,4}: (?=\S)"
)
_ADDED = re.compile(rf"^\s*(?:(?:{_TIME}|{_LABEL})\s*){{1,{MAX_PREFIXES}}}(?=\S)")
# One piece of decoration at the start of a line; taken off repeatedly (MAX_PREFIXES).
_PREFIX = re.compile(
    r"^(?:"
    + _TIME
    # log levels: `INFO - `, `INFO     | `, `[ERROR] `, `ERROR:root:`, `[WARNING|trainer.py:12] `
    + r"|\[?(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL|NOTICE)\]?\s*(?:[-|]\s*|:\s+)"
    r"|\[(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL)\|[^\]\n]{1,80}\]\s*"
    r"|(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL):[\w.<>-]{1,80}:"
    # glog and c10 (`W0302 19:39:39.186000 1 f.py:2] `, `[W926 21:34:49.0 socket.cpp:697] `) and
    # absl / TensorFlow (`2024-02-25 18:52:47.991396: W tensorflow/core/x.cc:12] `, its date gone)
    r"|\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\]\s]{1,200}\]\s*"
    r"|\[[IWEF](?:\d{3,4} [\d:.]+)? [^\]\s]{1,200}:\d+\]\s*"
    r"|[IWEF] [\w./-]{1,200}:\d+\]\s*"
    # a logger's `module:function:line - ` after a loguru / yolox level column
    r"|[\w.]{1,120}:[\w<>]{1,80}:\d+ - "
    # rank and process labels
    r"|" + _LABEL + r")"
)
# A progress bar's rate bracket followed by text with no newline in between (the bar was not
# ended: the process was killed, or printed over it): `0/2 [00:00<?, ?it/s]Killed`.
_BAR_END = re.compile(r"(?:(?<=it/s\])|(?<=s/it\])|(?<=B/s\]))(?=\S)")
# Windows paths: `C:\Users\me\x.py` or `C:\\Users\\me` read as `C:/Users/me/x.py`.
_WIN_PATH = re.compile(r"(?:(?<=\b[A-Za-z]:)|(?<=[\w.~$-]))\\{1,2}(?=[\w.~$-])")
_HAS_WIN_PATH = re.compile(r"\b[A-Za-z]:\\|\\\\")
# A line that starts a new record rather than continuing a wrapped one.
_NEW_RECORD = re.compile(
    r"^\s*(?:$|\d{4}-\d\d-\d\d|\[|Traceback|File \"|During handling|The above exception|"
    r"[A-Z]\w*(?:Error|Exception|Warning)\b|[IWEF]\d{4} |#|\||frame #|\w+:\d+:\d+ )"
)


@dataclass(frozen=True)
class View:
    """One reading of one original line: `index` is the line's (0-based), `text` what is matched,
    `surface` the reading with quote marks, colour codes and control bytes off but the prefixes
    (timestamp, level, rank) still on (whether a line is informational is read from them);
    `primary` is False for the extra readings (earlier carriage-return segments, a join)."""

    index: int
    text: str
    surface: str
    primary: bool = True


def split_lines(text: str) -> list[str]:
    """The log's lines as the file numbers them: split at newlines only (a carriage return
    within a line is a progress bar's redraw, read by `segments`), a CRLF's CR dropped."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def decolour(text: str) -> str:
    """Colour and cursor codes (and their remnants) and control bytes off, odd blanks plain."""
    return _CONTROL.sub("", _ANSI.sub("", text)).translate(_SPACES)


def unquote(text: str) -> str:
    """Markdown quote marks and a code fence's opening off the start, bold around a line, the
    backticks of inline code, and a line of folding HTML as a whole."""
    text = _code_span(_QUOTE.sub("", text, count=1))
    return "" if _FOLD.match(text) else _BOLD.sub(r"\1\2", text)


def _code_span(text: str) -> str:
    """A log pasted as Markdown inline code has a run of one or two backticks before its first
    line and after its last (or both around a one-line paste): those off. Backticks the program
    printed come in pairs (`` `forward` ``) and stay."""
    if "`" not in text:
        return text
    opener, closer = _SPAN_OPEN.match(text), _SPAN_CLOSE.search(text)
    if opener and closer and opener.end() <= closer.start():
        inner = text[opener.end() : closer.start()]
        return opener.group(1) + inner if "`" not in inner else text
    if opener and text.count("`", opener.end()) % 2 == 0:
        return opener.group(1) + text[opener.end() :]
    if closer and text.count("`", 0, closer.start()) % 2 == 0:
        return text[: closer.start()]
    return text


def strip_prefixes(text: str) -> str:
    """Timestamps, log levels, rank and process labels, glog / c10 / absl headers off the start
    (up to MAX_PREFIXES of them), and the leading blanks."""
    text = text.lstrip()
    for _ in range(MAX_PREFIXES):
        m = _PREFIX.match(text)
        if not m or not m.group(0):
            break
        rest = text[m.end() :].lstrip()
        if not rest:  # a bare label with nothing after it stays what it is
            break
        text = rest
    return text


def as_logged(text: str) -> str:
    """The line as its logger wrote it: the times and rank labels that a platform (`docker logs
    -t`, `kubectl logs --timestamps`, CloudWatch), a launcher (torchrun's `--tee`) or an indenting
    paste put in front of it off, its own level and header kept (whether it is informational is
    read from them)."""
    return _ADDED.sub("", text, count=1).lstrip()


def windows_paths(text: str) -> str:
    """Backslashes in Windows paths as forward slashes (only on a line that has such a path)."""
    return _WIN_PATH.sub("/", text) if _HAS_WIN_PATH.search(text) else text


def segments(line: str) -> list[str]:
    """A line's carriage-return segments (a progress bar redrawn in place), and the text a bar
    runs into when it was not ended, as separate pieces; blank ones dropped, in order (a piece
    that is only colour codes, as a coloured bar's closing reset, is blank, and so is one that is
    only the backtick closing a bar pasted as inline code)."""
    out: list[str] = []
    for part in line.split("\r"):
        out.extend(p for p in _BAR_END.split(part) if decolour(p).strip().strip("`"))
    return out or [line]


def surface(segment: str) -> str:
    """A segment with colour codes, control bytes and quote marks off (prefixes kept), and the
    HTML entities a page's source or a scraper leaves (`&lt;class 'x'&gt;`) read as characters."""
    text = decolour(segment)
    if _ENTITY.search(text):  # before the quote marks: an escaped `&gt; ` is one
        text = html.unescape(text)
    return unquote(text).rstrip()


def normalise(segment: str) -> str:
    """What a segment says: surface() with the prefixes off and Windows paths in `/` form."""
    return windows_paths(strip_prefixes(surface(segment)))


def primary(line: str) -> str:
    """The main reading of a line: its last carriage-return segment, normalised."""
    return normalise(segments(line)[-1])


def _wrapped(text: str, nxt: str) -> bool:
    """Whether `nxt` reads as the rest of `text` broken by a terminal or a paste: `text` is long
    and does not end a sentence, and `nxt` does not start a record of its own."""
    return (
        len(text) >= WRAP_MIN_CHARS
        and bool(nxt.strip())
        and not text.rstrip().endswith((".", ":", "!", "?", ")", "]", "}", ";"))
        and not _NEW_RECORD.match(nxt)
    )


def views(lines: Sequence[str]) -> list[View]:
    """Every reading of every line, each line's main one first (see the module docstring)."""
    segs = [segments(line) for line in lines]
    mains = [normalise(s[-1]) for s in segs]
    out: list[View] = []
    for i, pieces in enumerate(segs):
        last = surface(pieces[-1])
        out.append(View(i, mains[i], last))
        for piece in pieces[:-1]:
            out.append(View(i, normalise(piece), surface(piece), primary=False))
        if i + 1 < len(lines) and _wrapped(mains[i], mains[i + 1]):
            head, rest = mains[i].rstrip(), mains[i + 1].lstrip()
            # broken at a blank (rejoined with one) or mid-word (rejoined as is)
            out.append(View(i, head + " " + rest, last, primary=False))
            out.append(View(i, head + rest, last, primary=False))
    return out
