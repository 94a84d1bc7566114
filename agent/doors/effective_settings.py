"""What `nightshift config show` prints: every setting as nightshift uses it, and where it came
from. A setting left unset is shown as the value used in its place (the store, socket, runs folder
and audit key under the home folder, this host's name, the shipped policy), never as a blank; a
secret stays masked (SecretStr), and so does a password or token inside a URL."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel, SecretStr

from nightshift.runtime.config import Settings

MASK = "***"
# Query parameters of a URL that carry a credential (libpq's `?password=`, a webhook's `key=`).
_SECRET_QUERY = ("password", "passwd", "token", "secret", "key", "signature")


def mask_url(value: str) -> str:
    """`value` with the password of its user info and any credential in its query masked; a
    value that is no URL is returned as it is."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return value
    if not parts.scheme or not parts.netloc:
        return value
    netloc = parts.netloc
    user, at, host = netloc.rpartition("@")
    if at and ":" in user:
        netloc = f"{user.split(':', 1)[0]}:{MASK}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_is_secret(k) for k, _ in pairs):
            masked = [(k, MASK if _is_secret(k) else v) for k, v in pairs]
            query = urlencode(masked, safe="*")
    if netloc == parts.netloc and query == parts.query:
        return value
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _is_secret(name: str) -> bool:
    return any(word in name.lower() for word in _SECRET_QUERY)


def effective_rows(settings: Settings, sources: dict[str, str]) -> list[tuple[str, Any, str]]:
    """(key, value as used, where it came from) for every setting, in the settings' order."""
    used = _used_in_place(settings)
    rows: list[tuple[str, Any, str]] = []
    home_from = sources.get("home") or (
        "NIGHTSHIFT_HOME" if os.environ.get("NIGHTSHIFT_HOME") else "default (~/.nightshift)"
    )
    rows.append(("home", str(settings.home_path), home_from))
    for section, values in settings:
        if section == "home":
            continue
        if isinstance(values, BaseModel):
            items = [(f"{section}.{k}", v) for k, v in values]
        else:
            items = [(section, values)]
        for key, value in items:
            source = sources.get(key, "default")
            if value is None and key in used:
                value, source = used[key]
            rows.append((key, _shown(value), source))
    for key, (value, source) in _decided(settings).items():
        rows.append((key, value, source))
    return rows


def _used_in_place(settings: Settings) -> dict[str, tuple[Any, str]]:
    """What nightshift uses where a setting is left unset, and why."""
    from nightshift.runtime.executors.docker_executor import DEFAULT_DOCKER_HOST

    docker = os.environ.get("DOCKER_HOST")
    return {
        "store.url": (settings.store_url, "default: $NIGHTSHIFT_HOME/nightshift.db"),
        "api.socket": (str(settings.api_socket), "default: $NIGHTSHIFT_HOME/api.sock"),
        "executor.runs_dir": (str(settings.runs_dir), "default: $NIGHTSHIFT_HOME/runs"),
        "audit.key_file": (
            str(settings.audit_key_file),
            "default: $NIGHTSHIFT_HOME/keys/audit.key",
        ),
        "loop.node": (settings.node, "default: this host's name"),
        "policy.file": (_shipped_policy(), "default: the shipped policy"),
        "executor.docker_url": (
            docker or DEFAULT_DOCKER_HOST,
            "DOCKER_HOST" if docker else "default: Docker's own socket",
        ),
    }


def _decided(settings: Settings) -> dict[str, tuple[str, str]]:
    """Values decided from others (`auto` made concrete), shown after the settings."""
    return {
        "(jobs run as)": (
            "their submitters" if settings.jobs_run_as_submitter else "the daemon's user",
            f"executor.run_as: {settings.executor.run_as}",
        ),
        "(run cgroups)": (settings.run_cgroups, f"executor.cgroups: {settings.executor.cgroups}"),
    }


def _shipped_policy() -> str:
    from importlib import resources

    from nightshift.policies.model import DEFAULT_POLICY

    return str(resources.files("nightshift.policies").joinpath(DEFAULT_POLICY))


def _shown(value: Any) -> Any:
    """A value as printed: unset says so, a secret stays masked, a URL loses its password."""
    if value is None:
        return "(not set)"
    if isinstance(value, SecretStr):
        return str(value)  # **********
    if isinstance(value, str):
        return mask_url(value)
    if isinstance(value, dict):
        return {k: _shown(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shown(v) for v in value]
    if isinstance(value, BaseModel):
        return _shown(dict(value))
    return value
