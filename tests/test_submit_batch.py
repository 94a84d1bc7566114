"""submit_jobs / Client.submit_many: many jobs as one audited, all-or-nothing decision whose
every item is held to the policy's limits."""

from __future__ import annotations

import pytest
from sqlmodel import select

from nightshift.agent.doors.api import Client
from nightshift.runtime.errors import PolicyDenied, SpecError
from nightshift.runtime.store.db import AuditEvent, Job

from conftest import REPO

SPEC = str(REPO / "examples/specs/quickstart.yaml")


def test_batch_queues_all_with_three_audit_events(home):
    """100 trials: 100 jobs, one verdict, one start, one result; a replay queues nothing more."""
    c = Client()
    items = [{"spec_path": SPEC, "params": {"lr": 0.001 * (i + 1)}} for i in range(100)]
    ids = c.submit_many(items, call_id="sweep-1")
    assert len(ids) == 100
    assert c.submit_many(items, call_id="sweep-1") == ids
    with c.w.store.session() as s:
        assert len(s.exec(select(Job)).all()) == 100
        actions = [e.action for e in s.exec(select(AuditEvent))]
    assert actions.count("skill.start") == 2 and actions.count("policy.verdict") == 2
    assert c.w.audit.verify().ok


def test_one_bad_item_queues_nothing(home, tmp_path):
    """An invalid item fails the batch before any job is stored."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ncommand: python train.py\n")
    c = Client()
    with pytest.raises(SpecError):
        c.submit_many([{"spec_path": SPEC}, {"spec_path": str(bad)}])
    with c.w.store.session() as s:
        assert s.exec(select(Job)).first() is None


def test_every_item_is_held_to_the_limits(home):
    """A batch cannot smuggle a job past the GPU limit."""
    big = {"name": "big", "command": ["python", "t.py"], "resources": {"gpus": 64}}
    with pytest.raises(PolicyDenied, match=r"items\[1\]"):
        Client().submit_many([{"spec_path": SPEC}, {"spec": big}])
