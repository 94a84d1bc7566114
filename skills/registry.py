"""Which skills exist: the built-ins (skills/builtin.py) plus those installed packages declare
under the entry-point group `nightshift.skills`."""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from nightshift.runtime.errors import ConfigError, UnknownSkill
from nightshift.skills.base import Skill
from nightshift.skills.builtin import BUILTINS, MODULE_OF, builtin, builtins


def registry() -> dict[str, Skill]:
    """The built-in skills (an explicit table, skills/builtin.py) plus installed packages'
    `nightshift.skills` entry points. An entry point may add a skill, never replace one: a name
    that is a built-in's or another entry point's is refused, naming the package, because a
    replacement could declare a weaker capability and slip past the policy."""
    return {**builtins(), **_added()}


def _added() -> dict[str, Skill]:
    """The entry points' skills, each checked against the built-ins' names (no import of theirs)."""
    found: dict[str, Skill] = {}
    for obj, where in _entry_point_skills():
        built_in = obj.name in MODULE_OF or obj.name in BUILTINS
        if built_in or obj.name in found:
            clash = "a built-in skill" if built_in else "another package's skill"
            raise ConfigError(
                f"the installed entry point {where} declares skill '{obj.name}', which is {clash}: "
                "refused (an entry point may add skills, not replace them); uninstall that "
                "package or rename its skill"
            )
        found[obj.name] = obj
    return found


@cache
def _entry_point_skills() -> tuple[tuple[Skill, str], ...]:
    """Scanned once per process: walking the installed distributions costs milliseconds."""
    out = []
    for ep in entry_points(group="nightshift.skills"):
        obj = ep.load()
        if isinstance(obj, Skill):
            dist = ep.dist.name if ep.dist is not None else "?"
            out.append((obj, f"'{ep.name} = {ep.value}' of {dist}"))
    return tuple(out)


def find_skill(name: str) -> Skill | None:
    """The skill `name`, or None; a built-in's module is the only one imported (a call needs
    its own skill, not every skill's dependencies)."""
    added = _added()
    return builtin(name) or added.get(name)


def get_skill(name: str) -> Skill:
    found = find_skill(name)
    if found is None:
        names = sorted({*MODULE_OF, *BUILTINS, *_added()})
        raise UnknownSkill(
            f"no skill named '{name}'; `nightshift skills` lists them ({', '.join(names)})"
        )
    return found
