"""The prompt one planning step sends, measured: a chat goal answered by list_jobs,
gpu_health_check, show_job 1, job_logs 1 and finish, through the real client, graph and store
against the scripted server; per step, the tokens as that server counts them (the JSON of
messages and tools / 4: no tokenizer is at hand offline) and the characters of the system
prompt, the tools and the conversation. It uses only what the planner had before issue 32, so
the same file measures an older tree (docs/benchmarks.md, "The model door for small models").

    python -m nightshift.evals.prompt_size [--all-tools]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from langgraph.checkpoint.memory import InMemorySaver

from nightshift.agent.brain.goals import Goal
from nightshift.agent.brain.graph import build_graph
from nightshift.agent.brain.llm import LLMPlanner
from nightshift.agent.brain.wiring import Wiring
from nightshift.evals.openai_stub import StubServer, reply_tools, tool_call
from nightshift.runtime.config import LlmSettings

CALLS = [
    ("list_jobs", {}),
    ("gpu_health_check", {}),
    ("show_job", {"job_id": 1}),
    ("job_logs", {"job_id": 1}),
    ("finish", {"ok": True, "summary": "all fine"}),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nightshift.evals.prompt_size")
    ap.add_argument("--all-tools", action="store_true", help="llm.all_tools (large models)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NIGHTSHIFT_HOME"] = str(Path(tmp) / "home")
        w = Wiring.load()
        with StubServer([reply_tools(tool_call(n, a)) for n, a in CALLS]) as srv:
            extra = {"all_tools": True} if args.all_tools else {}
            llm = LlmSettings(base_url=srv.base_url, model="m", max_retries=0, **extra)
            w.settings = w.settings.model_copy(update={"llm": llm})
            graph = build_graph(
                w, LLMPlanner.from_settings(w.settings), checkpointer=InMemorySaver()
            )
            goal = Goal(
                name="g", goal="chat", planner="llm", text="What is running, and are the GPUs ok?"
            )
            graph.invoke(
                {"goal": goal.model_dump(mode="json"), "history": []},
                {"configurable": {"thread_id": "t"}, "recursion_limit": 100},
            )
            for i, req in enumerate(srv.chat_requests, 1):
                tools, msgs = req.get("tools") or [], req["messages"]
                total = json.dumps([msgs, tools], default=str)
                print(
                    f"step {i}: {len(total) // 4:6d} tokens (scripted server's count), "
                    f"{len(total):6d} chars: system {len(msgs[0]['content'])}, "
                    f"{len(tools)} tools {len(json.dumps(tools))}, "
                    f"conversation {len(json.dumps(msgs[1:]))}"
                )
        w.store.engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
