"""A job's spec has a revision the database's triggers give it (`job.spec_rev`, migration 0021)
on every insert and every update of the spec, a raw edit's too; the loop's snapshot reads a
spec's fields again only when its revision moved (`load_snapshot(spec_fields=...)`). Held here:
the triggers exist at HEAD and move the revision as they should, and a load that keeps fields
between loads is the load that reads them all, through raw edits, new, gone and moved jobs."""

from __future__ import annotations

import json
import random
import sqlite3
from datetime import timedelta
from pathlib import Path

from alembic import command
from alembic.config import Config

from nightshift.evals.bench_scale import NOW, populate
from nightshift.runtime.scheduling.snapshot import SpecFields, load_snapshot
from nightshift.runtime.store.db import Store
from nightshift.runtime.store.migrations import SCRIPT_LOCATION


def _revs(db: Path) -> dict[int, int]:
    return dict(sqlite3.connect(db).execute("select id, spec_rev from job"))


def test_the_triggers_move_a_revision_on_insert_and_on_a_spec_edit_only(tmp_path):
    db = tmp_path / "s.db"
    Store(f"sqlite:///{db}")
    con = sqlite3.connect(db)
    insert = (
        "insert into job (id, name, spec, params, state, priority, owner, max_attempts, "
        "created_at, updated_at) values (?, 'j', ?, '{}', 'queued', 0, 'ann', 3, "
        "'2026-12-01 00:00:00', '2026-12-01 00:00:00')"
    )
    with con:
        con.execute(insert, (1, '{"name": "a"}'))
        con.execute(insert, (2, '{"name": "b"}'))
    first = _revs(db)
    assert len(set(first.values())) == 2 and 0 not in first.values()
    with con:
        con.execute("update job set state = 'running', params = '{\"lr\": 1}' where id = 1")
    assert _revs(db) == first  # not the spec: the same revision
    with con:
        con.execute('update job set spec = \'{"name": "a2"}\' where id = 1')
    edited = _revs(db)
    assert edited[1] > max(first.values()) and edited[2] == first[2]
    with con:  # a row deleted and inserted again under its id never meets its old revision
        con.execute("delete from job where id = 2")
        con.execute(insert, (2, '{"name": "b"}'))
    assert _revs(db)[2] not in (first[2], edited[1])


def _dump(snap) -> dict:
    d = snap.model_dump()
    d.pop("now")
    return d


def test_a_load_that_keeps_fields_is_the_load_that_reads_them_all(tmp_path):
    """Round after round of raw edits (a spec's count, its cost class, a spec broken, a job
    copied in, one gone, one started), the kept load and a fresh one give the same snapshot and
    leave the same rows."""
    db = tmp_path / "s.db"
    store = Store(f"sqlite:///{db}")
    populate(store, 400, 16)
    kept_fields, previous = SpecFields(), {}
    rnd = random.Random(7)
    con = sqlite3.connect(db)
    for round_ in range(8):
        now = NOW + timedelta(minutes=round_)
        queued = [i for (i,) in con.execute("select id from job where state = 'queued'")]
        with con:
            for job_id in rnd.sample(queued, 6):
                (text,) = con.execute("select spec from job where id = ?", (job_id,)).fetchone()
                spec = json.loads(text)
                spec["resources"]["gpus"] = rnd.choice([0, 1, 2, 4])
                spec["cost_class"] = rnd.choice(["urgent", "cost_sensitive"])
                con.execute("update job set spec = ? where id = ?", (json.dumps(spec), job_id))
            if round_ % 3 == 1:
                con.execute("update job set spec = '{\"resources\": ' where id = ?", (queued[0],))
            con.execute(
                "insert into job (name, spec, params, state, priority, owner, max_attempts, "
                "created_at, updated_at) select name, spec, params, 'queued', priority, owner, "
                "max_attempts, created_at, updated_at from job where id = ?",
                (queued[1],),
            )
            con.execute("update job set state = 'cancelled' where id = ?", (queued[2],))
            con.execute("update job set state = 'running' where id = ?", (queued[3],))
        kept = load_snapshot(store, now, previous=previous, spec_fields=kept_fields)
        fresh = load_snapshot(store, now)
        assert _dump(kept) == _dump(fresh), f"round {round_}"
        kept_ids = set(kept_fields.by_id)  # what the load reads: queued, running, just failed
        assert kept_ids >= {
            i for (i,) in con.execute("select id from job where state in ('queued', 'running')")
        }
        assert not kept_ids & {
            i for (i,) in con.execute("select id from job where state = 'cancelled'")
        }
    broken = con.execute("select count(*) from job where reason like '%not valid JSON%'")
    assert broken.fetchone()[0] >= 2  # the broken specs were seen, and their jobs failed


def test_a_store_from_before_the_revision_gets_one_per_job_and_the_triggers(tmp_path):
    db = tmp_path / "s.db"
    store = Store(f"sqlite:///{db}")
    populate(store, 20, 2)
    store.engine.dispose()
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.set_main_option("sqlalchemy.url", f"sqlite:///{db}")
    command.downgrade(cfg, "0020_job_hold")
    assert "spec_rev" not in [c[1] for c in sqlite3.connect(db).execute("pragma table_info(job)")]
    Store(f"sqlite:///{db}")  # opening it upgrades it
    revs = _revs(db)
    assert len(set(revs.values())) == len(revs) >= 20
    triggers = {
        n
        for (n,) in sqlite3.connect(db).execute(
            "select name from sqlite_master where type = 'trigger'"
        )
    }
    assert triggers == {"job_spec_rev_insert", "job_spec_rev_update"}
