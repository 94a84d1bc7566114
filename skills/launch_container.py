"""launch_container: run one workload directly through the configured executor."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from nightshift.runtime.errors import SkillFailed
from nightshift.runtime.executors.executor import LaunchRequest
from nightshift.skills.base import Claims, Launch, SkillContext, SkillInput, skill


class LaunchContainerInput(SkillInput):
    argv: list[str] = Field(
        min_length=1, description="Program and arguments, one item each (no shell)"
    )
    cwd: str = Field(description="Working directory")
    image: str | None = Field(None, description="Container image (container executors only)")
    env: dict[str, str] = Field(default_factory=dict)
    gpus: list[int] = Field(default_factory=list, description="GPU indices to expose")
    memory_gb: float | None = None
    shm_gb: float | None = None
    mounts: list[dict[str, Any]] = Field(default_factory=list)
    user: str | None = None
    log_path: str | None = Field(
        None, description="Default: $NIGHTSHIFT_HOME/runs/launch-<call id>.log"
    )
    dry_run: bool = Field(False, description="Only render what would run")

    def claims(self) -> Claims:
        mounts = [
            str(m.get("source") or m.get("src") or m.get("host_path") or "") for m in self.mounts
        ]
        return Claims(
            launches=[
                Launch(
                    where="launch",
                    gpus=len(self.gpus),
                    image=self.image,
                    mounts=[m for m in mounts if m],
                )
            ]
        )


class LaunchContainerResult(BaseModel):
    key: str
    rendered: str
    dry_run: bool
    handle: dict[str, Any] | None = None


@skill("launch_container", capability="launch")
def launch_container(ctx: SkillContext, inp: LaunchContainerInput) -> LaunchContainerResult:
    """Start one workload (argv list, env, GPUs, limits, mounts) through the configured executor,
    outside the job queue. With dry_run it only shows what would run. The same call id never
    launches twice."""
    if ctx.executor is None:
        raise SkillFailed("no executor configured")
    key = "launch-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", ctx.call_id or "adhoc")
    log = inp.log_path or str(ctx.settings.runs_dir / f"{key}.log")
    req = LaunchRequest(
        key=key,
        argv=inp.argv,
        cwd=inp.cwd,
        env=inp.env,
        gpus=inp.gpus,
        log_path=log,
        image=inp.image,
        user=inp.user,
        memory_gb=inp.memory_gb,
        shm_gb=inp.shm_gb,
        mounts=inp.mounts,
    )
    rendered = ctx.executor.render(req)
    if inp.dry_run:
        return LaunchContainerResult(key=key, rendered=rendered, dry_run=True)
    return LaunchContainerResult(
        key=key, rendered=rendered, dry_run=False, handle=ctx.executor.start(req)
    )
