"""The README is what a new user copies: its config example must load, and CI must run exactly
its test command."""

from __future__ import annotations

from nightshift.runtime.config import load_settings

from conftest import REPO

README = (REPO / "README.md").read_text()


def test_config_example_loads(home):
    """The configuration block in the README is valid as written."""
    block = README.split("```yaml\ngpu:")[1].split("```")[0]
    (home / "config.yaml").write_text("gpu:" + block)
    settings = load_settings()
    assert settings.tariff is not None and [w.name for w in settings.tariff.windows] == [
        "valley",
        "shoulder",
        "peak",
    ]
    assert settings.scheduler.preempt_margin == 2 and settings.scheduler.order == "srpt"


def test_ci_runs_the_readme_test_command():
    """`.ci/run` ends with the README's second command, character for character."""
    test_cmd = next(
        line
        for line in README.splitlines()
        if line.startswith("python3 -m venv") and "pytest" in line
    )
    ci_lines = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci_lines[-1] == test_cmd


def test_channels_example_loads(home):
    """The channels block of the README loads as settings, and its policy block as a policy."""
    from nightshift.policies.model import load_policy

    block = README.split("```yaml\n# config.yaml: the ids")[1].split("```")[0].partition("\n")[2]
    (home / "config.yaml").write_text(block)
    settings = load_settings()
    assert settings.channels.slack.approvals_channel == "C0123456789"
    assert settings.channels.wechat.agent_id == 1000002
    policy = README.split("```yaml\n# policy.yaml\n")[1].split("```")[0]
    (home / "policy.yaml").write_text(
        "version: 1\nroles: {operator: {capabilities: [read, destroy], can_approve: true}, "
        "reader: {capabilities: [read]}}\nlocal_user_principal: null\n" + policy
    )
    loaded = load_policy(home / "policy.yaml")
    assert loaded.principals["alice"].slack_id == "U024BE7LH"
    assert loaded.approvals[0].quorum == 2


def test_the_skill_table_lists_every_skill_with_its_capability():
    """README "How a goal runs" lists the registry's skills, each with its capability, and no
    skill that does not exist."""
    import re

    from nightshift.skills.registry import registry

    text = (REPO / "README.md").read_text(encoding="utf-8")
    table = text[text.index("| skill | capability |") : text.index("## Chat")]
    listed = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) >= 2:
            for name in re.findall(r"`(\w+)`", cells[0]):
                listed[name] = cells[1]
    assert listed == {name: s.capability for name, s in registry().items()}


def test_the_graph_is_the_shape_the_readme_draws(home):
    """The README's drawing of the graph is the compiled graph's edges, no more, no fewer."""
    from langgraph.checkpoint.memory import InMemorySaver

    from nightshift.agent.brain.graph import build_graph
    from nightshift.agent.brain.planner import DeterministicPlanner
    from nightshift.agent.brain.wiring import Wiring

    text = (REPO / "README.md").read_text(encoding="utf-8")
    drawing = text[text.index("START  → plan") :].split("```")[0]
    drawn = set()
    for line in drawing.strip().splitlines():
        source, _, targets = line.partition("→")
        for target in targets.split("  ")[0].split("|"):
            drawn.add((source.strip(), target.strip()))
    graph = build_graph(Wiring.load(), DeterministicPlanner(), checkpointer=InMemorySaver())
    names = {"__start__": "START", "__end__": "END"}
    edges = {
        (names.get(e.source, e.source), names.get(e.target, e.target))
        for e in graph.get_graph().edges
    }
    assert drawn == edges
