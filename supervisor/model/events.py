"""``events.jsonl``: the one encoder and the one reader of a job's event log.

Every line is one JSON object with ``ts`` (seconds since the epoch) and ``event`` (its
kind), written with a single ``write(2)`` on an ``O_APPEND`` descriptor, so the CLI's and
the supervisor's lines never interleave. The supervisor writes through an
:class:`EventLog`, the CLI appends through :func:`append_event`, both with :func:`encode`;
`status`, `history`, `report`, the web page, MCP and the tests read through
:func:`read_events` (the whole log) or :func:`newest_first` (its end, for a look at the
latest stop).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from trainctl.supervisor.linux.files import open_in
from trainctl.supervisor.records import JsonObject

from .tail import read_end

FILE = "events.jsonl"


def path(jdir: Path) -> Path:
    """The job's event log."""
    return jdir / FILE


def encode(doc: dict[str, object]) -> str:
    """One event as its line (no newline): JSON, anything else as its str()."""
    return json.dumps(doc, default=str)


def open_events(jdir: Path) -> int:
    """Open the job's events.jsonl for appending (never through a planted symlink)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    return open_in(path(jdir), flags)


def write_event_line(fd: int, line: str) -> None:
    """Write one event line with a single write(2): with O_APPEND, the CLI's and the
    supervisor's lines never interleave, however long a line is."""
    os.write(fd, line.rstrip("\n").encode() + b"\n")


def append_event(jdir: Path, event: str, **fields: Any) -> None:
    """Append one event, stamped now."""
    line = encode({"ts": round(time.time(), 6), "event": event, **fields})
    fd = open_events(jdir)
    try:
        write_event_line(fd, line)
    finally:
        os.close(fd)


class Sink(Protocol):
    """Where an EventLog's lines go (one whole line a call)."""

    def write(self, text: str) -> None: ...


class EventLog:
    """The supervisor's event log: one stamped line a call, with the fields it is bound
    to (the job's name). ``debug`` lines are dropped: per-orphan "reaped" lines would slow
    a stop of 240 processes by ~15 ms. (It replaced structlog, whose import was a fifth of
    the supervisor's start-up, for the four methods the supervisor used.)"""

    __slots__ = ("_bound", "_sink")

    def __init__(self, sink: Sink, **bound: Any) -> None:
        self._sink, self._bound = sink, bound

    def bind(self, **fields: Any) -> EventLog:
        """The same log, with ``fields`` in every line."""
        return EventLog(self._sink, **{**self._bound, **fields})

    def info(self, event: str, **fields: Any) -> None:
        """Write one event line: the time and the event (as the CLI's lines begin), then
        the bound fields and these."""
        doc = {"ts": round(time.time(), 6), "event": event, **self._bound, **fields}
        self._sink.write(encode(doc))

    warning = info  # the log has no levels: an event's kind says what it is
    error = info

    def debug(self, event: str, **fields: Any) -> None:
        """Not written (see the class)."""


def num(value: object) -> float | None:
    """A JSON number as a float (true and false are not numbers); else None."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def whole(value: object) -> int | None:
    """A JSON integer (a run, a pid); else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def text(value: object) -> str | None:
    """A JSON string; else None."""
    return value if isinstance(value, str) else None


def obj(value: object) -> JsonObject | None:
    """A JSON object (an event's cause, a report); else None."""
    return value if isinstance(value, dict) else None


def _decode(line: bytes) -> JsonObject | None:
    try:
        ev = json.loads(line)
    except ValueError:
        return None
    if isinstance(ev, dict) and isinstance(ev.get("event"), str):
        return ev
    return None


def read_events(jdir: Path) -> list[JsonObject]:
    """Every event of the job, oldest first (unreadable lines skipped)."""
    out = []
    try:
        with open(path(jdir), "rb") as f:
            for line in f:
                ev = _decode(line)
                if ev is not None:
                    out.append(ev)
    except FileNotFoundError:
        pass
    return out


def newest_first(jdir: Path, nbytes: int) -> Iterator[JsonObject]:
    """The events in the log's last ``nbytes``, newest first (a partial first line and
    unreadable lines skipped)."""
    raw, _ = read_end(path(jdir), nbytes)
    for line in reversed(raw.split(b"\n")):
        ev = _decode(line)
        if ev is not None:
            yield ev
