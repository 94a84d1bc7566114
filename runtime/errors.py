"""One error tree, grouped by who must act next; each branch has its own exit code.

    BadArguments      2  the caller (planner, goal file, person typing) retries with better input
    Refused           3  the policy said no (deny, kill switch, a rejected or expired approval)
    ApprovalRequired  4  a human must decide; the call is parked under an approval id
    CallInProgress    4  parked as well, no human asked: another process is carrying it out
    OperatorError     5  the operator fixes the configuration, the store or the environment
    SkillFailed       1  the skill ran and could not do its job

The CLI prints any of these as one line and exits with its code; the agent's planner reads the
branch, never the code, to decide whether to retry, wait or give up.
"""

from __future__ import annotations


class NightshiftError(Exception):
    """Base of every error nightshift raises on purpose."""

    exit_code = 1


# The caller must retry with better arguments ----------------------------------------------------
class BadArguments(NightshiftError):
    """Arguments failed the skill's input model, or name something that does not exist."""

    exit_code = 2


class SpecError(BadArguments):
    """A user file (spec, goal, inventory) is invalid; the message names the field, line and fix."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        field: str | None = None,
        line: int | None = None,
    ):
        self.path, self.field, self.line = path, field, line
        where = path or "<input>"
        if line is not None:
            where += f":{line}"
        prefix = f"{where}: " + (f"field '{field}': " if field else "")
        super().__init__(prefix + message)


class UnknownSkill(BadArguments):
    """No skill is registered under that name."""


class UnknownJob(BadArguments):
    """No job has that id."""


class UnknownApproval(BadArguments):
    """No approval has that id."""


class NotReproducible(BadArguments):
    """A strict reproduction refused: today's packages or data differ from those recorded."""


# The policy refused ------------------------------------------------------------------------------
class Refused(NightshiftError):
    """The policy refused the call; nothing ran."""

    exit_code = 3


class PolicyDenied(Refused):
    """The policy forbids this call for this principal, or an approval does not match the call."""


class ApprovalRejected(Refused):
    """A human rejected the call, or its approval expired."""


class Paused(Refused):
    """The kill switch is on: only read skills run until `nightshift resume`."""


# A human must decide -----------------------------------------------------------------------------
class ApprovalRequired(NightshiftError):
    """The call waits for a human decision under `approval_id`; approving it lets it run once."""

    exit_code = 4

    def __init__(
        self, message: str, *, approval_id: int, call_id: str, skill: str, quorum: int, rule: str
    ):
        self.approval_id, self.call_id, self.skill = approval_id, call_id, skill
        self.quorum, self.rule = quorum, rule
        super().__init__(message)


class CallInProgress(NightshiftError):
    """Another live process holds the claim on this approved call and has not finished it within
    the caller's deadline. Like ApprovalRequired, the call is parked under `approval_id` and
    calling again with `call_id` takes it up (its result, once recorded); but no human is asked."""

    exit_code = 4

    def __init__(self, message: str, *, approval_id: int, call_id: str, skill: str):
        self.approval_id, self.call_id, self.skill = approval_id, call_id, skill
        super().__init__(message)


# The operator must fix something ------------------------------------------------------------------
class OperatorError(NightshiftError):
    """A configuration, store or environment problem that the operator must fix."""

    exit_code = 5


class ConfigError(OperatorError):
    """The configuration file or an environment override is invalid."""


class StoreError(OperatorError):
    """The store cannot be opened or written (locked, read-only, wrong URL, unknown schema)."""


class StoreFull(StoreError):
    """The disk (or quota) under the store is full: nothing more is written until space is freed."""


class StoreLocked(StoreError):
    """Another process held the store's write lock past store.busy_timeout_s."""


class StoreGone(StoreError):
    """The store file was deleted or replaced under this process; it will not open a new one."""


class StoreUnavailable(StoreError):
    """The store's database server refused, lost or closed the connection: wait and retry."""


class DiskFull(OperatorError):
    """A file nightshift writes (a log, a checkpoint, the audit anchor) hit a full or read-only disk."""


class CallInDoubt(StoreError):
    """The store failed after a call started: it may have taken effect; repeat it with its call id."""

    def __init__(self, message: str, *, call_id: str, job_ids: list[int] | None = None):
        self.call_id, self.job_ids = call_id, job_ids or []
        super().__init__(message)


# The skill ran and could not do its job ---------------------------------------------------------
class SkillFailed(NightshiftError):
    """The skill ran and failed; the failure is reported, not retried blindly."""
