"""Parsing of flags and config values."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainctl.launcher import api, config, durations
from trainctl.launcher.early import _seconds as early_seconds
from trainctl.launcher.inputs import parse_duration
from trainctl.supervisor.errors import ConfigError


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("TERM", "SIGTERM"),
        ("sigint", "SIGINT"),
        ("SIGUSR2", "SIGUSR2"),
        ("15", "SIGTERM"),
        (" hup ", "SIGHUP"),
    ],
)
def test_parse_signal(raw: str, name: str) -> None:
    assert api.parse_signal(raw) == name


@pytest.mark.parametrize("raw", ["FOO", "", "999", "KILL", "SIGSTOP", "-15"])
def test_parse_signal_rejects(raw: str) -> None:
    with pytest.raises(ConfigError):
        api.parse_signal(raw)


@pytest.mark.parametrize(
    ("raw", "secs"),
    [("0", 0.0), ("1.5", 1.5), (60, 60.0), ("2m", 120.0), ("1h30m", 5400.0), ("2s", 2.0)],
)
def test_parse_seconds(raw: str, secs: float) -> None:
    """Flags take the same durations as spec keys: 90, 90s, 2m, 1h30m."""
    assert api.parse_seconds(raw, "--grace") == secs


@pytest.mark.parametrize(
    ("secs", "text"),
    [(1, "1s"), (0.5, "0.5s"), (90, "1m30s"), (1800, "30m"), (3601, "1h"), (7260, "2h1m")],
)
def test_human_duration(secs: float, text: str) -> None:
    from trainctl.launcher.inputs import human_duration  # noqa: PLC0415

    assert human_duration(secs) == text


@pytest.mark.parametrize("raw", ["-1", "inf", "nan", "1w", "", "5ms"])
def test_parse_seconds_rejects(raw: str) -> None:
    with pytest.raises(ConfigError, match="--grace"):
        api.parse_seconds(raw, "--grace")


def test_parse_env() -> None:
    assert api.parse_env(["A=1", "B_2=x=y", "C="]) == {"A": "1", "B_2": "x=y", "C": ""}
    for bad in (["A"], ["=1"], ["1A=2"], ["A-B=1"], ["TRAINCTL_RUN=3"]):
        with pytest.raises(ConfigError):
            api.parse_env(bad)


def test_shipped_defaults_load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TRAINCTL_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no config.toml there: defaults
    cfg = config.load_config()
    assert cfg.grace_s == 60.0
    assert cfg.stop_signal == "SIGTERM"
    assert cfg.home == ""


def test_user_config_overrides_and_validates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "c.toml"
    monkeypatch.setenv("TRAINCTL_CONFIG", str(path))
    path.write_text('[stop]\ngrace_s = 5\nsignal = "SIGINT"\n')
    cfg = config.load_config()
    assert (cfg.grace_s, cfg.stop_signal) == (5.0, "SIGINT")
    # the spec's names and duration syntax; the older `_s` names still read
    path.write_text(
        '[stop]\ngrace = "2m"\nkill_wait = 3\n[supervisor]\nsnapshot_interval = "500ms"\n'
    )
    with pytest.raises(ConfigError, match="not a duration"):
        config.load_config()
    path.write_text('[stop]\ngrace = "2m"\nkill_wait = 3\n[gpu]\nrelease_timeout = "1m30s"\n')
    cfg = config.load_config()
    assert (cfg.grace_s, cfg.kill_wait_s, cfg.gpu_timeout_s) == (120.0, 3.0, 90.0)
    for text, needle in (
        ("[stop]\nbogus = 1\n", "unknown key stop.bogus"),
        ("[stop]\ngrase = 1\n", "did you mean stop.grace"),
        ("[start]\ncgroup = 1\n", "must be bool"),
        ("[logs]\ntail_lines = true\n", "must be int"),
        ("x = 1\n", "must be a table"),
        ("[stop\n", "invalid TOML"),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError, match=needle.replace("[", r"\[")):
            config.load_config()


def test_a_config_file_named_but_missing_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TRAINCTL_CONFIG", str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigError, match=r"TRAINCTL_CONFIG names .*absent.toml, which does not"):
        config.load_config()


def test_home_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TRAINCTL_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("TRAINCTL_HOME", "/env/home")
    assert config.resolve_home("/flag", None) == Path("/flag")
    assert config.resolve_home(None, None) == Path("/env/home")
    monkeypatch.delenv("TRAINCTL_HOME")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert config.resolve_home(None, None) == tmp_path / "trainctl"


# The grammar durations.py replaced (inputs.py's regex until issue 55): the reference.
_REF_PART = re.compile(r"(?i)\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*,?")


def _reference(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    pos, total, seen = 0, 0.0, set()
    while pos < len(text):
        m = _REF_PART.match(text, pos)
        if m is None:
            return None
        scale = durations.UNITS.get(m[2].lower())
        if scale is None or scale in seen:
            return None
        seen.add(scale)
        total += float(m[1]) * scale
        pos = m.end()
    return total if seen else None


_PIECES = st.sampled_from(["1", "90", "2.5", "s", "m", "min", "h", "hours", "d", "Days", " ",
                           ",", ".", "x", "1e3", "-", "inf", "٣"])  # fmt: skip


@given(st.lists(_PIECES, max_size=8).map("".join))
def test_one_grammar_of_a_duration_for_flags_spec_keys_and_the_early_stop(text: str) -> None:
    """issue 55 §4: the grace has one grammar. durations.py (no import, so early.py's stop
    reads `--grace` with it) says what the regex grammar said; early.py sends a grace
    only where the verb would read the same number."""
    got, ref = durations.seconds(text), _reference(text)
    assert got == ref or (
        got is not None and ref is not None and math.isnan(got) and math.isnan(ref)
    )
    early = early_seconds(text)
    if early is not None:
        assert early == parse_duration(text, "--grace")
