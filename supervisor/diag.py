"""The supervisor's own diagnostic log, through structlog: ``logs/supervisor.jsonl``.

One JSON line a call, with its level, its time, and the job and run it is bound to:
what the supervisor had to say about itself (a hook that failed, a state write that
failed, a copy that could not be kept, its crash's traceback, its exit), apart from
events.jsonl, which stays the job's typed record (model/events.py). ``debug`` lines
(each orphan reaped, each watcher's look) are kept only with
``TRAINCTL_SUPERVISOR_DEBUG=1``: a stop of 240 processes writes none by default.

structlog is imported here only, and only after the supervisor has answered the CLI
(service.Owner.run): ``start`` waits for none of its ~10 ms of imports. Those imports
still run while the job starts, on the same cores: structlog's development helpers
(``structlog.dev``, ``structlog.tracebacks``) import rich, and through it pygments and
attrs, whenever rich is installed (typer brings it; so do many ML environments): 30 ms of
CPU more, in every run's start and restart, for a console renderer this JSON file never
uses. So the supervisor, which never prints to a terminal, hides those optional
packages from structlog (:data:`UNUSED_EXTRAS`) before it imports it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Protocol

from .model.events import encode
from .model.state import open_append

DEBUG_VAR = "TRAINCTL_SUPERVISOR_DEBUG"
LOG_NAME = "supervisor.jsonl"  # <job>/logs/supervisor.jsonl, every run's lines
# structlog's optional console helpers: a None in sys.modules makes their import fail,
# which structlog takes as "not installed" (40 -> 11 ms of CPU here, rich installed)
UNUSED_EXTRAS = ("rich", "colorama", "better_exceptions")


class Diag(Protocol):
    """What the event log calls: structlog's bound logger, by its levels."""

    def debug(self, event: str, **kw: Any) -> Any: ...
    def info(self, event: str, **kw: Any) -> Any: ...
    def warning(self, event: str, **kw: Any) -> Any: ...
    def error(self, event: str, **kw: Any) -> Any: ...


def open_diag(jdir: Path, job: str, run: int) -> Diag | None:
    """The run's diagnostic logger (None when its file cannot be opened: the run goes on,
    and its diagnostics are in events.jsonl as ever)."""
    try:
        fd = open_append(jdir / "logs" / LOG_NAME)
    except (OSError, ValueError):
        return None
    for name in UNUSED_EXTRAS:  # unless something of the supervisor's loaded it already
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    import structlog  # noqa: PLC0415  (after the readiness reply: see the module)

    level = logging.DEBUG if os.environ.get(DEBUG_VAR) == "1" else logging.INFO
    logger: Diag = structlog.wrap_logger(
        structlog.WriteLogger(os.fdopen(fd, "a", buffering=1)),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt=None, utc=True, key="ts"),
            structlog.processors.format_exc_info,
            _line,  # the event log's own encoder: one JSON encoder in the supervisor
        ],
        cache_logger_on_first_use=True,
    ).bind(job=job, run=run, pid=os.getpid())
    return logger


def _line(_logger: object, _method: str, doc: MutableMapping[str, Any]) -> str:
    """structlog's last processor: the line, as every event line is encoded."""
    return encode(doc)
