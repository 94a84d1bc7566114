"""Which tools a step offers the model: a handful chosen by the request's intent, not all of
them. Sending every skill's schema cost about 8,000 tokens a step, more than a small model's
whole context; the tools one request needs are a few of one kind.

The intents: look (jobs, GPUs, logs, costs), diagnose (why a job failed, how to fix it),
change (hold, release, cancel, retry, resume a job), submit (new runs, sweeps), approve (an
approval someone asked about), power (GPU power limits), and a few rare ones named outright
(policy, reproduce, container, a corrected diagnosis). Routing is a deterministic keyword match
in English and Chinese over the request, the same words every time; a request that matches
nothing gets the look tools, which answer most questions and change nothing. The tools a
goal's history already used stay offered, so a conversation never loses the tool it was using.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# intent -> the skills it offers, most useful first (a budget drops from the end)
INTENT_TOOLS: dict[str, tuple[str, ...]] = {
    "look": ("list_jobs", "show_job", "job_logs", "gpu_health_check"),
    "diagnose": ("show_job", "job_logs", "diagnose_failure", "list_jobs", "tune_lr", "auto_resume"),
    "change": (
        "list_jobs",
        "show_job",
        "pause_job",
        "release_job",
        "cancel_job",
        "retry_job",
        "resume_job",
    ),
    "submit": ("config_validator", "submit_job", "list_jobs", "gpu_health_check", "submit_jobs"),
    "sweep": ("start_sweep", "stop_sweep", "list_jobs", "config_validator"),
    "approve": ("list_jobs", "show_job"),
    "power": ("show_power_limits", "set_power_limit", "gpu_health_check"),
    "compare": ("compare_jobs", "list_jobs", "show_job"),
    "policy": ("apply_policy",),
    "reproduce": ("reproduce_job", "show_job", "list_jobs"),
    "container": ("launch_container", "gpu_health_check"),
    "correct": ("correct_diagnosis", "show_job", "job_logs"),
}

# fmt: off
# intent -> words that show it (lower case; a Chinese word matches anywhere in the text). The
# order is the order of their tools: the specific intents (change a job, submit) before the
# broad ones (diagnose, look), so a budget that drops tools from the end keeps what was asked.
INTENT_WORDS: dict[str, tuple[str, ...]] = {
    "change": (
        "cancel", "stop", "kill", "hold", "pause", "release", "retry", "rerun", "resume",
        "restart", "unhold", "abort", "取消", "停止", "停掉", "暂停", "恢复", "重试", "重跑", "继续", "释放",
    ),
    "submit": (
        "submit", "train", "launch", "queue up", "start a", "run ", "spec", ".yaml", ".yml",
        "tonight", "cheap", "after job", "提交", "训练", "启动", "今晚", "便宜",
    ),
    "sweep": (
        "sweep", "search", "optuna", "trials", "超参", "搜索",
    ),
    "compare": (
        "compare", "versus", " vs ", "side by side", "对比", "比较",
    ),
    "power": (
        "power limit", "watts", "power cap", "功耗", "功率",
    ),
    "reproduce": (
        "reproduce", "reproducible", "复现",
    ),
    "container": (
        "container", "docker", "容器",
    ),
    "correct": (
        "misdiagnos", "wrong category", "correct the diagnosis", "诊断错",
    ),
    "policy": (
        "policy", "策略",
    ),
    "approve": (
        "approve", "approval", "reject", "approvals", "批准", "审批", "拒绝",
    ),
    "diagnose": (
        "why", "fail", "failed", "failure", "crash", "crashed", "died", "die", "error", "oom",
        "nan", "diagnose", "broke", "fix", "wrong", "为什么", "失败", "挂了", "崩溃", "报错", "错误", "诊断",
        "原因", "修复",
    ),
    "look": (
        "status", "running", "queue", "queued", "list", "show", "logs", "log", "gpu", "gpus",
        "health", "hot", "temperature", "memory", "cost", "costs", "energy", "last night",
        "what is", "how is", "how are", "状态", "在跑", "运行", "任务", "队列", "日志", "显卡", "健康", "温度",
        "显存", "花费", "费用", "电费", "昨晚", "查看", "看看",
    ),
}
# fmt: on

DEFAULT_INTENT = "look"

# fmt: off
# Words that name one tool outright: that tool goes first ("cancel job 2": cancel_job, not
# whatever else the change intent offers).
WORD_TOOLS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("cancel", "abort", "kill", "取消", "停掉"), "cancel_job"),
    (("hold", "pause", "暂停"), "pause_job"),
    (("release", "unhold", "释放"), "release_job"),
    (("retry", "rerun", "重试", "重跑"), "retry_job"),
    (("resume", "恢复", "继续"), "resume_job"),
    (("log", "logs", "日志"), "job_logs"),
    (("compare", "versus", "对比", "比较"), "compare_jobs"),
    (("valid", "validate", "check the spec", "校验"), "config_validator"),
    (("submit", "提交", "tonight", "今晚"), "submit_job"),
    (("gpu", "gpus", "hot", "temperature", "显卡", "温度", "显存"), "gpu_health_check"),
    (("power limit", "power limits", "功耗", "功率"), "show_power_limits"),
    (("diagnose", "诊断"), "diagnose_failure"),
)
# fmt: on


def intents(text: str) -> list[str]:
    """The intents `text` shows, in the order of INTENT_WORDS; [look] when none does."""
    return matched(text) or [DEFAULT_INTENT]


def matched(text: str) -> list[str]:
    """The intents whose words `text` has (none: a greeting, or words no intent knows)."""
    low = " " + re.sub(r"\s+", " ", text.lower()) + " "
    return [i for i, words in INTENT_WORDS.items() if any(_has(low, w) for w in words)]


def _has(text: str, word: str) -> bool:
    if not word.isascii() or not word.strip().isalnum():
        return word in text  # Chinese, or a phrase with spaces or punctuation
    return re.search(rf"(?<![a-z0-9_]){re.escape(word)}(?![a-z0-9_])", text) is not None


def route(text: str, used: Iterable[str] = (), known: Iterable[str] | None = None) -> list[str]:
    """The skills to offer for `text`, most useful first: those the history `used`, those a
    word names outright, then each intent's in turn (interleaved, so a budget that keeps the
    first few keeps some of every intent); only skills in `known` (the registry) when given."""
    allowed = set(known) if known is not None else None
    low = " " + re.sub(r"\s+", " ", text.lower()) + " "
    named = [tool for words, tool in WORD_TOOLS if any(_has(low, w) for w in words)]
    chosen: list[str] = []
    lists = [INTENT_TOOLS[i] for i in intents(text)]
    for name in [*used, *named, *_interleave(lists)]:
        if name not in chosen and (allowed is None or name in allowed):
            chosen.append(name)
    return chosen


def _interleave(lists: list[tuple[str, ...]]) -> list[str]:
    out: list[str] = []
    for i in range(max((len(x) for x in lists), default=0)):
        out += [x[i] for x in lists if i < len(x)]
    return out
