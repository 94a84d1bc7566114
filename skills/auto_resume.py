"""auto_resume: find the newest complete, readable checkpoint and say how to resume from it.

Where checkpoints are found, how their step is read and how completeness is checked is
`nightshift.runtime.training.checkpoints` (its docstring has the table of layouts). Rules kept here:

1. Search the checkpoint folder and `search_dirs` (nightshift's kept good copies) together, a few
   levels deep; newest by step first, never by file time.
2. Verify newest first and choose the first that passes; every newer one that fails is listed in
   `skipped` with its reason, as is one whose weights hold NaN/inf (`reject_nonfinite`).
3. `max_step` leaves out checkpoints after a step (a divergence began there) and those of unknown
   step.
4. The resume command: the caller's `resume_arg` template when given (`{checkpoint}` and `{step}`
   filled), else the framework's convention — Hugging Face `--resume_from_checkpoint PATH`,
   Lightning `--ckpt_path PATH`, everything else the spec default `--resume PATH`. A flag of the
   template already in the command is replaced, never duplicated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from nightshift.runtime.training import checkpoints
from nightshift.skills.base import SkillContext, skill

Framework = Literal[
    "auto",
    "nightshift",
    "pytorch",
    "lightning",
    "huggingface",
    "safetensors",
    "tensorflow",
    "orbax",
]

# Tie-break order at equal steps (the order of the table above).
FRAMEWORK_ORDER = (
    "nightshift",
    "huggingface",
    "lightning",
    "pytorch",
    "safetensors",
    "tensorflow",
    "orbax",
)
DEFAULT_RESUME_ARGS: dict[str, list[str]] = {
    "huggingface": ["--resume_from_checkpoint", "{checkpoint}"],
    "lightning": ["--ckpt_path", "{checkpoint}"],
}
SPEC_RESUME_ARG = ["--resume", "{checkpoint}"]


class AutoResumeInput(BaseModel):
    """Where the checkpoints are, and (optionally) the command to inject a resume argument into."""

    checkpoint_dir: str = Field(
        description="The folder that holds the checkpoints (not one checkpoint)"
    )
    command: list[str] | None = Field(
        None, description="argv of the run; returned with the resume argument injected"
    )
    resume_arg: list[str] | None = Field(
        None,
        description="resume argv template with {checkpoint} "
        "and {step}, e.g. the spec's ['--resume', '{checkpoint}']; "
        "default: the framework's convention",
    )
    framework: Framework = Field("auto", description="Only consider this layout; auto: all of them")
    max_step: int | None = Field(
        None,
        ge=0,
        description="Only checkpoints at or before this step "
        "(e.g. before a divergence began); checkpoints of unknown step "
        "are then left out",
    )
    current_step: int | None = Field(
        None,
        ge=0,
        description="The step the run had reached, to say how many steps a resume recomputes",
    )
    search_dirs: list[str] = Field(
        default_factory=list,
        description="More folders searched with "
        "checkpoint_dir (e.g. nightshift's copies of good checkpoints)",
    )
    steps_per_epoch: int | None = Field(
        None, ge=1, description="For checkpoints that record only an epoch"
    )
    reject_nonfinite: bool = Field(True, description="Skip a checkpoint whose weights hold NaN/inf")
    max_depth: int = Field(
        checkpoints.MAX_DEPTH,
        ge=0,
        le=12,
        description="How many folder levels below checkpoint_dir are searched",
    )


class SkippedCheckpoint(BaseModel):
    path: str
    reason: str


class AutoResumeResult(BaseModel):
    """The resume plan. found is False (not an error) when there is nothing usable to resume from."""

    found: bool
    path: str | None = Field(None, description="The checkpoint to resume from (file or folder)")
    step: int | None = Field(None, description="Its step; None when it records none")
    framework: str | None = None
    step_from: str | None = Field(
        None, description="Where the step was read: metadata, name, trainer_state, folder, epoch"
    )
    command: list[str] | None = Field(
        None, description="The input command with the resume argument"
    )
    skipped: list[SkippedCheckpoint] = Field(
        default_factory=list, description="Newer checkpoints passed over, and why"
    )
    candidates: int = Field(0, description="Checkpoints recognised in the folder")
    steps_to_recompute: int | None = Field(
        None, description="current_step minus step, when both known"
    )
    message: str


@skill("auto_resume", capability="read")
def auto_resume(ctx: SkillContext, inp: AutoResumeInput) -> AutoResumeResult:
    """Find the newest complete and readable checkpoint in a folder and return a resume plan: its
    path and step, and the run's command with the resume argument injected (the given resume_arg
    template, else --resume_from_checkpoint for Hugging Face, --ckpt_path for Lightning, --resume
    for the rest). Knows nightshift step_N.npz, PyTorch .pt/.pth, Lightning .ckpt, Hugging Face
    checkpoint-N folders, safetensors, TensorFlow checkpoint index files and orbax step folders.
    Orders by step, never by file time; a truncated or corrupt newest checkpoint is skipped for the
    one before, and each skip is listed with its reason. found=False means start from scratch."""
    folder = Path(inp.checkpoint_dir).expanduser().absolute()
    if not folder.exists():
        return AutoResumeResult(
            found=False,
            message=f"checkpoint folder {folder} does not exist: "
            "there is nothing to resume from; start from scratch",
        )
    if not folder.is_dir():
        return AutoResumeResult(
            found=False,
            message=f"{folder} is a file, not a folder; pass the folder that holds the checkpoints",
        )

    candidates, left = [], []
    for root in [folder, *(Path(d).expanduser().absolute() for d in inp.search_dirs)]:
        if root.is_dir():
            found, lo = checkpoints.search(
                root, steps_per_epoch=inp.steps_per_epoch, max_depth=inp.max_depth
            )
            candidates += found
            left += lo
    skipped = [SkippedCheckpoint(path=str(x.path), reason=x.reason) for x in left]
    if inp.framework != "auto":
        candidates = [c for c in candidates if c.framework == inp.framework]
    if inp.max_step is not None:
        candidates = [c for c in candidates if c.step is not None and c.step <= inp.max_step]
    candidates.sort(key=checkpoints.Found.sort_key)
    which = "" if inp.framework == "auto" else f"{inp.framework} "
    if inp.max_step is not None:
        which += f"(at or before step {inp.max_step}) "
    if not candidates:
        return AutoResumeResult(
            found=False,
            skipped=skipped,
            candidates=0,
            message=f"no {which}checkpoint in {folder}: start from scratch",
        )

    chosen = None
    for cand in candidates:
        reason = checkpoints.verify(cand)
        if reason is None and inp.reject_nonfinite:
            bad = checkpoints.nonfinite(cand)
            reason = None if bad is None else f"weights are not finite ({bad})"
        if reason is None:
            chosen = cand
            break
        skipped.append(SkippedCheckpoint(path=str(cand.path), reason=reason))
    if chosen is None:
        return AutoResumeResult(
            found=False,
            skipped=skipped,
            candidates=len(candidates),
            message=f"none of the {len(candidates)} {which}checkpoints in {folder} is complete and "
            "readable (see skipped): start from scratch",
        )

    parts = [
        f"resume from {chosen.framework} checkpoint {chosen.path}"
        + (
            f" at step {chosen.step}"
            if chosen.step is not None
            else " (it records no step: the run decides where it continues)"
        )
    ]
    recompute = None
    if inp.current_step is not None and chosen.step is not None:
        recompute = max(0, inp.current_step - chosen.step)
        parts.append(
            f"{recompute} steps to recompute (the run had reached step {inp.current_step})"
        )
        if inp.current_step < chosen.step:
            parts.append(
                f"note: the checkpoint is ahead of the reported current step {inp.current_step}"
            )
    if skipped:
        parts.append(
            f"skipped {len(skipped)}: "
            + "; ".join(f"{Path(s.path).name}: {s.reason}" for s in skipped)
        )

    command = None
    if inp.command is not None:
        template = inp.resume_arg or DEFAULT_RESUME_ARGS.get(chosen.framework, SPEC_RESUME_ARG)
        if chosen.step is None and any("{step}" in t for t in template):
            parts.append(
                "the resume template needs {step}, which this checkpoint does not record: "
                "no command returned"
            )
        else:
            command = inject_resume_args(inp.command, template, str(chosen.path), chosen.step)

    return AutoResumeResult(
        found=True,
        path=str(chosen.path),
        step=chosen.step,
        framework=chosen.framework,
        step_from=chosen.step_from,
        command=command,
        skipped=skipped,
        candidates=len(candidates),
        steps_to_recompute=recompute,
        message="; ".join(parts),
    )


# --- command injection --------------------------------------------------------------------------
def inject_resume_args(
    command: list[str], template: list[str], checkpoint: str, step: int | None
) -> list[str]:
    """Append the rendered template to `command`, first removing any flag of the template that is
    already there (`--flag VALUE` or `--flag=VALUE`), so a resume argument is replaced, not doubled."""
    rendered = [
        t.replace("{checkpoint}", checkpoint).replace("{step}", "" if step is None else str(step))
        for t in template
    ]
    flags: dict[str, int] = {}  # flag -> number of values that follow it in the template
    current = None
    for token in template:
        if token.startswith("-") and "{" not in token:
            current = token.split("=", 1)[0]
            flags[current] = 0 if "=" not in token else -1
        elif current is not None and flags[current] >= 0:
            flags[current] += 1
    out: list[str] = []
    i = 0
    while i < len(command):
        token = command[i]
        if token in flags:
            i += 1 + max(flags[token], 0)
            continue
        if "=" in token and token.split("=", 1)[0] in flags:
            i += 1
            continue
        out.append(token)
        i += 1
    return out + rendered
