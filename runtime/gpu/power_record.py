"""The power limit a GPU had before nightshift changed it, kept in the store's KeyValue table so
that `restore` can put it back after a restart, from any process. One row per GPU, by UUID (an
index can change across reboots); the FIRST previous limit is kept across several changes, so a
restore returns the card to where it was before nightshift touched it."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from sqlmodel import Session, col, select

from nightshift.runtime.store.db import KeyValue

KEY_PREFIX = "gpu_power_limit:"


class PowerLimitRecord(BaseModel):
    """Who changed a GPU's limit, when, why, and what it was before."""

    uuid: str
    gpu: int = Field(description="The index it had when changed")
    name: str
    previous_w: float = Field(description="The limit before nightshift's first change")
    set_w: float = Field(description="The limit nightshift set last")
    by: str
    at: datetime
    reason: str = ""


def key(uuid: str) -> str:
    return KEY_PREFIX + uuid


def get(s: Session, uuid: str) -> PowerLimitRecord | None:
    row = s.get(KeyValue, key(uuid))
    return None if row is None else PowerLimitRecord.model_validate_json(row.value)


def put(s: Session, record: PowerLimitRecord) -> None:
    row = s.get(KeyValue, key(record.uuid))
    if row is None:
        s.add(KeyValue(key=key(record.uuid), value=record.model_dump_json()))
    else:
        row.value = record.model_dump_json()
        s.add(row)


def delete(s: Session, uuid: str) -> None:
    row = s.get(KeyValue, key(uuid))
    if row is not None:
        s.delete(row)


def all_records(s: Session) -> list[PowerLimitRecord]:
    rows = s.exec(select(KeyValue).where(col(KeyValue.key).startswith(KEY_PREFIX))).all()
    return sorted(
        (PowerLimitRecord.model_validate_json(r.value) for r in rows), key=lambda r: r.gpu
    )
