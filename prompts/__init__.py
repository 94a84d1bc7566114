"""Prompts as files, loaded by name: `load("system")` is `prompts/system.md`.

The text the model reads lives here, not in code. `render(name, **values)` fills `$name`
placeholders (`string.Template`; `$$` is a dollar sign); a value is pasted as it is, never read
as a template itself, so text a user or a log supplies cannot reach into the prompt around it.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from string import Template

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@cache
def load(name: str) -> str:
    """The prompt `name` (a file `name.md` of this package), without surrounding blank lines."""
    if not _NAME.match(name):
        raise ValueError(f"prompt names are lower-case words: {name!r}")
    ref = resources.files(__name__).joinpath(f"{name}.md")
    if not ref.is_file():
        raise FileNotFoundError(f"no prompt named {name!r}: nightshift.prompts has {names()}")
    return ref.read_text(encoding="utf-8").strip()


def render(name: str, **values: str) -> str:
    """The prompt `name` with its `$placeholders` filled; a missing value is a KeyError."""
    return Template(load(name)).substitute(values)


def names() -> list[str]:
    """Every prompt this package holds."""
    return sorted(
        p.name.removesuffix(".md")
        for p in resources.files(__name__).iterdir()
        if p.name.endswith(".md")
    )
