"""The everyday requests, understood without a model: one small deterministic parser, English
and Chinese, in front of the chat's model path (agent/doors/chat.py).

Why a parser and not the model: a lab's small model rarely turns "what is running?" or
"任务 3 为什么失败" into the right tool call, and a request a person types should work without any
model. Why so strict: a request is claimed only when EVERY word of it is understood — a known
verb, a job id, a spec file, a polite filler — so "why did job 12 fail, and fix it" or "cancel
whatever is stuck" is not half-read; it goes to the model (or gets the no-model message). A
negation ("don't cancel job 3", "不要取消") is never claimed either. A verb that changes something
(cancel, hold, retry, submit, approve, …) is the only way to an acting intent: no other word, no
number and no job name yields one.

The parser only reads the person's own text. Job names and log lines never pass through it:
they are data, shown, never obeyed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

Kind = Literal[
    "status",
    "health",
    "cost",
    "why",
    "logs",
    "show",
    "submit",
    "hold",
    "release",
    "cancel",
    "retry",
    "approve",
    "reject",
]
# Intents that change something: reached only through one of their own verbs.
ACTING: frozenset[str] = frozenset(
    {"submit", "hold", "release", "cancel", "retry", "approve", "reject"}
)
# Intents about one job; without a job named, the chat asks which (or takes the only one).
NEEDS_JOB: frozenset[str] = frozenset({"why", "logs", "show", "hold", "release", "cancel", "retry"})
NEEDS_APPROVAL: frozenset[str] = frozenset({"approve", "reject"})
MAX_TEXT = 500  # longer than any everyday request: the model's, or the no-model message


class Intent(BaseModel):
    """One understood request: what to do and with what, as the person said it (ids unchecked:
    the chat grounds them in the store before anything runs)."""

    model_config = ConfigDict(frozen=True)

    kind: Kind
    job_id: int | None = None
    name: str | None = None  # words that may name a job ("why did resnet fail")
    approval_id: int | None = None
    path: str | None = None  # submit's spec file, as typed
    cheap: bool = False  # "tonight", "when power is cheap", 电价便宜时: cost_sensitive
    after: int | None = None  # "after job N", 任务 N 之后
    lines: int | None = None  # "last 20 lines", 最后 20 行
    mine: bool = False  # "my job", 我的任务
    states: tuple[str, ...] = ()  # "the failed job", 在跑的任务: which jobs are meant


class Choice(BaseModel):
    """An answer to the chat's question "Which job?": an id, a position in the list, or a name."""

    model_config = ConfigDict(frozen=True)

    number: int | None = None
    ordinal: int | None = None
    name: str | None = None


# ------------------------------------------------------------------------------------ lexicon
# A word's tag: `v:KIND` a verb of that intent; `w:show` a weak one (loses to any verb);
# `s:STATE` a job state; `pv` a verb that submits only with a spec file (run, queue, 跑);
# `gpu`, `job`, `approval` nouns; `cheap`, `after`, `lines`, `my`, `neg`, `fill`, `ord:N`.
_EN: dict[str, str] = {}
_ZH: dict[str, str] = {}


def _add(table: dict[str, str], tag: str, words: str) -> None:
    for w in words.split():
        table[w] = tag


_add(_EN, "v:status", "status statuses list overview")
_add(_EN, "v:health", "health healthy temperature temperatures temp temps ecc xid")
_add(_EN, "v:cost", "cost costs spend spent paid pay bill price expensive money kwh")
_add(_EN, "v:why", "why reason cause diagnose diagnosis explain wrong")
_add(_EN, "v:logs", "log logs output stdout stderr tail")
_add(_EN, "w:show", "show see display detail details info about check look view describe tell")
_add(_EN, "v:submit", "submit enqueue schedule")
_add(_EN, "pv", "run queue launch start train")
_add(_EN, "v:hold", "hold pause suspend stop halt park")
_add(_EN, "v:release", "release resume unpause unhold continue")
_add(_EN, "v:cancel", "cancel kill abort terminate")
_add(_EN, "v:retry", "retry rerun restart requeue")
_add(_EN, "v:approve", "approve accept grant")
_add(_EN, "v:reject", "reject deny decline refuse veto")
_add(_EN, "s:running", "running active")
_add(_EN, "s:queued", "queued waiting")
_add(_EN, "s:failed", "fail fails failed failing crash crashed crashes die died dies broke")
_add(_EN, "s:paused", "paused")
_add(_EN, "s:held", "held")
_add(_EN, "s:succeeded", "succeeded succeeds finished finishes finish done completes completed")
_add(_EN, "gpu", "gpu gpus card cards nvidia")
_add(_EN, "job", "job jobs task tasks runs experiment experiments training")
_add(_EN, "approval", "approval approvals request requests")
_add(_EN, "cheap", "tonight overnight cheap cheaper cheapest off-peak offpeak")
_add(_EN, "after", "after once")
_add(_EN, "lines", "lines line")
_add(_EN, "my", "my mine our i")
_add(_EN, "neg", "not no never dont cannot")
_add(
    _EN,
    "fill",
    "please pls plz kindly could can would will you me us we the a an of for to on in at is "
    "are was were be been did do does has have had what what's whats which how it its it's "
    "this that these those there now right currently current all number id with and so hey hi "
    "thanks thank just last latest recent night yesterday when power electricity much "
    "going happening up on let let's lets get got give one ones quick quickly whole full "
    "some any your s 's",
)

_add(_ZH, "v:status", "状态 进度 列表 情况 概况")
_add(_ZH, "v:health", "健康 温度 体检")
_add(_ZH, "v:cost", "花了多少 花费 多少钱 费用 成本 电费 花了 开销 花销")
_add(_ZH, "v:why", "为什么 为啥 原因 怎么回事 诊断")
_add(_ZH, "v:logs", "日志 输出")
_add(_ZH, "w:show", "看看 看下 看一下 查看 显示 详情 详细 信息 看")
_add(_ZH, "v:submit", "提交 排进队列 加入队列")
_add(_ZH, "pv", "跑 运行 启动 训练")
_add(_ZH, "v:hold", "暂停 挂起 停一下 先停 停止 停掉 停下")
_add(_ZH, "v:release", "恢复 继续 放行 释放 解除暂停")
_add(_ZH, "v:cancel", "取消 终止 杀掉 杀死 干掉 删掉 删除")
_add(_ZH, "v:retry", "重试 重跑 重新跑 再跑 再试 重新运行")
_add(_ZH, "v:approve", "批准 同意 通过 准了 批了")
_add(_ZH, "v:reject", "拒绝 驳回 否决 不批准 不同意 不通过")
_add(_ZH, "s:running", "在跑 在运行 运行中 正在跑 正在运行 跑着")
_add(_ZH, "s:queued", "排队 排队中 等待中")
_add(_ZH, "s:failed", "失败 挂了 挂掉 崩了 崩溃 出错 报错")
_add(_ZH, "s:succeeded", "完成 跑完 结束")
_add(_ZH, "gpu", "显卡 gpu")
_add(_ZH, "job", "任务 作业 训练任务 实验")
_add(_ZH, "approval", "审批 申请 请求")
_add(_ZH, "cheap", "今晚 今天晚上 晚上 夜里 夜间 电价便宜 电费便宜 便宜 低谷 谷时 电价低")
_add(_ZH, "after", "之后 以后 后")
_add(_ZH, "lines", "行")
_add(_ZH, "my", "我的 我")
_add(_ZH, "neg", "不要 别 不 没 没有 勿")
_add(
    _ZH,
    "fill",
    "请 帮我 帮忙 麻烦 一下 下 吗 呢 吧 啊 了 的 现在 目前 当前 有 哪些 哪个 什么 把 给我 给 个 "
    "时 时候 的时候 在 等 那个 这个 它 号 最后 最近 最新 昨晚 昨天晚上 昨天 昨夜 一共 总共 多少 是 "
    "都 还 你 能 可以 条 电价 电",
)
_ZH_LONGEST = max(len(w) for w in _ZH)

_CN_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4}
_CN_DIGITS |= {"五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_CN_UNITS = {"十": 10, "百": 100, "千": 1000, "万": 10_000}
_CN_NUMERAL = set(_CN_DIGITS) | set(_CN_UNITS)
_EN_ORDINALS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6}
_EN_ORDINALS |= {"seventh": 7, "eighth": 8, "ninth": 9, "tenth": 10}

_FULL_WIDTH = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)} | {0x3000: 0x20}
_TOKEN = re.compile(
    r"(?P<path>(?:~|\.{1,2})?/?[A-Za-z0-9_.~/+@-]*[A-Za-z0-9_]\.(?:ya?ml|json)(?![A-Za-z0-9_])"
    r"|(?:~|\.{1,2})?/[A-Za-z0-9_.~/+@-]+)"
    r"|(?P<num>\#?[0-9]+)"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_-]*(?:'[A-Za-z]+)?)"
    r"|(?P<cjk>[\u3400-\u9fff]+)"
    r"|(?P<other>\S)"
)
_PUNCT = set("?!.,;:'\"()[]{}<>-—…。、，？！：；「」『』【】《》～·")


@dataclass(frozen=True)
class Token:
    tag: str  # a lexicon tag, or num | path | word (not understood)
    text: str
    value: int = 0


def normalize(text: str) -> str:
    """Full-width forms (２, ＃, ？) as their ASCII twins; nothing else changes (² stays ²)."""
    return text.translate(_FULL_WIDTH)


def cn_number(text: str) -> int | None:
    """三 → 3, 十二 → 12, 二十 → 20, 一百零五 → 105; None for what is not one."""
    if not text or any(c not in _CN_NUMERAL for c in text):
        return None
    total, section, digit = 0, 0, None
    for c in text:
        if c in _CN_DIGITS:
            if digit is not None:  # 一二 is not a number
                return None
            digit = _CN_DIGITS[c]
        else:
            unit = _CN_UNITS[c]
            if unit == 10_000:
                total += (section + (digit or 0)) * unit
                section = 0
            else:
                section += (1 if digit is None else digit) * unit
            digit = None
    return total + section + (digit or 0)


def tokenize(text: str) -> list[Token]:
    """The words of a request, each with its tag; what the lexicon does not know is `word`."""
    text = normalize(text)
    text = re.sub(r"(?i)\b(jobs?|#)(?=[0-9])", r"\1 ", text)
    out: list[Token] = []
    for m in _TOKEN.finditer(text):
        kind, raw = m.lastgroup, m.group()
        if kind == "path":
            out.append(Token("path", raw))
        elif kind == "num":
            out.append(Token("num", raw, int(raw.lstrip("#"))))
        elif kind == "word":
            word = raw.lower()
            tag = _EN.get(word)
            if tag is None and word.endswith("n't"):
                tag = "neg"
            if tag is None and word in _EN_ORDINALS:
                tag = f"ord:{_EN_ORDINALS[word]}"
            out.append(Token(tag or "word", word))
        elif kind == "cjk":
            out.extend(_segment(raw))
        else:
            out.append(Token("fill" if raw in _PUNCT else "word", raw))
    return out


def _segment(run: str) -> list[Token]:
    """A run of Chinese characters, longest known phrase first; numerals become numbers."""
    out: list[Token] = []
    i = 0
    while i < len(run):
        j = i
        while j < len(run) and run[j] in _CN_NUMERAL:
            j += 1
        value = cn_number(run[i:j]) if j > i else None
        size = next(
            (n for n in range(min(_ZH_LONGEST, len(run) - i), 0, -1) if run[i : i + n] in _ZH), 0
        )
        if value is not None and j - i >= size:  # 十二 a number; 一下 a filler
            out.append(Token("num", run[i:j], value))
            i = j
        elif size:
            out.append(Token(_ZH[run[i : i + size]], run[i : i + size]))
            i += size
        else:
            if run[i] == "第":  # 第二个: an ordinal
                j = i + 1
                while j < len(run) and run[j] in _CN_NUMERAL:
                    j += 1
                n = cn_number(run[i + 1 : j])
                if n is not None:
                    out.append(Token(f"ord:{n}", run[i:j]))
                    i = j
                    continue
            out.append(Token("word", run[i]))
            i += 1
    return out


# ------------------------------------------------------------------------------------ parse
def parse(text: str) -> Intent | None:
    """The request as an Intent, or None: not every word understood, two verbs, a negation —
    the model's (or the no-model message's) to answer."""
    if len(text) > MAX_TEXT:
        return None
    toks = tokenize(text)
    verbs: list[str] = []
    weak: list[str] = []
    states: list[str] = []
    numbers: list[int] = []
    paths: list[str] = []
    unknown: list[str] = []
    flags: set[str] = set()
    lines: int | None = None
    for i, t in enumerate(toks):
        if t.tag == "neg":
            return None
        if t.tag == "num":
            if i + 1 < len(toks) and toks[i + 1].tag == "lines":
                lines = t.value
            else:
                numbers.append(t.value)
        elif t.tag.startswith("v:"):
            verbs.append(t.tag[2:])
        elif t.tag.startswith("w:"):
            weak.append(t.tag[2:])
        elif t.tag.startswith("s:"):
            states.append(t.tag[2:])
        elif t.tag == "path":
            paths.append(t.text)
        elif t.tag == "word" or t.tag.startswith("ord:"):
            unknown.append(t.text)
        elif t.tag in ("pv", "gpu", "cheap", "after", "my", "lines", "approval", "job"):
            flags.add(t.tag)
    if "pv" in flags and paths:
        verbs.append("submit")
    kinds = set(verbs)
    if "gpu" in flags and kinds <= {"status"}:
        kinds = {"health"}
    if len(kinds) > 1:
        return None
    if kinds:
        kind = kinds.pop()
    elif weak or states:
        # "show me job 3" → show; "show me what is running" / "what failed" → status
        kind = "show" if numbers or unknown or not states else "status"
    else:
        return None
    if kind == "status" and len(numbers) == 1 and not (unknown or paths):
        kind = "show"  # "status of job 3"
    return _complete(kind, numbers, paths, unknown, states, flags, lines)


def _complete(
    kind: str,
    numbers: list[int],
    paths: list[str],
    unknown: list[str],
    states: list[str],
    flags: set[str],
    lines: int | None,
) -> Intent | None:
    """The intent with its arguments, if what was said fits it: a spec file only for submit,
    "tonight"/"after" only for submit, "N lines" only for logs, a name only where no id is."""
    modifiers = flags & {"cheap", "after"}
    if lines is not None and kind != "logs":
        return None
    if kind == "submit":
        if len(paths) != 1 or unknown or (states and "after" not in flags):
            return None
        after = None
        if "after" in flags:
            if len(numbers) != 1:
                return None
            after = numbers[0]
        elif numbers:
            return None
        return Intent(kind="submit", path=paths[0], cheap="cheap" in flags, after=after)
    if paths or modifiers or ("approval" in flags and kind not in NEEDS_APPROVAL):
        return None
    if kind in NEEDS_JOB:
        if len(numbers) > 1 or (numbers and unknown):
            return None
        return Intent(
            kind=kind,  # type: ignore[arg-type]
            job_id=numbers[0] if numbers else None,
            name=" ".join(unknown) if unknown else None,
            lines=lines,
            mine="my" in flags,
            states=tuple(dict.fromkeys(states)),
        )
    if kind in NEEDS_APPROVAL:
        # "approve job 3" may mean the approval about job 3, not approval 3: not guessed
        if len(numbers) > 1 or unknown or states or "job" in flags:
            return None
        return Intent(kind=kind, approval_id=numbers[0] if numbers else None)  # type: ignore[arg-type]
    if numbers or unknown or (states and kind != "status"):
        return None
    return Intent(kind=kind, states=tuple(dict.fromkeys(states)))  # type: ignore[arg-type]


def parse_choice(text: str) -> Choice | None:
    """An answer to "Which job?": `2`, `#2`, `job 2`, `任务 2`, `the second`, `第二个`, or a name.
    None when the text says more than that (then it is a new request)."""
    if len(text) > MAX_TEXT:
        return None
    said = normalize(text).strip().lower()
    m = re.fullmatch(r"(?:the\s+)?([0-9]+)(?:st|nd|rd|th)(?:\s+one)?|第\s*([0-9]+)\s*个?", said)
    if m:
        return Choice(ordinal=int(m.group(1) or m.group(2)))
    toks = tokenize(text)
    numbers = [t.value for t in toks if t.tag == "num"]
    ordinals = [int(t.tag[4:]) for t in toks if t.tag.startswith("ord:")]
    words = [t.text for t in toks if t.tag == "word"]
    rest = [t for t in toks if t.tag not in ("num", "word", "fill", "job", "approval", "my")]
    rest = [t for t in rest if not t.tag.startswith("ord:")]
    if rest or len(numbers) + len(ordinals) + bool(words) != 1:
        return None
    if numbers:
        return Choice(number=numbers[0])
    if ordinals:
        return Choice(ordinal=ordinals[0])
    return Choice(name=" ".join(words))
