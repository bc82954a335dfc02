"""Validation of user input: signal names, durations, KEY=VALUE pairs."""

from __future__ import annotations

import math
import signal

from trainctl.supervisor.errors import ConfigError
from trainctl.supervisor.state import TRAINCTL_VARS

UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def parse_signal(name: str) -> str:
    """Return the canonical name ("SIGTERM") of a signal given as TERM, sigterm, SIGTERM or 15."""
    raw = name.strip().upper()
    try:
        sig = (
            signal.Signals(int(raw))
            if raw.isdigit()
            else signal.Signals[raw if raw.startswith("SIG") else "SIG" + raw]
        )
    except (KeyError, ValueError):
        raise ConfigError(f"unknown signal {name!r} (try TERM, INT, HUP, USR2)") from None
    if sig in UNCATCHABLE:
        raise ConfigError(
            f"{sig.name} cannot be caught, so it gives no grace; "
            "SIGKILL is what the stop sequence escalates to after the grace"
        )
    return sig.name


def parse_seconds(value: str | float, what: str) -> float:
    """Parse a non-negative, finite number of seconds."""
    try:
        secs = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a number of seconds, got {value!r}") from None
    if not math.isfinite(secs) or secs < 0:
        raise ConfigError(f"{what} must be a non-negative number of seconds, got {value!r}")
    return secs


def parse_env(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Parse KEY=VAL pairs."""
    out = {}
    for pair in pairs:
        key, sep, val = pair.partition("=")
        if not sep or not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise ConfigError(f"--env expects KEY=VALUE with a valid variable name, got {pair!r}")
        if key in TRAINCTL_VARS:
            raise ConfigError(f"--env cannot set {key}: trainctl sets it for every job")
        out[key] = val
    return out
