"""``events.jsonl``: the one encoder and the one reader of a job's event log.

Every line is one JSON object with ``ts`` (seconds since the epoch) and ``event`` (its
kind), written with a single ``write(2)`` on an ``O_APPEND`` descriptor, so the CLI's and
the supervisor's lines never interleave. The supervisor writes through an
:class:`EventLog`, the CLI appends through :func:`append_event`, both with :func:`encode`;
`status`, `history`, `report`, the web page, MCP and the tests read through
:func:`read_events` (the whole log) or :func:`newest_first` (its end, for a look at the
latest stop).

**The vocabulary trainctl reads back is typed.** The kinds that `history`, `report`, the
stop's timeline and `status` read (started, code, main_exited, stopping, grace_shortened,
escalated, ended, restart_scheduled, stalled, unstalled, dispatched, deploy) are records
below, one a kind (:data:`KINDS`). Their writers pass the record (``log.info(Ended(...))``,
``append_event(jdir, Started(...))``): a typed kind written by its name alone is refused,
so writer and reader cannot drift apart. Readers take :func:`typed` of a line, which
checks it against its record (a line that does not fit is skipped, never trusted). Every
other kind (signal_sent, hook_failed, gpu_fault...) is a diagnostic for people and tools:
free-form fields, read by nothing in trainctl.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from trainctl.supervisor.errors import StateError
from trainctl.supervisor.linux.files import open_in
from trainctl.supervisor.records import JsonObject, asdict, field, field_names, record

from .reports import Cause, NamedProc
from .schema import build_document
from .sections import CodeRecord
from .tail import read_end

FILE = "events.jsonl"


def path(jdir: Path) -> Path:
    """The job's event log."""
    return jdir / FILE


@record(frozen=True)
class Started:
    """A run's main process is up (boot)."""

    KIND: ClassVar[str] = "started"
    job: str
    run: int
    main_pid: int | None
    argv: list[str]
    cwd: str
    mode: str
    cgroup: str | None = None
    gpus: list[int] = field(default_factory=list)
    resumed_from: str | None = None  # the checkpoint handed ($TRAINCTL_RESUME_FROM)
    from_scratch: bool = False  # `--from-scratch`: nothing handed, no guard
    rolled_back: str | None = None  # back on the code a deploy replaced: why
    # its supervisor was spawned as `trainctl start` began, and imported while the CLI
    # validated (launcher/prespawn.py); False: spawned once the CLI had the spec
    prespawned: bool = False
    ts: float = 0.0


@record(frozen=True)
class Code:
    """The code a run started with (boot, after the CLI's answer). Written flat: the
    run, its cwd and source, then the CodeRecord's own fields."""

    KIND: ClassVar[str] = "code"
    run: int
    cwd: str
    source: str | None = None
    code: CodeRecord | None = None
    ts: float = 0.0


@record(frozen=True)
class MainExited:
    """The run's main process exited (reaped; an adopted one: seen gone)."""

    KIND: ClassVar[str] = "main_exited"
    pid: int
    exit_code: int | None = None
    adopted: bool = False
    ts: float = 0.0


@record(frozen=True)
class Stopping:
    """A stop began: why, its grace and order (``supervisor="gone"``: the CLI's own)."""

    KIND: ClassVar[str] = "stopping"
    reason: str
    grace_s: float
    order: str | None = None  # None: the spec's
    supervisor: str | None = None
    ts: float = 0.0


@record(frozen=True)
class GraceShortened:
    """A later `stop --grace S` brought the running stop's grace closer."""

    KIND: ClassVar[str] = "grace_shortened"
    grace_left_s: float
    ts: float = 0.0


@record(frozen=True)
class Escalated:
    """The grace is over: what was left is frozen and SIGKILLed (a Slurm job: cancelled,
    ``via="scancel"``, with nothing of the rest known here)."""

    KIND: ClassVar[str] = "escalated"
    frozen_by: str | None = None  # cgroup | sigstop
    remaining: int | None = None
    stop_rounds: int | None = None
    victims: list[NamedProc] = field(default_factory=list)
    via: str | None = None
    ts: float = 0.0


@record(frozen=True)
class Ended:
    """The run ended for good (no relaunch): its final phase and cause."""

    KIND: ClassVar[str] = "ended"
    run: int
    phase: str
    cause: Cause | None = None
    ts: float = 0.0


@record(frozen=True)
class RestartScheduled:
    """The run failed and is relaunched after ``backoff_s``: by the restart policy, or
    (``rollback``) back to the code a deploy replaced: the one decision on a failure of
    a deploy's new code (life/lifecycle.py)."""

    KIND: ClassVar[str] = "restart_scheduled"
    backoff_s: float
    restarts: int
    run: int | None = None
    exit_code: int | None = None
    at: float | None = None
    reason: str | None = None
    cause: Cause | None = None
    ts: float = 0.0
    rollback: str | None = None  # back to the previous code: why, in a line


@record(frozen=True)
class Stalled:
    """The stall watchdog saw no progress and no output for ``idle_s``."""

    KIND: ClassVar[str] = "stalled"
    idle_s: float
    on_stall: str
    ts: float = 0.0


@record(frozen=True)
class Unstalled:
    """A stalled run moved again."""

    KIND: ClassVar[str] = "unstalled"
    ts: float = 0.0


@record(frozen=True)
class Dispatched:
    """A queued job's run was started by the queue, after ``waited_s``."""

    KIND: ClassVar[str] = "dispatched"
    job: str
    run: int
    waited_s: float
    gpus: str | None = None
    ts: float = 0.0


@record(frozen=True)
class Deploy:
    """A deploy ended. Its writer is the deployer's whole report (launcher/, results.ops
    DeployReport); these are the fields trainctl reads back, each a field of that report
    (tests/state/test_typed_events.py holds the two together)."""

    KIND: ClassVar[str] = "deploy"
    outcome: str
    from_run: int | None = None
    to_run: int | None = None
    rollback_run: int | None = None
    from_commit: str | None = None
    to_commit: str | None = None
    checkpoint: str | None = None
    ts: float = 0.0


Event = (
    Started | Code | MainExited | Stopping | GraceShortened | Escalated | Ended
    | RestartScheduled | Stalled | Unstalled | Dispatched | Deploy
)  # fmt: skip
_TYPED: tuple[type[Event], ...] = (
    Started, Code, MainExited, Stopping, GraceShortened, Escalated, Ended,
    RestartScheduled, Stalled, Unstalled, Dispatched, Deploy,
)  # fmt: skip
KINDS: dict[str, type[Event]] = {c.KIND: c for c in _TYPED}
_CODE_FIELDS = frozenset(field_names(CodeRecord))


def fields_of(ev: Event) -> JsonObject:
    """A typed event's fields as its line has them (no ``ts``, no ``event``)."""
    doc = asdict(ev)
    del doc["ts"]
    for name in doc:
        value = getattr(ev, name)
        if hasattr(value, "to_doc"):  # a record's own JSON form (a cause leaves out its Nones)
            doc[name] = value.to_doc()
    if isinstance(ev, Code):  # flat: the CodeRecord's fields beside the run's
        code = doc.pop("code") or {}
        doc.update(code)
    return doc


def typed(doc: JsonObject) -> Event | None:
    """The typed event of a line read back (see the module), or None: a kind that is not
    typed, or a line that does not fit its record (never trusted)."""
    cls = KINDS.get(str(doc.get("event")))
    if cls is None:
        return None
    if cls is Code:  # flat (see fields_of); none of its fields: no code was recorded
        doc = {**doc, "code": {k: v for k, v in doc.items() if k in _CODE_FIELDS} or None}
    try:
        return build_document(cls, doc, f"the {cls.KIND} event")
    except (StateError, TypeError, ValueError):
        return None


def _line_doc(event: str | Event, fields: dict[str, Any], bound: dict[str, Any]) -> JsonObject:
    """The document of one line: the time and the kind first, then the bound fields and
    the event's own. A typed kind must come as its record (see the module)."""
    if isinstance(event, str):
        if event in KINDS:
            typed_as = KINDS[event].__name__
            raise TypeError(f"the {event!r} event is typed: write events.{typed_as}(...)")
        return {"ts": round(time.time(), 6), "event": event, **bound, **fields}
    return {"ts": round(time.time(), 6), "event": event.KIND, **bound, **fields_of(event), **fields}


def encode(doc: Mapping[str, object]) -> str:
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


def append_event(jdir: Path, event: str | Event, **fields: Any) -> None:
    """Append one event, stamped now: a typed one as its record (``fields``: more of its
    line, such as the CLI's ``via``), any other kind by its name and fields."""
    line = encode(_line_doc(event, fields, {}))
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
    to (the job's name), in events.jsonl, the job's record.

    The supervisor's own diagnostics go to its diagnostic log as well once it has one
    (supervisor/diag.py, structlog, set after the readiness reply): ``warning`` and
    ``error`` lines at their level, ``debug`` lines there only (filtered by level there:
    per-orphan "reaped" lines in events.jsonl would slow a stop of 240 processes by ~15 ms).
    """

    __slots__ = ("_bound", "_diag", "_sink")

    def __init__(self, sink: Sink, *, _diag: list[Any] | None = None, **bound: Any) -> None:
        self._sink, self._bound = sink, bound
        self._diag: list[Any] = [] if _diag is None else _diag  # shared by bound copies

    def bind(self, **fields: Any) -> EventLog:
        """The same log, with ``fields`` in every line."""
        return EventLog(self._sink, _diag=self._diag, **{**self._bound, **fields})

    def divert(self, diag: Any) -> None:
        """From now on, diagnostics go to ``diag`` too (a structlog bound logger)."""
        self._diag[:] = [diag]

    def info(self, event: str | Event, **fields: Any) -> None:
        """Write one event line: the time and the event (as the CLI's lines begin), then
        the bound fields and the event's (a typed one as its record, see the module)."""
        self._sink.write(encode(_line_doc(event, fields, self._bound)))

    def warning(self, event: str | Event, **fields: Any) -> None:
        """An event line, and a diagnostic at level warning."""
        self.info(event, **fields)
        self._tell("warning", event, fields)

    def error(self, event: str | Event, **fields: Any) -> None:
        """An event line, and a diagnostic at level error."""
        self.info(event, **fields)
        self._tell("error", event, fields)

    def debug(self, event: str | Event, **fields: Any) -> None:
        """A diagnostic only (kept with TRAINCTL_SUPERVISOR_DEBUG=1, see diag.py)."""
        self._tell("debug", event, fields)

    def _tell(self, level: str, event: str | Event, fields: dict[str, Any]) -> None:
        if not self._diag:
            return
        name = event if isinstance(event, str) else event.KIND
        with contextlib.suppress(Exception):  # a diagnostic must never cost the supervisor
            getattr(self._diag[0], level)(name, **fields)


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


def read_typed(jdir: Path) -> list[Event]:
    """The job's events of the typed kinds (see the module), oldest first."""
    return [ev for doc in read_events(jdir) if (ev := typed(doc)) is not None]


class Follow:
    """The typed events appended to a job's log from the moment this is made: each look
    reads only what was appended since the last one (whole lines; a line still being
    written waits for the next look). How the CLI follows a run without reading
    state.json over and over (issue 55)."""

    def __init__(self, jdir: Path) -> None:
        self.path = path(jdir)
        try:
            self.offset = os.stat(self.path).st_size
        except OSError:
            self.offset = 0
        self.partial = b""

    def new(self) -> list[Event]:
        """The typed events appended since the last look, oldest first."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return [ev for line in lines if (doc := _decode(line)) and (ev := typed(doc))]


def newest_typed(jdir: Path, nbytes: int) -> Iterator[Event]:
    """The typed events in the log's last ``nbytes``, newest first."""
    for doc in newest_first(jdir, nbytes):
        ev = typed(doc)
        if ev is not None:
            yield ev


def newest_first(jdir: Path, nbytes: int) -> Iterator[JsonObject]:
    """The events in the log's last ``nbytes``, newest first (a partial first line and
    unreadable lines skipped)."""
    raw, _ = read_end(path(jdir), nbytes)
    for line in reversed(raw.split(b"\n")):
        ev = _decode(line)
        if ev is not None:
            yield ev
