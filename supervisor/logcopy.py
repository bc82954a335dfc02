"""An adopted run's own output file, copied into the run's log as it grows.

An adopted main writes where it always wrote (a file behind its stdout); the supervisor
copies what that file gains into ``logs/run-N.log``, so `logs`, the cause analysis and
the hooks read the same log as for any run.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from trainctl.supervisor.model.state import open_in

from .errors import StateError

LOG_COPY_S = 0.5  # how often an adopted run's own output file is copied into its log


class LogCopy:
    """What an adopted run's own file gained, appended to the run's log: one position,
    under a lock, shared by the periodic copy and the last one at the run's end (two
    copies from one position would write the same lines twice)."""

    def __init__(self, source: Path, log: Path) -> None:
        self.source, self.log = source, log
        self.pos: int | None = None  # None: not started (the first copy starts at the end)
        self.lock = threading.Lock()

    def step(self, head: bytes) -> None:
        """Copy what is new (``head`` first)."""
        with self.lock:
            self.pos = copy_new(self.source, self.log, self.pos, head)

    def drain(self) -> None:
        """Copy until nothing is new (4 MiB a round: what a dying job can still write)."""
        with self.lock:
            if self.pos is None:
                return  # the copy never started: the adoption's own note comes first
            for _ in range(64):
                new = copy_new(self.source, self.log, self.pos, b"")
                if new == self.pos:
                    return
                self.pos = new


def copy_new(source: Path, log: Path, pos: int | None, head: bytes) -> int:
    """Append what ``source`` gained past ``pos`` (None: its end now) to ``log``; return
    the new position. Never raises: a vanished or unreadable file costs the copy only."""
    try:
        size = source.stat().st_size
        if pos is None or size < pos:  # the start, or truncated (copytruncate): anew
            pos = size if pos is None else 0
        data = b""
        if size > pos:
            with open(source, "rb") as f:
                f.seek(pos)
                data = f.read(min(size - pos, 1 << 22))
        if head or data:
            fd = open_in(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                os.write(fd, head + data)
            finally:
                os.close(fd)
        return pos + len(data)
    except (OSError, StateError):
        return pos or 0
