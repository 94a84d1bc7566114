"""Settings on pydantic-settings: defaults ← config file ← environment, where each value came
from, and every bad value one ConfigError naming the field and its source."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from nightshift.runtime.config import (
    LoopSettings,
    Settings,
    load_settings,
    load_settings_with_sources,
    nightshift_home,
)
from nightshift.runtime.errors import ConfigError

# What the executors and the example put in a child's environment: NIGHTSHIFT_*, not settings.
NOT_SETTINGS = {
    "NIGHTSHIFT_RUN_KEY": "job-1-a1",
    "NIGHTSHIFT_ATTEMPT_KEY": "job-1-a1",
    "NIGHTSHIFT_ATTEMPT_ID": "abc",
    "NIGHTSHIFT_JOB_ID": "7",
    "NIGHTSHIFT_ATTEMPT": "2",
    "NIGHTSHIFT_FAULT_CRASH_AT_STEP": "140",
    "NIGHTSHIFT_EXAMPLE_STEP_SLEEP_S": "0.01",
    "NIGHTSHIFT_FAULT__CRASH": "1",  # a "section" that is none
    "NIGHTSHIFT_LOOP__NO_SUCH_KEY": "[not json",  # an unknown key of a real section
}


@pytest.fixture
def bare(home, monkeypatch) -> Path:
    """A fresh NIGHTSHIFT_HOME with no NIGHTSHIFT_<SECTION>__<KEY> variable at all."""
    monkeypatch.delenv("NIGHTSHIFT_LOOP__POLL_INTERVAL_S")
    monkeypatch.delenv("NIGHTSHIFT_RETRY__BASE_S")
    return home


def write(home: Path, text: str, name: str = "config.yaml") -> Path:
    path = home / name
    path.write_text(text)
    return path


def test_defaults_with_no_file_and_no_environment(bare):
    settings, sources = load_settings_with_sources()
    assert settings == Settings(home=str(bare))
    assert settings.home == str(bare) and settings.loop.poll_interval_s == 0.5
    assert settings.store_url == f"sqlite:///{bare / 'nightshift.db'}"
    assert settings.runs_dir == bare / "runs"
    assert sources == {}


def test_env_beats_file_beats_default(bare, monkeypatch):
    cfg = write(
        bare, "loop:\n  poll_interval_s: 0.3\n  cpu_slots: 2\nstore:\n  busy_timeout_s: 5\n"
    )
    monkeypatch.setenv("NIGHTSHIFT_LOOP__POLL_INTERVAL_S", "0.2")
    settings, sources = load_settings_with_sources()
    assert settings.loop == LoopSettings(poll_interval_s=0.2, cpu_slots=2)  # env, file, default
    assert settings.store.busy_timeout_s == 5.0
    assert sources == {
        "loop.poll_interval_s": "env NIGHTSHIFT_LOOP__POLL_INTERVAL_S",
        "loop.cpu_slots": str(cfg),
        "store.busy_timeout_s": str(cfg),
    }


def test_an_explicit_file_replaces_the_home_one(bare, tmp_path):
    write(bare, "loop:\n  cpu_slots: 2\n")
    other = write(tmp_path, "loop:\n  cpu_slots: 3\n", "other.yaml")
    settings, sources = load_settings_with_sources(other)
    assert settings.loop.cpu_slots == 3 and sources == {"loop.cpu_slots": str(other)}
    assert load_settings(str(other)).loop.cpu_slots == 3


def test_nested_delimiter_and_scalar_coercion(bare, monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_LOOP__POLL_INTERVAL_S", "0.2")
    monkeypatch.setenv("NIGHTSHIFT_SCHEDULER__PREEMPT_MARGIN", "2")
    monkeypatch.setenv("NIGHTSHIFT_RETRY__BASE_S", "1")
    monkeypatch.setenv("NIGHTSHIFT_EXECUTOR__PIDS_LIMIT", "null")
    monkeypatch.setenv("NIGHTSHIFT_GPU__PROBE", "none")
    settings = load_settings()
    assert settings.loop.poll_interval_s == 0.2 and isinstance(settings.loop.poll_interval_s, float)
    assert settings.scheduler.preempt_margin == 2 and isinstance(
        settings.scheduler.preempt_margin, int
    )
    assert settings.retry.base_s == 1.0 and settings.retry.factor == 2.0  # the rest stays default
    assert settings.executor.pids_limit is None
    assert settings.gpu.probe == "none"


def test_complex_values_are_json(bare, monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_RETRY", '{"factor": 3, "cap_s": 60}')
    monkeypatch.setenv("NIGHTSHIFT_RETRY__BASE_S", "2")
    monkeypatch.setenv(
        "NIGHTSHIFT_TARIFF",
        '{"timezone": "Europe/Berlin", "currency": "EUR", "default_price_per_kwh": 0.3}',
    )
    monkeypatch.setenv(
        "NIGHTSHIFT_TARIFF__WINDOWS",
        '[{"name": "night", "start": "23:00", "end": "07:00", "price_per_kwh": 0.1}]',
    )
    settings, sources = load_settings_with_sources()
    assert (settings.retry.base_s, settings.retry.factor, settings.retry.cap_s) == (2.0, 3.0, 60.0)
    assert settings.tariff is not None and [w.name for w in settings.tariff.windows] == ["night"]
    assert sources["retry.base_s"] == "env NIGHTSHIFT_RETRY__BASE_S"
    assert sources["retry.factor"] == "env NIGHTSHIFT_RETRY"
    assert sources["tariff.windows"] == "env NIGHTSHIFT_TARIFF__WINDOWS"


def test_env_merges_into_a_file_section(bare, monkeypatch):
    cfg = write(bare, "retry:\n  base_s: 5\n  factor: 4\n")
    monkeypatch.setenv("NIGHTSHIFT_RETRY__BASE_S", "1")
    settings, sources = load_settings_with_sources()
    assert (settings.retry.base_s, settings.retry.factor) == (1.0, 4.0)
    assert sources == {"retry.base_s": "env NIGHTSHIFT_RETRY__BASE_S", "retry.factor": str(cfg)}


def test_variables_that_are_not_settings_are_ignored(bare, monkeypatch):
    for key, value in NOT_SETTINGS.items():
        monkeypatch.setenv(key, value)
    assert load_settings() == Settings(home=str(bare))


def test_unknown_file_keys_and_empty_sections_are_ignored(bare):
    write(bare, "loop:\nno_such_section:\n  x: 1\nstore:\n  no_such_key: 2\n")
    assert load_settings() == Settings(home=str(bare))


def test_an_empty_variable_is_unset(bare, monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_LOOP__POLL_INTERVAL_S", "")
    monkeypatch.setenv("NIGHTSHIFT_RETRY", "")
    assert load_settings() == Settings(home=str(bare))


def test_home_is_nightshift_home(bare, monkeypatch, tmp_path):
    assert load_settings().home == str(bare) == str(nightshift_home())
    monkeypatch.setenv("HOME", str(tmp_path))
    for unset in ("", None):
        if unset is None:
            monkeypatch.delenv("NIGHTSHIFT_HOME")
        else:
            monkeypatch.setenv("NIGHTSHIFT_HOME", unset)
        assert load_settings().home == str(tmp_path / ".nightshift") == str(nightshift_home())
        assert Settings().home == str(tmp_path / ".nightshift")
    monkeypatch.setenv("NIGHTSHIFT_HOME", "~/elsewhere")
    assert load_settings().home == str(tmp_path / "elsewhere")


def test_settings_built_in_code_read_neither_env_nor_file(bare, monkeypatch):
    write(bare, "loop:\n  cpu_slots: 4\n")
    monkeypatch.setenv("NIGHTSHIFT_LOOP__POLL_INTERVAL_S", "0.2")
    monkeypatch.setenv("NIGHTSHIFT_GPU__PROBE", "none")
    built = Settings(home=str(bare), gpu={"probe": "nvml"})
    assert built.loop == LoopSettings() and built.gpu.probe == "nvml"
    assert load_settings().loop == LoopSettings(poll_interval_s=0.2, cpu_slots=4)


# ------------------------------------------------------------------------------------ errors
def test_a_bad_env_value_names_the_field_and_the_variable(bare, monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_LOOP__POLL_INTERVAL_S", "fast")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value) == (
        "config field loop.poll_interval_s: Input should be a valid number, "
        "unable to parse string as a number "
        "(from env NIGHTSHIFT_LOOP__POLL_INTERVAL_S)"
    )


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "NIGHTSHIFT_LOOP__CPU_SLOTS",
            "0",
            "config field loop.cpu_slots: Input should be greater than "
            "or equal to 1 (from env NIGHTSHIFT_LOOP__CPU_SLOTS)",
        ),
        ("NIGHTSHIFT_GPU__PROBE", "gpu", "config field gpu.probe: Input should be 'auto', "),
        ("NIGHTSHIFT_LOOP", "{not json", "config field loop: not valid JSON ("),
        ("NIGHTSHIFT_TARIFF__WINDOWS", "[1,", "config field tariff: not valid JSON ("),
        (
            "NIGHTSHIFT_TARIFF__CURRENCY",
            "EUR",
            "config field tariff.timezone: Field required (from env NIGHTSHIFT_TARIFF__CURRENCY)",
        ),
        (
            "NIGHTSHIFT_RETRY",
            '{"jitter_frac": 2}',
            "config field retry.jitter_frac: Input should be "
            "less than or equal to 1 (from env NIGHTSHIFT_RETRY)",
        ),
    ],
)
def test_bad_env_values_are_config_errors(bare, monkeypatch, key, value, message):
    monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value).startswith(message), err.value
    assert key in str(err.value) and "\n" not in str(err.value)


def test_a_bad_file_value_names_the_field_and_the_file(bare):
    cfg = write(bare, "tariff:\n  timezone: Mars/Olympus\n  currency: EUR\n  windows: []\n")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value).startswith("config field tariff.timezone: Value error, unknown time zone")
    assert str(err.value).endswith(f"(from {cfg})")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("loop: [1\n", "not valid YAML at line 2, column 1: expected ',' or ']'"),
        ("a: b: c\n", "not valid YAML at line 1, column 5: mapping values are not allowed here"),
        ("- loop\n", "expected a mapping of sections"),
        ("just text\n", "expected a mapping of sections"),
        ("1: 2\n", "expected a mapping of sections"),
        ("home: /elsewhere\n", "'home' cannot be set in the config file"),
    ],
)
def test_a_bad_config_file_is_a_config_error_naming_it(bare, text, message):
    cfg = write(bare, text)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value).startswith(f"{cfg}: {message}"), err.value


def test_a_section_that_is_not_a_mapping(bare):
    cfg = write(bare, "loop: 5\n")
    with pytest.raises(
        ConfigError,
        match=rf"^config field loop: Input should be a valid "
        rf"dictionary.*\(from {cfg}\)$",
    ):
        load_settings()


def test_an_unreadable_config_file(bare):
    (bare / "config.yaml").write_bytes(b"loop: '\xff'\n")
    with pytest.raises(ConfigError, match="config.yaml: cannot be read"):
        load_settings()
    (bare / "config.yaml").unlink()
    (bare / "config.yaml").mkdir()
    with pytest.raises(ConfigError, match="config.yaml: not a file"):
        load_settings()


def test_a_missing_explicit_file(bare, tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as err:
        load_settings(missing)
    assert str(err.value) == f"--config {missing}: file not found"
    assert load_settings() == Settings(home=str(bare))  # the home one may be absent


# A value the environment can hold: no NUL, no lone surrogate.
ENV_TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
)
ENV_VALUES = st.one_of(
    ENV_TEXT,
    st.floats().map(repr),
    st.integers().map(str),
    st.sampled_from(["null", "~", "1e400", "-0", " 0.5 ", "nan", "1_0", "0x10"]),
)


@hsettings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=ENV_VALUES)
def test_any_env_value_for_a_float_is_a_float_or_a_config_error(bare, value):
    with mock.patch.dict(os.environ, {"NIGHTSHIFT_LOOP__POLL_INTERVAL_S": value}):
        try:
            settings = load_settings()
        except ConfigError as exc:
            assert str(exc).startswith("config field loop.poll_interval_s: ")
            assert str(exc).endswith("(from env NIGHTSHIFT_LOOP__POLL_INTERVAL_S)")
        else:
            assert isinstance(settings.loop.poll_interval_s, float)


@hsettings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=st.sampled_from(
        [
            "NIGHTSHIFT_STORE__BUSY_TIMEOUT_S",
            "NIGHTSHIFT_RETRY",
            "NIGHTSHIFT_TARIFF__WINDOWS",
            "NIGHTSHIFT_SCHEDULER__PREEMPT_MARGIN",
        ]
    ),
    value=ENV_VALUES,
)
def test_any_env_value_is_a_setting_or_a_config_error(bare, key, value):
    with mock.patch.dict(os.environ, {key: value}):
        try:
            load_settings()
        except ConfigError as exc:
            assert key in str(exc)
