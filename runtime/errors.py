"""One error tree, grouped by who must act next. The CLI prints any of these as one clear line."""

from __future__ import annotations


class NightshiftError(Exception):
    """Base of every error nightshift raises on purpose."""

    exit_code = 1


# The operator (the person running nightshift) must fix something -------------------------------
class OperatorError(NightshiftError):
    """A configuration, file or environment problem that the operator must fix."""

    exit_code = 2


class ConfigError(OperatorError):
    """The configuration file or an environment override is invalid."""


class StoreError(OperatorError):
    """The store cannot be opened or written (locked, read-only, wrong URL)."""


class SpecError(OperatorError):
    """A user file (spec, goal, inventory) is invalid; the message names the field, line and fix."""

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None,
                 line: int | None = None):
        self.path, self.field, self.line = path, field, line
        where = path or "<input>"
        if line is not None:
            where += f":{line}"
        prefix = f"{where}: " + (f"field '{field}': " if field else "")
        super().__init__(prefix + message)


class UnknownSkill(OperatorError):
    """No skill is registered under that name."""


# The planner (a model or a goal file) must retry with better arguments --------------------------
class SkillInputError(NightshiftError):
    """Arguments failed the skill's input model; the planner should retry with better ones."""

    exit_code = 2


# The skill ran and could not do its job ---------------------------------------------------------
class SkillFailed(NightshiftError):
    """The skill ran and failed; the failure is reported, not retried blindly."""


# A human decided, or must decide -----------------------------------------------------------------
class PolicyDenied(NightshiftError):
    """The policy forbids this call for this principal; nothing ran."""

    exit_code = 3


class ApprovalRejected(NightshiftError):
    """A human rejected the call, or its approval expired; nothing ran."""

    exit_code = 3


class Paused(NightshiftError):
    """The kill switch is on: only read skills run until `nightshift resume`."""

    exit_code = 3
