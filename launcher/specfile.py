"""Job spec files (``conf/jobs/NAME.toml``) and ``--set key=value``.

Every start flag has a spec key. Precedence, lowest first: conf/trainctl.toml, the user's
config, the spec file, ``--set``, explicit flags. Validation names the file, the key and
its line; unknown keys are errors, never silently ignored.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainctl.supervisor.errors import ConfigError
from trainctl.supervisor.model.spec import parse_order
from trainctl.supervisor.model.state import check_name
from trainctl.supervisor.records import fields, record, replace

from .inputs import check_env_key, closest, parse_duration, parse_signal


def _str(v: object, what: str) -> str:
    if not isinstance(v, str):
        raise ConfigError(f"{what}: expected a string, got {type(v).__name__}")
    return _no_nul(v, what)


def _no_nul(v: str, what: str) -> str:
    """No NUL: no path, argument or environment value can hold one (execve, open)."""
    if "\0" in v:
        raise ConfigError(f"{what}: {v!r} holds a NUL character")
    return v


def _text(v: object, what: str) -> str:
    """A string that names something (a path, a partition): '' is a slip, not a value."""
    if not _str(v, what).strip():
        raise ConfigError(f"{what}: an empty value; give one or leave the key out")
    return str(v)


def _stall_timeout(v: object, what: str) -> float | str:
    """A duration, or "auto": a deadline the supervisor learns from the run's steps."""
    if v == "auto":
        return "auto"
    return parse_duration(v, what)


def _bool(v: object, what: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{what}: expected true or false")
    return v


def _name(v: object, what: str) -> str:
    try:
        return check_name(_str(v, what))
    except ConfigError as e:
        if str(e).startswith(what):
            raise
        raise ConfigError(f"{what}: {e}") from None


def _int(v: object, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > 10**12:
        raise ConfigError(f"{what}: expected a non-negative integer (at most 10**12)")
    return v


def _argv(v: object, what: str) -> list[str]:
    if isinstance(v, str):
        try:
            argv = shlex.split(v)
        except ValueError as e:  # an unclosed quote
            raise ConfigError(f"{what}: cannot split {v!r} like a shell would: {e}") from None
        if not argv:
            raise ConfigError(f"{what}: the command is empty")
        return argv
    if isinstance(v, list) and v and all(isinstance(a, str) for a in v):
        return [_no_nul(a, what) for a in v]
    raise ConfigError(f"{what}: expected a non-empty list of strings (or one command string)")


def _env(v: object, what: str) -> dict[str, str]:
    if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
        raise ConfigError(f"{what}: expected a table of string values")
    return {check_env_key(k, what): _no_nul(x, what) for k, x in v.items()}


def _gpus(v: object, what: str) -> str:
    if isinstance(v, bool):
        raise ConfigError(f"{what}: expected 0,3 / N / all / UUIDs")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return ",".join(str(x) for x in v) + ("," if len(v) == 1 else "")
    return _str(v, what)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|K|M|G|T)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _size(v: object, what: str) -> int:
    """Bytes from 1048576, "500MiB", "1GiB", "2G"; 0 means no limit."""
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    m = _SIZE.match(v) if isinstance(v, str) else None
    if m is None:
        raise ConfigError(f"{what}: expected a size such as 500MiB or 1GiB, got {v!r}")
    size = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()[:1]])
    if size > 1 << 50:
        raise ConfigError(f"{what}: {v!r} is larger than any disk")
    return size


def _tolerance(v: object, what: str) -> float | str:
    """Steps a resumed run may start below its checkpoint's (a number >= 0), or "off"."""
    if v == "off":
        return "off"
    if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < float("inf"):
        return float(v)
    raise ConfigError(f'{what}: expected a number of steps (0 or more) or "off", got {v!r}')


def _choice(*options: str) -> Callable[[object, str], str]:
    def check(v: object, what: str) -> str:
        if v not in options:
            raise ConfigError(f"{what}: expected one of {', '.join(options)}, got {v!r}")
        return str(v)

    return check


def _codes(v: object, what: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and 0 <= x < 256 for x in v):
        raise ConfigError(f"{what}: expected a list of exit codes (0-255)")
    return list(v)


def _strlist(v: object, what: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
        raise ConfigError(f"{what}: expected a list of strings")
    return list(v)


def _memory(v: object, what: str) -> int:
    """A memory cap: "64G", "512M", bytes; at least 1 MiB (less cannot even exec)."""
    size = _size(v, what)
    if size < 1 << 20:
        raise ConfigError(f"{what}: {v!r} is below 1 MiB; a job cannot run in that")
    return size


def _hook(v: object, what: str) -> list[str]:
    """A hook: an argv list, or one string split like a shell would (no shell runs it)."""
    return _argv(v, what)


def _on_stall(v: object, what: str) -> str | list[str]:
    """``mark`` / ``restart`` (what the watchdog does, the older form), else a hook."""
    if v in ("mark", "restart"):
        return str(v)
    return _hook(v, what)


# scheme, host (a name, an IPv4 or a bracketed IPv6 address), port, then path/query/#topic;
# a regex, not urllib.parse, which `status` would pay ~1.7 ms to import
_URL = re.compile(
    r"^https?://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
    r"(?::(?P<port>\d{1,5}))?(?:[/?#]\S*)?$"
)


def _url(v: object, what: str) -> str:
    """An http(s) URL with a host (ntfy's topic may be its #fragment)."""
    text = _str(v, what).strip()
    m = _URL.match(text)
    if m is None:
        raise ConfigError(
            f"{what}: {v!r} is not an http(s) URL (e.g. https://ntfy.sh/#my-runs or a "
            "Slack/Discord incoming-webhook URL)"
        )
    if m["port"] is not None and not 0 < int(m["port"]) < 65536:
        raise ConfigError(f"{what}: {v!r} has an invalid port")
    return text


def _restart_on(v: object, what: str) -> list[str]:
    """A list of causes (one string is a list of one); names are checked at start."""
    words = [v] if isinstance(v, str) else v
    if not isinstance(words, list) or not words or not all(isinstance(w, str) for w in words):
        raise ConfigError(f'{what}: expected a list of causes, e.g. ["oom", "exit:29"]')
    return [w.strip() for w in words]


def _regex(v: object, what: str) -> str:
    text = _str(v, what)
    try:
        rx = re.compile(text)
    except re.error as e:
        raise ConfigError(f"{what}: invalid regular expression: {e}") from None
    if not rx.groupindex:
        raise ConfigError(f"{what}: needs named groups, e.g. (?P<step>\\d+)")
    return text


def _signal(v: object, what: str) -> str:
    try:
        return parse_signal(str(v))
    except ConfigError as e:
        raise ConfigError(f"{what}: {e}") from None


def _order(v: object, what: str) -> str:
    return str(parse_order(v, what))


# key -> validator. Durations become seconds.
KEYS: dict[str, Callable[[object, str], Any]] = {
    "name": _name,
    "argv": _argv,
    "cwd": _text,
    "env": _env,
    "grace": parse_duration,
    "stop_signal": _signal,
    "stop_order": _order,
    "kill_wait": parse_duration,
    "log_max_size": _size,
    "log_keep": _int,
    "gpus": _gpus,
    "share": _bool,
    "force": _bool,
    "tty": _bool,
    "gpu_timeout": parse_duration,
    "min_gpus": _int,
    "checkpoint": _text,
    "checkpoint_signal": _signal,
    "checkpoint_keep_max": _size,
    "resume_tolerance": _tolerance,
    "progress_regex": _regex,
    "total_steps": _int,
    "stall_timeout": _stall_timeout,
    "restart": _choice("never", "on-failure"),
    "max_restarts": _int,
    "restart_backoff": parse_duration,
    "restart_backoff_max": parse_duration,
    "restart_exit_codes": _codes,
    "backend": _choice("local", "slurm"),
    "nodes": _int,
    "gpus_per_node": _int,
    "partition": _text,
    "time": _text,
    "sbatch_args": _strlist,
    "restart_on": _restart_on,
    "restart_window": parse_duration,
    "restart_no_progress": _int,
    "stall_action": _choice("mark", "restart"),
    "stall_grace": parse_duration,
    "on_start": _hook,
    "on_exit": _hook,
    "on_failure": _hook,
    "on_stall": _on_stall,
    "on_restart": _hook,
    "on_checkpoint_stale": _hook,
    "on_deploy_failed": _hook,
    "checkpoint_stale": parse_duration,
    "notify": _url,
    "hook_timeout": parse_duration,
    "memory_max": _memory,
    "memory_high": _memory,
    "snapshot": _choice("none", "git", "copy"),
    "snapshot_keep": _int,
    "snapshot_max": _size,
    "snapshot_exclude": _strlist,
}


@record(frozen=True)
class SpecDraft:
    """The spec keys a start was given, each checked; None: not given at this layer.

    A start merges three drafts, each later one winning key by key: the spec file, then
    every ``--set``, then the flags. The field names are the spec file's keys (``KEYS``).
    """

    name: str | None = None
    argv: list[str] | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    grace: float | None = None
    stop_signal: str | None = None
    stop_order: str | None = None
    kill_wait: float | None = None
    log_max_size: int | None = None
    log_keep: int | None = None
    gpus: str | None = None
    share: bool | None = None
    force: bool | None = None
    tty: bool | None = None  # main on a pseudo-terminal (`trainctl attach`)
    gpu_timeout: float | None = None
    min_gpus: int | None = None  # a GPU fault restarts the run on the healthy ones left
    checkpoint: str | None = None
    checkpoint_signal: str | None = None
    checkpoint_keep_max: int | None = None
    resume_tolerance: float | str | None = None  # steps, or "off": no checkpoint guard
    progress_regex: str | None = None
    total_steps: int | None = None
    stall_timeout: float | str | None = None  # seconds, or "auto"
    restart: str | None = None
    max_restarts: int | None = None
    restart_backoff: float | None = None
    restart_backoff_max: float | None = None
    restart_exit_codes: list[int] | None = None
    backend: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    partition: str | None = None
    time: str | None = None
    sbatch_args: list[str] | None = None
    restart_on: list[str] | None = None
    restart_window: float | None = None
    restart_no_progress: int | None = None
    stall_action: str | None = None
    stall_grace: float | None = None  # the grace of a stall's stop (default: grace, at most 10 s)
    on_start: list[str] | None = None
    on_exit: list[str] | None = None
    on_failure: list[str] | None = None
    on_stall: str | list[str] | None = None  # "mark"/"restart" (the action) or a hook
    on_restart: list[str] | None = None
    on_checkpoint_stale: list[str] | None = None
    on_deploy_failed: list[str] | None = None
    checkpoint_stale: float | None = None
    notify: str | None = None
    hook_timeout: float | None = None
    memory_max: int | None = None
    memory_high: int | None = None
    snapshot: str | None = None
    snapshot_keep: int | None = None
    snapshot_max: int | None = None
    snapshot_exclude: list[str] | None = None

    def merged(self, later: SpecDraft) -> SpecDraft:
        """This draft with every key ``later`` gives; ``env`` is merged, later winning."""
        given = {k: v for k, v in later.given().items() if k != "env"}
        env = {**(self.env or {}), **(later.env or {})}
        return replace(self, **given, env=env or None)

    def given(self) -> dict[str, Any]:
        """The keys this draft sets, by name (for messages and the Slurm section)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


def _line_of(text: str, key: str) -> int | None:
    for n, line in enumerate(text.splitlines(), 1):
        if re.match(rf"^\s*{re.escape(key)}\s*=", line):
            return n
    return None


def load_spec_file(path: str, *, check_cwd: bool = True) -> SpecDraft:
    """Read and validate a job spec file; relative ``cwd`` is relative to the file.

    ``check_cwd`` False: for reading a spec meant for another machine (the shipped
    examples name /srv paths), not for starting it here.
    """
    p = Path(path).expanduser()
    try:
        text = p.read_bytes().decode()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read job spec: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (TOML must be UTF-8)") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    _refuse_unknown(path, text, [k for k in doc if k not in KEYS])
    out: dict[str, Any] = {}
    for key, value in doc.items():
        line = _line_of(text, key)
        where = f"{path}:{line}: {key}" if line else f"{path}: {key}"
        out[key] = KEYS[key](value, where)
    if "cwd" in out:
        out["cwd"] = str((p.parent / Path(out["cwd"]).expanduser()).resolve())
        if check_cwd and not Path(out["cwd"]).is_dir():
            line = _line_of(text, "cwd")
            raise ConfigError(f"{path}:{line}: cwd: directory {out['cwd']} does not exist")
    elif "argv" in out:
        out["cwd"] = str(p.parent.resolve())
    return SpecDraft(**out)


def file_changes(spec_file: str, recorded: dict[str, Any]) -> list[str]:
    """The keys whose value in the spec file now differs from what it gave at start."""
    try:
        now = load_spec_file(spec_file, check_cwd=False).given()
    except ConfigError as e:
        return [f"now invalid: {e}"]
    return [k for k in sorted({*now, *recorded}) if now.get(k) != recorded.get(k)]


def _refuse_unknown(path: str, text: str, unknown: list[str]) -> None:
    """Every unknown key at once, each with its line and the key it is closest to."""
    if not unknown:
        return
    if len(unknown) == 1:
        key = unknown[0]
        line = _line_of(text, key)
        where = f"{path}:{line}: {key}" if line else f"{path}: {key}"
        raise ConfigError(f"{where}: unknown key{closest_key(key)}")
    parts = []
    for key in unknown:
        line = _line_of(text, key)
        near = closest(key, list(KEYS))
        said = [f"line {line}"] if line else []
        said += [f"did you mean {near}?"] if near else []
        parts.append(f"{key} ({'; '.join(said)})" if said else key)
    raise ConfigError(
        f"{path}: {len(unknown)} unknown keys: {', '.join(parts)} "
        "(every key is listed in docs/training.md, under Job specs)"
    )


def closest_key(key: str) -> str:
    """`; did you mean grace?` for a misspelt key, else where the keys are listed."""
    near = closest(key, list(KEYS))
    if near:
        return f"; did you mean {near}?"
    return " (every key is listed in docs/training.md, under Job specs)"


def parse_sets(pairs: tuple[str, ...] | list[str]) -> SpecDraft:
    """Parse ``--set key=value`` (the value is TOML when it parses as TOML, else a string)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep and key in KEYS:
            raise ConfigError(f"--set {pair!r}: give {key} a value: --set {key}=VALUE")
        if key not in KEYS:
            raise ConfigError(f"--set {pair!r}: {key!r} is not a spec key{closest_key(key)}")
        try:
            value: Any = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        out[key] = KEYS[key](value, f"--set {key}")
    return SpecDraft(**out)
