"""Placement as one pure function: a snapshot of the world in, starts and hold reasons out.

The loop, the daemon and the simulator in `evals/` all call `place`; it reads no clock, store or
GPU itself, so the same snapshot always gives the same decision.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


QUARANTINED = ("CRITICAL", "UNKNOWN")  # a GPU we cannot read is not a GPU we place work on


class GpuSlot(BaseModel):
    index: int
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    verdict: str = "OK"  # latest recorded verdict; CRITICAL or UNKNOWN means quarantined


class PendingJob(BaseModel):
    id: int
    priority: int = 0
    gpus: int = 0
    gpu_memory_gb: float | None = None
    share_gpu: bool = False
    blocked_by: list[str] = Field(default_factory=list, description="unmet depends_on names")
    submitted_at: datetime


class RunningJob(BaseModel):
    id: int
    gpus: list[int] = Field(default_factory=list)
    share_gpu: bool = False


class Snapshot(BaseModel):
    now: datetime
    pending: list[PendingJob]
    running: list[RunningJob] = Field(default_factory=list)
    gpus: list[GpuSlot] = Field(default_factory=list)
    cpu_slots: int = 1


class Start(BaseModel):
    job_id: int
    gpus: list[int]


class Decision(BaseModel):
    starts: list[Start] = Field(default_factory=list)
    holds: dict[int, str] = Field(default_factory=dict)


def place(snap: Snapshot) -> Decision:
    """Highest priority first (ties: oldest); each job gets whole free GPUs that are not quarantined
    and have the memory it asks for, or a CPU slot when it asks for no GPU."""
    decision = Decision()
    busy = {g for r in snap.running for g in r.gpus}
    cpu_free = snap.cpu_slots - sum(1 for r in snap.running if not r.gpus)
    order = sorted(snap.pending, key=lambda j: (-j.priority, j.submitted_at, j.id))
    for job in order:
        if job.blocked_by:
            decision.holds[job.id] = f"waiting on {', '.join(job.blocked_by)}"
            continue
        if job.gpus == 0:
            if cpu_free > 0:
                cpu_free -= 1
                decision.starts.append(Start(job_id=job.id, gpus=[]))
            else:
                decision.holds[job.id] = f"all {snap.cpu_slots} CPU slot(s) busy"
            continue
        healthy = [g for g in snap.gpus if g.verdict not in QUARANTINED]
        if len(healthy) < job.gpus:
            decision.holds[job.id] = (f"needs {job.gpus} GPU(s); {len(healthy)} healthy "
                                      f"({len(snap.gpus) - len(healthy)} quarantined)")
            continue
        need_mib = (job.gpu_memory_gb or 0) * 1024
        fits = [g for g in healthy if g.index not in busy and _free_mib(g) >= need_mib]
        if len(fits) < job.gpus:
            want = f" with {job.gpu_memory_gb:g} GiB free" if job.gpu_memory_gb else ""
            decision.holds[job.id] = f"no {job.gpus} healthy free GPU(s){want}"
            continue
        chosen = [g.index for g in fits[: job.gpus]]
        busy |= set(chosen)
        decision.starts.append(Start(job_id=job.id, gpus=chosen))
    return decision


def _free_mib(g: GpuSlot) -> float:
    if g.memory_total_mib is None:
        return 0.0
    return g.memory_total_mib - (g.memory_used_mib or 0.0)
