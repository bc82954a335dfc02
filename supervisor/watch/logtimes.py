"""When each part of a run's log was written: ``logs/run-N.log.times``, beside the raw log.

The job writes its log itself (the supervisor is not in its data path), so the times are
taken by looking: every :data:`STAMP_S` the supervisor reads the log's size, and when it
has grown it appends one line ``SIZE TIME`` (bytes, unix seconds). A line of the log that
ends at offset E was written at the time of the first stamp whose SIZE is at least E, to
within STAMP_S. The log itself stays byte for byte the job's own.

A rotation (copytruncate: the log shrinks) starts the times file again, so it always
describes the log file as it is. Two stamps a second at most, for a log that grows all
the time: about 4 MB a day of a chatty run, and nothing while the job is quiet.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import time
from pathlib import Path

from trainctl.supervisor.errors import StateError
from trainctl.supervisor.linux.files import open_in
from trainctl.supervisor.records import field, record

STAMP_S = 0.5  # how often the log's size is looked at (the times' resolution)
_MAX_STAMP_BYTES = 64


def times_path(log: Path) -> Path:
    """The times file of ``log``."""
    return log.with_name(log.name + ".times")


@record()
class LogStamper:
    """Appends a stamp each time the log has grown since the last look."""

    log: Path
    last_size: int = 0
    _fd: int | None = field(default=None, repr=False)

    def step(self, now: float | None = None) -> None:
        """Look at the log once; never raises (a full disk costs the times, not the job)."""
        try:
            size = os.stat(self.log, follow_symlinks=False).st_size
        except OSError:
            return
        if size == self.last_size:
            return
        with contextlib.suppress(OSError, StateError):
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            if size < self.last_size:  # rotated: the times start again with the log
                self._close()
                flags |= os.O_TRUNC
            if self._fd is None:
                self._fd = open_in(times_path(self.log), flags)
            os.write(self._fd, f"{size} {time.time() if now is None else now:.3f}\n".encode())
            self.last_size = size

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@record(frozen=True)
class Stamps:
    """A log's stamps, read back: (size, time) pairs in order."""

    sizes: tuple[int, ...] = ()
    times: tuple[float, ...] = ()

    def time_of(self, end: int) -> float | None:
        """When the byte before offset ``end`` was written (None: after the last look)."""
        i = bisect.bisect_left(self.sizes, end)
        return self.times[i] if i < len(self.times) else None


def read_stamps(log: Path) -> Stamps:
    """The stamps of ``log`` (none when it has no times file: an older run, a Slurm node)."""
    try:
        raw = times_path(log).read_bytes()
    except OSError:
        return Stamps()
    sizes: list[int] = []
    times: list[float] = []
    for line in raw.split(b"\n")[:-1]:  # the last piece is '' or a line being written
        parts = line.split()
        if len(parts) != 2 or len(line) > _MAX_STAMP_BYTES:
            continue  # a torn last line, or not ours
        try:
            size, at = int(parts[0]), float(parts[1])
        except ValueError:
            continue
        if sizes and size <= sizes[-1]:
            continue
        sizes.append(size)
        times.append(at)
    return Stamps(tuple(sizes), tuple(times))
