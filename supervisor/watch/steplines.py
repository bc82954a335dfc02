"""A run's progress lines, read as they are written: the steps its $TRAINCTL_PROGRESS and
(with a ``progress_regex``) its log gained since the last look.

Three readers use it. The checkpoint guard (guard.py) wants the run's first step within a
tenth of a second, the deploy's gate its first step (launcher/checkpoint.py). The stamper
(:class:`StepStamper`) times the lines that carry no time of their own (a
``progress_regex`` line; a ``{"step": N}`` line without ``t``, as people write them) by
their file's mtime when a look finds them, and appends them to ``logs/run-N.steps.jsonl``:
goodput, the ETA and a checkpoint's step then read those times, where a sample every 15 s
gave ``report`` a start-up of 0.9 s against 5.7 s measured and no progress at all for a
run under 30 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

from trainctl.supervisor.linux.files import open_in
from trainctl.supervisor.model.state import log_path, progress_path
from trainctl.supervisor.model.steps import number, progress_of, steps_path

READ_MAX = 1 << 20  # the most of a file one look reads (the rest waits for the next)
# The stamper's look: an fstat of each file, a read when it grew. A point is timed by its
# file's mtime (the newest line's own write), whenever it is looked at, so the pace sets
# how many points there are, not how true their times are. It looks every STEP_LOOK_S
# until the run's first step (start-up ends there; the first look that sees lines may
# see several), for STEP_FIRST_S at most, then every STEP_QUIET_S. Measured on this VM,
# a supervisor of a job printing 20 step lines a second: 1.25 % of a core at 20 looks a
# second, 1.05 % at 10, 0.30 % at 2. Sparse points read a checkpoint's step low (the
# newest point before it: a lower bound, which the guard wants); report interpolates.
STEP_LOOK_S = 0.05
STEP_QUIET_S = 0.5
STEP_FIRST_S = 60.0  # a run with no step by then: its looks slow down anyway


class StepReader:
    """The steps the run's files gained since the last look, each look reading only the
    whole lines added since (a line still being written waits for the next look)."""

    def __init__(self, jdir: Path, run: int, regex: str | None, *, untimed_only: bool = False):
        self._files: list[tuple[Path, re.Pattern[str] | None]] = [(progress_path(jdir, run), None)]
        if regex:
            self._files.append((log_path(jdir, run), re.compile(regex)))
        self._seen = [0] * len(self._files)
        self._untimed_only = untimed_only  # skip $TRAINCTL_PROGRESS lines with their own t

    def look(self, limit: int = READ_MAX) -> list[tuple[float, float]]:
        """(when, step) of the steps reported since the last look, in file order (the
        progress file first); ``when`` is the file's mtime as read: the time of its last
        write, the newest line's own time to the kernel's clock tick."""
        out: list[tuple[float, float]] = []
        for i, (path, rx) in enumerate(self._files):
            out += self._look_in(i, path, rx, limit)
        return out

    def _look_in(
        self, i: int, path: Path, rx: re.Pattern[str] | None, limit: int
    ) -> list[tuple[float, float]]:
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_size < self._seen[i]:
                    self._seen[i] = 0  # rotated or truncated: its new lines start at 0
                if st.st_size == self._seen[i]:
                    return []  # nothing new: one fstat a look
                f.seek(self._seen[i])
                data = f.read(limit)
        except OSError:
            return []
        whole = data[: data.rfind(b"\n") + 1]
        self._seen[i] += len(whole)
        steps = []
        for raw in whole.split(b"\n"):
            step = self._step_of(raw.decode(errors="replace"), rx)
            if step is not None:
                steps.append((st.st_mtime, step))
        return steps

    def _step_of(self, line: str, rx: re.Pattern[str] | None) -> float | None:
        if rx is not None:
            nums = progress_of(line, rx)
            return None if nums is None else nums["step"]
        if '"step"' not in line:
            return None
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and not (self._untimed_only and "t" in doc):
                return number(doc.get("step"))
        return None


class StepStamper:
    """Times the run's untimed progress lines as they are written: each look (see
    STEP_LOOK_S; one fstat when nothing is new) that finds new steps appends its newest,
    timed by the file's mtime (its last write: that line's own time), to the run's
    ``steps.jsonl``; the run's very first step too, so its start-up ends where it did.
    One short line a look, whatever the rate of steps: a point may be many steps on from
    the one before, and readers take the time per step from both (goodput)."""

    def __init__(self, jdir: Path, run: int, regex: str | None) -> None:
        self._reader = StepReader(jdir, run, regex, untimed_only=True)
        self._out = steps_path(log_path(jdir, run))
        self.newest: float | None = None

    def look(self, now: float) -> float | None:
        """Stamp what is new (never later than ``now``); the newest step so far."""
        steps = self._reader.look()
        if not steps:
            return self.newest
        first = self.newest is None and len(steps) > 1
        points = [steps[0], steps[-1]] if first else steps[-1:]
        lines = b"".join(
            json.dumps({"t": round(min(t, now), 3), "step": s}).encode() + b"\n" for t, s in points
        )
        with contextlib.suppress(OSError):
            fd = open_in(self._out, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                os.write(fd, lines)
            finally:
                os.close(fd)
        self.newest = steps[-1][1]
        return self.newest
