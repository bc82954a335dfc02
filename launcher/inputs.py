"""Validation of user input: signal names, durations, KEY=VALUE pairs."""

from __future__ import annotations

import math
import signal
import sys

from trainctl.launcher import durations
from trainctl.supervisor.errors import ConfigError
from trainctl.supervisor.model.state import TRAINCTL_VARS

UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}
# The longest duration any setting accepts (a year). Beyond it a float stops being a
# sensible deadline: 1e308 s overflows every clock arithmetic it meets.
MAX_DURATION_S = 365 * 24 * 3600.0


def check_duration(secs: float, what: str) -> float:
    """Refuse a negative, non-finite or absurdly long duration, naming the setting."""
    if not math.isfinite(secs) or secs < 0:
        raise ConfigError(f"{what}: must be a non-negative, finite number of seconds")
    if secs > MAX_DURATION_S:
        raise ConfigError(f"{what}: {secs:g} s is more than a year; that cannot be meant")
    return secs


def check_env_key(key: str, what: str) -> str:
    """Refuse an environment name a shell could not export, or one trainctl sets itself."""
    if not key or not key.replace("_", "a").isalnum() or not key.isascii() or key[0].isdigit():
        raise ConfigError(f"{what}: {key!r} is not a valid environment variable name")
    if key in TRAINCTL_VARS:
        raise ConfigError(f"{what}: cannot set {key}: trainctl sets it for every job")
    return key


def parse_signal(name: str) -> str:
    """Return the canonical name ("SIGTERM") of a signal given as TERM, sigterm, SIGTERM or 15."""
    raw = name.strip().upper()
    if not raw:
        raise ConfigError("empty signal name (try TERM, INT, HUP, USR2)")
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


def parse_duration(value: object, what: str) -> float:
    """Seconds from 90, 1.5, "90s", "20m", "1h30m", "7d"; never negative."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        secs = float(value)
    elif isinstance(value, str):
        got = durations.seconds(value)  # the one grammar (early.py's stop reads it too)
        if got is None:
            raise ConfigError(
                f"{what}: {value!r} is not a duration (e.g. 90, 90s, 5min, 1h30m, 2 hours, 7d)"
            )
        secs = got
    else:
        raise ConfigError(f"{what}: expected a duration, got {type(value).__name__}")
    return check_duration(secs, what)


def parse_seconds(value: str | float, what: str) -> float:
    """A duration given on the command line: the same syntax as every spec and config key."""
    return parse_duration(value, what)


def human_duration(secs: float) -> str:
    """``90`` -> "1m30s", ``0.5`` -> "0.5s", ``7260`` -> "2h1m": the syntax the flags take.

    Beyond an hour the seconds are dropped: an age of "1h" should not flicker to "1h1s".
    """
    short = float(f"{secs:.3g}")  # at most 3 significant digits: "0.999903s" is "1s"
    if short < 60:
        return f"{short:g}s"
    if secs < 3600:
        m, s = divmod(round(secs), 60)
        return f"{m}m{s}s" if s else f"{m}m"
    h, m = divmod(int(secs // 60), 60)
    return f"{h}h{m}m" if m else f"{h}h"


def parse_env(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Parse KEY=VAL pairs."""
    out = {}
    for pair in pairs:
        key, sep, val = pair.partition("=")
        if not sep:
            raise ConfigError(f"--env expects KEY=VALUE, got {pair!r}")
        out[check_env_key(key, "--env")] = val
    return out


def confirm(question: str, *, yes: bool, flag: str) -> None:
    """Ask ``question`` on a terminal; off one, ``flag`` (``yes``) must say it instead.

    Raises ConfigError (exit 2, nothing changed) on anything but y/yes, and off a terminal
    without the flag: a script must say what it means.
    """
    if yes:
        return
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise ConfigError(f"{question.rstrip('?')}: not on a terminal, so {flag} must confirm it")
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    try:
        answer = sys.stdin.readline().strip().lower()
    except KeyboardInterrupt:
        answer = ""
    if answer not in ("y", "yes"):
        raise ConfigError("not confirmed; nothing changed")


def closest(word: str, options: list[str] | tuple[str, ...]) -> str | None:
    """The option nearest to a misspelt ``word`` (edit distance at most a third of its
    length, at least 1), or None. Stdlib-free of difflib, which `status` need not load."""
    best, best_d = None, max(1, len(word) // 3) + 1
    for opt in options:
        d = _distance(word, opt, best_d)
        if d < best_d:
            best, best_d = opt, d
    return best


def _distance(a: str, b: str, limit: int) -> int:
    """Edit distance of ``a`` and ``b`` (insertions, deletions, substitutions and swaps of
    two neighbours: `tyo` is one edit from `toy`), or ``limit`` once it reaches it."""
    if abs(len(a) - len(b)) >= limit:
        return limit
    before: list[int] = []
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        now = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            now[j] = min(row[j] + 1, now[j - 1] + 1, row[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                now[j] = min(now[j], before[j - 2] + 1)
        before, row = row, now
        if min(row) >= limit:
            return limit
    return min(row[-1], limit)


def parse_allow(raw: str | None, choices: tuple[str, ...]) -> frozenset[str]:
    """``--allow stop,restart`` -> the actions a server (`mcp`, `web`) may take; one line
    naming the choices for anything else."""
    if not raw:
        return frozenset()
    names = {n.strip() for n in raw.split(",") if n.strip()}
    bad = sorted(names - set(choices))
    if bad:
        raise ConfigError(f"--allow: {', '.join(bad)} is not one of {', '.join(choices)}")
    return frozenset(names)
