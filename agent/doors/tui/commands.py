"""The command palette (ctrl+p): the registry's skills and the chat's direct commands. Choosing
one puts it on the input line to complete; nothing runs until the person sends it."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider

from nightshift.agent.doors.chat import COMMANDS

if TYPE_CHECKING:
    from nightshift.agent.doors.tui.app import ChatApp


def palette_entries() -> list[tuple[str, str, str]]:
    """(label, text put on the input line, help) for every direct command and skill."""
    from nightshift.skills.registry import registry

    entries = [
        (f"chat: {c.usage}", c.usage.split(" ")[0] + " ", c.help)
        for c in COMMANDS.values()
        if c.name not in ("skill",)
    ]
    for skill in sorted(registry().values(), key=lambda s: s.name):
        entries.append(
            (
                f"skill: {skill.name} ({skill.capability})",
                f"skill {skill.name} ",
                skill.description.split("\n")[0][:120],
            )
        )
    return entries


class SkillsProvider(Provider):
    """Skills and direct commands, searchable by name."""

    def _fill(self, text: str) -> None:
        app: ChatApp = self.app  # type: ignore[assignment]
        app.prefill(text)

    async def discover(self) -> Hits:
        for label, text, help_ in palette_entries():
            yield DiscoveryHit(label, partial(self._fill, text), text=label, help=help_)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for label, text, help_ in palette_entries():
            score = matcher.match(label)
            if score > 0:
                yield Hit(
                    score,
                    matcher.highlight(label),
                    partial(self._fill, text),
                    text=label,
                    help=help_,
                )
