"""The layout says the architecture: dependencies point down only (agent → policies, skills →
runtime), and no two files import each other in a circle. Every import counts, a function's own
imports too: an import deferred for speed is still a dependency."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from conftest import REPO

# Folder → package, as pyproject's package-dir maps them.
ROOTS = {"agent": "agent", "skills": "skills", "policies": "policies", "runtime": "runtime"}
# What each top-level package may import of ours.
ALLOWED = {
    "runtime": {"runtime"},
    "skills": {"skills", "runtime"},
    "policies": {"policies", "skills", "runtime"},
    "agent": {"agent", "policies", "skills", "runtime", "prompts", "examples"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for folder in ROOTS:
        for path in (REPO / folder).rglob("*.py"):
            if "migrations" in path.parts and "versions" in path.parts:
                continue
            rel = path.relative_to(REPO).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out["nightshift." + ".".join(parts)] = path
    return out


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of ours that `path` imports, anywhere in it (TYPE_CHECKING blocks aside:
    they are annotations, not dependencies at run time)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    """Each module of ours and the modules of ours it imports."""
    mods = _modules()
    return {name: _imports(path, name, set(mods)) for name, path in mods.items()}


def _top(name: str) -> str:
    return name.split(".")[1]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return _graph()


def test_dependencies_point_down(graph):
    """runtime imports none of the others; skills and policies never import agent."""
    wrong = sorted(
        f"{a} imports {b}"
        for a, deps in graph.items()
        for b in deps
        if _top(b) not in ALLOWED[_top(a)]
    )
    assert wrong == []


def test_brain_knows_no_door(graph):
    """agent/ is the doors (CLI, TUI, chat, channels, the socket API) around the brain (graph,
    planners, LLM, loop, wiring): a door may import the brain, never the other way round."""
    rooms = sorted(p.name for p in (REPO / "agent").iterdir() if (p / "__init__.py").exists())
    assert rooms == ["brain", "doors"]
    assert sorted(p.name for p in (REPO / "agent").glob("*.py")) == ["__init__.py"]
    wrong = sorted(
        f"{a} imports {b}"
        for a, deps in graph.items()
        if a.startswith("nightshift.agent.brain")
        for b in deps
        if b.startswith("nightshift.agent.doors")
    )
    assert wrong == []


def test_runtime_has_rooms():
    """runtime/ is a few shared modules and a folder per concern, not one flat room."""
    flat = sorted(p.name for p in (REPO / "runtime").glob("*.py") if p.name != "__init__.py")
    rooms = sorted(p.name for p in (REPO / "runtime").iterdir() if (p / "__init__.py").exists())
    assert rooms == ["executors", "gpu", "scheduling", "store", "training"]
    assert len(flat) <= 10, flat


@pytest.mark.parametrize("layer", ["runtime", "skills", "policies", "agent"])
def test_no_file_circles(graph, layer):
    """No two files import each other, directly or round a longer circle."""
    sub = {
        a: {b for b in deps if _top(b) == layer} for a, deps in graph.items() if _top(a) == layer
    }
    try:
        TopologicalSorter(sub).prepare()
    except CycleError as exc:
        pytest.fail(f"a circle of imports: {' -> '.join(exc.args[1])}")
