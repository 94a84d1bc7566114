"""The read commands' settings, kept from a full load (runtime/read_settings.py, quick.settings):
the kept values are the full load's for the same inputs, and any change to an input — the config
file's bytes or mode, a NIGHTSHIFT_* or standard variable, the home — is a full load again, which
reports a bad config as every command does. Nothing is kept where it is not one's own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nightshift.agent.doors import quick
from nightshift.runtime import read_settings
from nightshift.runtime.config import load_settings
from nightshift.runtime.errors import ConfigError
from nightshift.runtime.read_settings import CACHE_NAME, ReadSettings


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    for k in list(os.environ):
        if k.upper().startswith(read_settings.ENV_PREFIXES):
            monkeypatch.delenv(k)
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(h))
    return h


def _full(config: str | None = None) -> ReadSettings:
    return ReadSettings.of(load_settings(config))


def test_kept_once_then_read_back(home):
    assert read_settings.kept(None) is None
    first = quick.settings(None)
    assert first == _full()
    kept = home / CACHE_NAME
    assert kept.stat().st_mode & 0o777 == 0o600
    assert read_settings.kept(None) == first
    assert "api_key" not in kept.read_text()


@pytest.mark.parametrize(
    "change",
    ["config file", "config mode", "nightshift variable", "standard variable", "explicit config"],
)
def test_any_changed_input_is_a_full_load_again(home, monkeypatch, tmp_path, change):
    cfg = home / "config.yaml"
    cfg.write_text("store:\n  busy_timeout_s: 7\n")
    cfg.chmod(0o600)
    before = quick.settings(None)
    assert before.busy_timeout_s == 7
    config: str | None = None
    if change == "config file":
        cfg.write_text("store:\n  busy_timeout_s: 9\n")
    elif change == "config mode":
        cfg.write_text("llm:\n  api_key: sk-secret\n")
        quick.settings(None)  # kept while the file is its owner's alone
        cfg.chmod(0o644)  # now others may read a secret: the full load refuses it
        with pytest.raises(ConfigError, match="others may"):
            quick.settings(None)
        return
    elif change == "nightshift variable":
        monkeypatch.setenv("NIGHTSHIFT_API__MODE", "embedded")
    elif change == "standard variable":
        monkeypatch.setenv("OPENAI_BASE_URL", "not a url")
        with pytest.raises(ConfigError):
            quick.settings(None)
        return
    else:
        other = tmp_path / "other.yaml"
        other.write_text("executor:\n  runs_dir: /tmp/elsewhere\n")
        config = str(other)
    after = quick.settings(config)
    assert after == _full(config) and after != before


def test_a_bad_config_is_reported_never_read_from_the_kept(home):
    quick.settings(None)
    (home / "config.yaml").write_text("store: [not, a, section]\n")
    with pytest.raises(ConfigError, match="store"):
        quick.settings(None)


def test_nothing_kept_in_a_home_that_is_not_ones_own(home):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the home to another user")
    os.chown(home, 65534, 65534)
    try:
        assert quick.settings(None) == _full()
        assert not (home / CACHE_NAME).exists()
    finally:
        os.chown(home, 0, 0)


def test_a_kept_file_from_elsewhere_is_not_believed(home):
    """A kept file whose key is not this load's (copied from another home, edited) is a full
    load, whatever it says."""
    quick.settings(None)
    kept = home / CACHE_NAME
    forged = json.loads(kept.read_text())
    forged["store_url"] = "sqlite:////tmp/someone-elses.db"
    forged["key"] = "0" * 64
    kept.write_text(json.dumps(forged))
    assert quick.settings(None) == _full()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    busy=st.one_of(st.none(), st.sampled_from(["0.5", "30", "-1", "x", ""])),
    mode=st.one_of(st.none(), st.sampled_from(["auto", "embedded", "client", "bogus"])),
    url=st.one_of(st.none(), st.sampled_from(["sqlite:////tmp/a.db", "postgresql://h/db"])),
    file_mode=st.sampled_from(["", "api:\n  mode: client\n", "store: {busy_timeout_s: 3}\n"]),
)
def test_kept_values_are_the_full_loads(home, monkeypatch, busy, mode, url, file_mode):
    """Whatever the inputs, the second answer (read back where kept) is the full load's, or both
    refuse the config."""
    (home / "config.yaml").write_text(file_mode)
    for var, value in (
        ("NIGHTSHIFT_STORE__BUSY_TIMEOUT_S", busy),
        ("NIGHTSHIFT_API__MODE", mode),
        ("NIGHTSHIFT_STORE__URL", url),
    ):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    try:
        expected: ReadSettings | None = _full()
    except ConfigError:
        expected = None
    for _ in range(2):
        if expected is None:
            with pytest.raises(ConfigError):
                quick.settings(None)
        else:
            assert quick.settings(None) == expected
