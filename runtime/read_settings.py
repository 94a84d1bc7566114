"""The few settings a read command needs (`jobs`, `status`, `show`, `logs`), without pydantic:
remembered from a full load, under a key made of everything that load reads.

Why: `load_settings` imports pydantic and pydantic-settings, about a third of a second on a small
machine — more than the whole answer of `nightshift jobs` may take. A full load of the same inputs
gives the same values: the home, the config file's bytes and mode, every `NIGHTSHIFT_*` variable
and the standard ones it reads (`OPENAI_*`, `SLACK_*`, `WECOM_*`), and the settings code itself.
So a full load's values are kept in `$NIGHTSHIFT_HOME/.read-settings.json` (mode 0600,
written only into a home of one's own; no secret is among them) and read back while the
key matches (`read`); any other input is a full load again — which reports a bad config as every command
does (agent/doors/quick.py). This module imports nothing of ours, so the settings (config.py) take
the home from it. tests/test_read_settings.py holds the kept values to a full load's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nightshift.runtime.config import Settings

CACHE_NAME = ".read-settings.json"
# The variables a full load may read: its own prefix and the standard ones (config.STANDARD_ENV).
ENV_PREFIXES = ("NIGHTSHIFT_", "OPENAI_", "SLACK_", "WECOM_")
# The settings code: a new version's defaults are a new key.
CODE = (Path(__file__).with_name("config.py"), Path(__file__))
MAX_CONFIG_BYTES = 1024 * 1024


def home_from(raw: str | os.PathLike[str] | None) -> Path:
    return Path(raw or Path.home() / ".nightshift").expanduser()


def nightshift_home() -> Path:
    """The state folder: `$NIGHTSHIFT_HOME`, else `~/.nightshift`."""
    return home_from(os.environ.get("NIGHTSHIFT_HOME"))


@dataclass(frozen=True)
class ReadSettings:
    """What a read command needs of the settings (the same values `Settings` has)."""

    home: str
    store_url: str
    busy_timeout_s: float
    api_mode: str  # auto | embedded | client
    api_socket: str
    runs_dir: str

    @classmethod
    def of(cls, s: Settings) -> ReadSettings:
        return cls(
            home=s.home,
            store_url=s.store_url,
            busy_timeout_s=float(s.store.busy_timeout_s),
            api_mode=s.api.mode,
            api_socket=str(s.api_socket),
            runs_dir=str(s.runs_dir),
        )

    @property
    def served_at(self) -> Path | None:
        """The daemon's socket when this command is its client (wiring.served_socket)."""
        return served_socket(self.api_mode, Path(self.api_socket))


def served_socket(mode: str, path: Path) -> Path | None:
    """The daemon's socket when these settings make a command its client: `api.mode: client`
    always, `auto` when the socket (or, while no daemon runs, its folder) belongs to another
    user than the caller; None for the single-user embedded mode."""
    if mode == "embedded":
        return None
    if mode == "client":
        return path
    owner = _owner(path)
    return path if owner is not None and owner != os.geteuid() else None


def _owner(path: Path) -> int | None:
    """The uid of the socket; while there is none, of its folder unless root owns that."""
    try:
        return path.stat().st_uid
    except OSError:
        pass
    try:
        folder = path.parent.stat()
    except OSError:
        return None
    return folder.st_uid if folder.st_uid != 0 else None


def read(config: str | None, full_load: Callable[[], ReadSettings]) -> ReadSettings:
    """The read settings for `--config` (None: the home's config.yaml): the ones a full load
    gave for these very inputs, else `full_load()`'s (raising what it raises), kept for next
    time. The caller passes the full load, so this module imports nothing of ours."""
    home = nightshift_home()
    key = _key(home, config)
    found = None if key is None else _kept(home, key)
    if found is None:
        found = full_load()
        if key is not None:
            _keep(home, key, found)
    return found


def kept(config: str | None) -> ReadSettings | None:
    """What `read` would find kept for these inputs (None: nothing, or an input changed)."""
    home = nightshift_home()
    key = _key(home, config)
    return None if key is None else _kept(home, key)


def _key(home: Path, config: str | None) -> str | None:
    """A digest of every input of a full load; None when one cannot be read cheaply (the full
    load then says what is wrong)."""
    path = Path(config).expanduser() if config else home / "config.yaml"
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CONFIG_BYTES:
            return None
        file: object = [hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mode & 0o777]
    except FileNotFoundError:
        file = None
    except OSError:
        return None
    try:
        code = [[c.stat().st_mtime_ns, c.stat().st_size] for c in CODE]
    except OSError:
        return None
    env = sorted((k, v) for k, v in os.environ.items() if k.upper().startswith(ENV_PREFIXES))
    inputs = [str(home), str(path), config is not None, file, env, code, os.geteuid()]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()


def _kept(home: Path, key: str) -> ReadSettings | None:
    try:
        raw = json.loads((home / CACHE_NAME).read_text(encoding="utf-8"))
        if raw.pop("key") != key:
            return None
        return ReadSettings(**raw)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _keep(home: Path, key: str, found: ReadSettings) -> None:
    """Written at once (rename) into a home that is the caller's own; else not kept."""
    try:
        if home.stat().st_uid != os.geteuid():
            return
        fd, tmp = tempfile.mkstemp(prefix=CACHE_NAME, dir=home)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"key": key, **asdict(found)}, f)
        os.replace(tmp, home / CACHE_NAME)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
