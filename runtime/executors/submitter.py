"""Who a run starts as. In a shared install every job runs as the person who submitted it, as
Slurm and HTCondor run theirs: the daemon (root) decides, the run's supervisor stays root to
record how it ended, and the program itself starts with the submitter's uid, gid and groups —
after which the kernel has cleared every capability — and an environment of its own, none of the
daemon's. So nothing a job can reach belongs to the daemon: not its home, store, key, config or
policy, not its socket as anyone but the submitter, not another person's run."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from nightshift.runtime.errors import OperatorError

# What a run's environment starts from when it runs as its submitter: nothing of the daemon's
# (its secrets, its NIGHTSHIFT_HOME), only what a login would set, then the spec's own env.
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


class RunAs(BaseModel):
    """An OS account a run starts as."""

    model_config = ConfigDict(frozen=True)

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    home: str = "/"

    @property
    def owner(self) -> str:
        return f"{self.uid}:{self.gid}"

    def environment(self) -> dict[str, str]:
        """A login's variables for this account; the spec's env and the run markers go on top."""
        env = {
            "PATH": SAFE_PATH,
            "HOME": self.home,
            "USER": self.name,
            "LOGNAME": self.name,
        }
        for name in ("LANG", "LC_ALL", "TZ"):  # how text and time read, nothing more
            if name in os.environ:
                env[name] = os.environ[name]
        return env


class NoSuchSubmitter(OperatorError):
    """A job's owner is no account a run may start as on this machine."""


def _account(pw: pwd.struct_passwd) -> RunAs:
    """The account of a user database entry, with its supplementary groups."""
    groups = tuple(g for g in os.getgrouplist(pw.pw_name, pw.pw_gid) if g != pw.pw_gid)
    return RunAs(
        name=pw.pw_name, uid=pw.pw_uid, gid=pw.pw_gid, groups=groups, home=pw.pw_dir or "/"
    )


def account_of(owner: str) -> RunAs:
    """The account a job of `owner` (its principal's name) runs as. Refused: a name the user
    database does not know (a chat identity the policy maps to no person here, the agent's own
    name) and root, which no one's job becomes."""
    try:
        pw = pwd.getpwnam(owner)
    except KeyError:
        raise NoSuchSubmitter(
            f"the job's owner {owner!r} is no OS account on this machine, and in a shared install "
            "each job runs as its submitter's account: submit it from that person's own account "
            "(or map the identity to it in the policy's principals)"
        ) from None
    if pw.pw_uid == 0:
        raise NoSuchSubmitter(
            f"the job's owner {owner!r} is root; no job runs as root in a shared install: submit "
            "it from an ordinary account"
        )
    return _account(pw)


def as_submitter(
    run_as: RunAs, argv: list[str], *, timeout_s: float = 60.0, text: bool = True
) -> subprocess.CompletedProcess[Any]:
    """Run a small standard tool (argv, never a shell) as the submitter, with their rights."""
    return subprocess.run(
        argv,
        user=run_as.uid,
        group=run_as.gid,
        extra_groups=list(run_as.groups),
        env=run_as.environment(),
        cwd="/",
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=text,
        timeout=timeout_s,
        check=False,
    )


def account_by_uid(uid: int) -> RunAs | None:
    """The account of a uid (a socket peer's), or None for root or a uid the user database does
    not list (root reads what it names with the daemon's rights: it has them anyway)."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return None
    if uid == 0:
        return None
    return _account(pw)


def hand_over(folder: Path, run_as: RunAs) -> bool:
    """`folder` made by the daemon (in a place only it writes) and given to `run_as`, 0700, never
    following a link; False where something that is not a folder is in the way."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)
    st = folder.lstat()
    if not stat.S_ISDIR(st.st_mode):
        return False
    if (st.st_uid, st.st_gid) != (run_as.uid, run_as.gid):
        os.chown(folder, run_as.uid, run_as.gid, follow_symlinks=False)
    os.chmod(folder, 0o700)
    return True


def submitter_folders(run_as: RunAs, paths: dict[str, Path]) -> None:
    """The job's folder, made in the runs folder (which only the daemon writes) and given to the
    submitter, 0700; the folders the run writes to, made by the submitter with their own rights.
    The daemon never makes or hands over a path a spec names: that would give a submitter any
    folder on the machine (a checkpoint dir of /root/.ssh, or a link planted in the job folder)."""
    ws = paths["workspace"]
    for key, field in (("checkpoint_dir", "checkpoint.dir"), ("metrics_file", "metrics.file")):
        if not paths[key].is_relative_to(ws):
            raise OperatorError(outside_job_folder(field, paths[key]))
    if not hand_over(ws, run_as):
        raise OperatorError(f"the job folder {ws} is not a folder; remove it and retry the job")
    inner = [str(p) for p in (paths["checkpoint_dir"], paths["metrics_file"].parent) if p != ws]
    if inner:
        made = as_submitter(run_as, ["mkdir", "-p", "--", *inner])
        if made.returncode != 0:
            raise OperatorError(
                f"{run_as.name} cannot make the run's folders: {made.stderr.strip()[:300]}; "
                "fix the spec's checkpoint.dir or metrics.file, or the folder's permissions"
            )


def outside_job_folder(field: str, path: Path | str) -> str:
    """Why a shared install refuses a spec path outside the job's folder: the daemon reads and
    keeps what lies there (metrics, checkpoints) with root's rights, not the submitter's."""
    return (
        f"{field} {path} lies outside the job's folder, and where jobs run as their submitters "
        "the daemon reads only the job's own folder (it would read elsewhere with root's "
        f"rights): give a path relative to the job's folder, e.g. {Path(path).name or 'out'}"
    )


def submitter_log(path: Path, run_as: RunAs) -> int:
    """The run's log, opened for appending and given to the submitter: a file of its own (not a
    link the job planted to a file of someone else's, not a second name of one), or an error."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid not in (0, run_as.uid):
            raise OperatorError(
                f"the run's log {path} is not a plain file of the job's own; remove it and retry"
            )
        os.fchown(fd, run_as.uid, run_as.gid)
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd
