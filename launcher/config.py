"""Configuration: shipped defaults (conf/trainctl.toml) overlaid by the user's file."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import trainctl.conf
from trainctl.supervisor.errors import ConfigError
from trainctl.supervisor.model import layout, state
from trainctl.supervisor.model.spec import CLASS_NAME, HOOK_EVENTS, RESTART_WORDS, parse_order
from trainctl.supervisor.records import field, record

from .inputs import check_duration, closest, parse_duration

SHIPPED = Path(trainctl.conf.__file__).parent / "trainctl.toml"


@record(frozen=True)
class Config:
    """Resolved defaults; flags override these per command."""

    home: str
    ready_timeout_s: float
    cgroup: bool
    systemd: bool
    grace_s: float
    stop_signal: str
    stop_order: str
    kill_wait_s: float
    snapshot_interval_s: float
    sample_interval_s: float
    tail_lines: int
    follow_poll_s: float
    log_max_mib: int
    log_keep: int
    gpu_foreign_threshold_mib: int
    gpu_tolerance_mib: int
    gpu_timeout_s: float
    slurm_query_timeout_s: float  # [slurm] query_timeout: how long a controller may take
    # [hooks]: defaults for every job's hook keys (on_failure, notify, ...), checked at start
    hooks: dict[str, Any] = field(default_factory=dict)
    # [causes]: extra pattern classes, name = "regex" (supervisor/life/causes.py)
    causes: dict[str, str] = field(default_factory=dict)


# Durations (float) take the spec's syntax (90, "90s", "2m", "1h30m"), under the spec's
# own name where a spec key sets the same thing (grace, kill_wait). The older `_s` names
# (numbers of seconds) are still read, so that no config written for them breaks.
_KEYS: dict[tuple[str, str], tuple[str, type]] = {
    ("state", "home"): ("home", str),
    ("start", "ready_timeout"): ("ready_timeout_s", float),
    ("start", "cgroup"): ("cgroup", bool),
    ("start", "systemd"): ("systemd", bool),
    ("stop", "grace"): ("grace_s", float),
    ("stop", "signal"): ("stop_signal", str),
    ("stop", "order"): ("stop_order", str),
    ("stop", "kill_wait"): ("kill_wait_s", float),
    ("supervisor", "snapshot_interval"): ("snapshot_interval_s", float),
    ("supervisor", "sample_interval"): ("sample_interval_s", float),
    ("logs", "tail_lines"): ("tail_lines", int),
    ("logs", "follow_poll"): ("follow_poll_s", float),
    ("logs", "max_size_mib"): ("log_max_mib", int),
    ("logs", "keep"): ("log_keep", int),
    ("gpu", "foreign_threshold_mib"): ("gpu_foreign_threshold_mib", int),
    ("gpu", "tolerance_mib"): ("gpu_tolerance_mib", int),
    ("gpu", "release_timeout"): ("gpu_timeout_s", float),
    ("slurm", "query_timeout"): ("slurm_query_timeout_s", float),
}
_KEYS.update({(t, f"{k}_s"): v for (t, k), v in list(_KEYS.items()) if v[1] is float})


def _checked(field: str, typ: type, raw: object, what: str) -> object:
    """Return ``raw`` as a value of ``typ``, in range, or raise a one-line ConfigError."""
    if typ is float and isinstance(raw, str):
        raw = parse_duration(raw, what)
    value = float(raw) if typ is float and type(raw) is int else raw
    if not isinstance(value, typ) or (typ is not bool and isinstance(value, bool)):
        raise ConfigError(f"{what} must be {typ.__name__}, got {value!r}")
    if isinstance(value, float):
        check_duration(value, what)
        if field in _POSITIVE and value < 0.01:
            raise ConfigError(f"{what} must be at least 0.01 s")
    elif isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise ConfigError(f"{what} must not be negative")
    return value


# polling intervals: 0 would spin a core
_POSITIVE = {
    "snapshot_interval_s",
    "sample_interval_s",
    "follow_poll_s",
    "ready_timeout_s",
    "slurm_query_timeout_s",
}


def _load(text: str, where: str) -> dict[str, Any]:
    import tomllib  # noqa: PLC0415  (verbs that need no config never pay for it)

    if "\0" in text:
        raise ConfigError(f"{where}: not a text file")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: invalid TOML: {e}") from None


# [hooks] keys, as the spec file spells them (their values are checked like spec keys)
HOOK_KEYS = (*(f"on_{e}" for e in HOOK_EVENTS), "checkpoint_stale", "notify", "hook_timeout")


def _apply_hooks(values: dict[str, Any], entries: dict[str, object], where: str) -> None:
    hooks = dict(values.get("hooks") or {})
    for key, raw in entries.items():
        if key not in HOOK_KEYS:
            raise ConfigError(f"{where}: unknown key hooks.{key} (known: {', '.join(HOOK_KEYS)})")
        hooks[key] = (raw, f"{where}: hooks.{key}")
    values["hooks"] = hooks


def _apply_causes(values: dict[str, Any], entries: dict[str, object], where: str) -> None:
    found = dict(values.get("causes") or {})
    for name, rx in entries.items():
        what = f"{where}: causes.{name}"
        if not re.fullmatch(CLASS_NAME, name) or name in RESTART_WORDS:
            raise ConfigError(f"{what}: a class name is lower-case letters, digits and -")
        if not isinstance(rx, str):
            raise ConfigError(f"{what}: expected a regular expression string")
        try:
            re.compile(rx)
        except re.error as e:
            raise ConfigError(f"{what}: invalid regular expression: {e}") from None
        found[name] = rx
    values["causes"] = found


def _apply(values: dict[str, Any], doc: dict[str, Any], where: str) -> None:
    for table, entries in doc.items():
        if not isinstance(entries, dict):
            raise ConfigError(f"{where}: [{table}] must be a table")
        if table == "hooks":
            _apply_hooks(values, entries, where)
            continue
        if table == "causes":
            _apply_causes(values, entries, where)
            continue
        for key, raw in entries.items():
            if (table, key) not in _KEYS:
                known = [k for t, k in _KEYS if t == table and not k.endswith("_s")]
                near = closest(key, known)
                hint = f"; did you mean {table}.{near}?" if near else ""
                raise ConfigError(f"{where}: unknown key {table}.{key}{hint}")
            field, typ = _KEYS[(table, key)]
            values[field] = _checked(field, typ, raw, f"{where}: {table}.{key}")
    if "stop_order" in values:
        values["stop_order"] = str(parse_order(values["stop_order"], f"{where}: stop.order"))


def user_config_path() -> Path:
    """Return the user's config file path (it may not exist)."""
    if os.environ.get("TRAINCTL_CONFIG"):
        return Path(os.environ["TRAINCTL_CONFIG"])
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(xdg) / "trainctl" / "config.toml"


def load_config() -> Config:
    """Return the shipped defaults overlaid by the user's config file, validated."""
    values: dict[str, Any] = {}
    _apply(values, _load(SHIPPED.read_text(), "conf/trainctl.toml"), "conf/trainctl.toml")
    path = user_config_path()
    try:
        text = path.read_bytes().decode()
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (TOML must be UTF-8)") from None
    except FileNotFoundError:
        if os.environ.get("TRAINCTL_CONFIG"):  # named on purpose: running on defaults is wrong
            raise ConfigError(f"TRAINCTL_CONFIG names {path}, which does not exist") from None
        text = None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    if text is not None:
        _apply(values, _load(text, str(path)), str(path))
    return Config(**values)


def resolve_home(home: str | None, cfg: Config | None) -> Path:
    """--home, else $TRAINCTL_HOME, else the config's state.home, else the XDG default.

    With ``cfg`` None the config is read only if neither flag nor environment decides.
    """
    chosen = home or os.environ.get("TRAINCTL_HOME")
    if not chosen:
        chosen = (cfg or load_config()).home
    path = Path(chosen).expanduser().absolute() if chosen else state.default_home()
    return Path(layout.followed_home(str(path)))  # the user's own symlink: its directory
