"""Least privilege, approvals, the hash-chained audit log and the kill switch.

The gate wraps every skill call; skills themselves never check permissions.
"""

from nightshift.policies.approvals import Approvals, UnknownApproval
from nightshift.policies.audit import AuditLog, VerifyResult
from nightshift.policies.engine import PolicyEngine, Verdict
from nightshift.policies.gate import Gate
from nightshift.policies.killswitch import is_paused, pause, pause_info, resume
from nightshift.policies.model import Policy, load_policy

__all__ = [
    "Approvals",
    "AuditLog",
    "Gate",
    "Policy",
    "PolicyEngine",
    "UnknownApproval",
    "Verdict",
    "VerifyResult",
    "is_paused",
    "load_policy",
    "pause",
    "pause_info",
    "resume",
]
