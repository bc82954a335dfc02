"""Which step a run was at, from what it reported: its $TRAINCTL_PROGRESS lines, the
lines the supervisor stamped as they were written (steplines.py) and, for a
``progress_regex``, its log's lines timed by their stamps (logtimes.py).

The checkpoint guard dates a checkpoint with no step of its own by it (:func:`step_before`),
and `stop`, `deploy` and `status` tell a checkpoint's step the same way
(:func:`run_step_lookup`). Apart from the guard (guard.py) so that `status` reads steps
without loading what keeps a checkpoint aside (shutil, keepsafe).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from trainctl.supervisor.model import checkpoints
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import log_path, progress_path
from trainctl.supervisor.model.steps import progress_of, steps_path, timed_steps
from trainctl.supervisor.model.tail import read_end, tail_lines

from .logtimes import read_stamps

STEP_TAIL = 256 << 10
RUNS_BACK = 5  # the runs whose progress may date a checkpoint with no step in its name


def run_points(jdir: Path, run: int, regex: str | None = None) -> list[tuple[float, float]]:
    """(time, step) of what run ``run`` reported, oldest first: the ``t`` of its
    $TRAINCTL_PROGRESS lines, the lines the supervisor stamped (steplines.py) and, for a
    ``progress_regex``, the log's lines timed by its stamps (logtimes.py). Each time is a
    bound from above (a line is never timed before it was written)."""
    files = [progress_path(jdir, run), steps_path(log_path(jdir, run))]
    points = [p for f in files for p in timed_steps(tail_lines(f, STEP_TAIL))]
    if regex:
        points += _log_steps(log_path(jdir, run), re.compile(regex))
    return sorted(points)


def run_step_lookup(
    jdir: Path, run: int, regex: str | None = None
) -> Callable[[float], float | None]:
    """Run ``run``'s progress step at a moment: the newest step it reported before it
    (a lower bound); None before any. Its lines are read on the first look only."""
    return checkpoints.step_at(lambda: run_points(jdir, run, regex))


def _log_steps(log: Path, rx: re.Pattern[str]) -> list[tuple[float, float]]:
    """(time, step) of the log's last lines that ``rx`` matches, each timed by the stamp
    of the look that first saw it (within 0.5 s)."""
    stamps = read_stamps(log)
    if not stamps.times:
        return []
    data, _ = read_end(log, STEP_TAIL)
    try:
        size = log.stat().st_size
    except OSError:
        return []
    offset = size - len(data)
    out = []
    for raw in data.split(b"\n"):
        offset += len(raw) + 1
        nums = progress_of(raw.decode(errors="replace"), rx)
        at = stamps.time_of(offset - 1)
        if nums is not None and at is not None:
            out.append((at, nums["step"]))
    return out


def step_before(
    jdir: Path, run: int, spec: Spec, mtime: float, run_started: float | None = None
) -> float | None:
    """The step of a checkpoint written at ``mtime`` with no step of its own: the newest
    step reported before it by the run that wrote it. ``run_started``: when run ``run``
    began; a file written since was written by it, and only its own steps date it: one
    it wrote before its first report (nanoGPT saves again at the iteration it resumed
    at) holds less than its first step, never the steps an earlier run reached after its
    last save (they were lost; taking them was a guard stopping a run that resumed).
    Else the newest of the last runs that reported a step by then."""
    for r in range(run, max(0, run - RUNS_BACK), -1):
        points = run_points(jdir, r, spec.watch.progress_regex)
        before = [s for t, s in points if t <= mtime + checkpoints.COARSE_CLOCK_S]
        if r == run and run_started is not None and mtime >= run_started:
            if before:
                return before[-1]
            after = [s for t, s in points if t > mtime]
            return max(0.0, after[0] - 1) if after else None
        if before:
            return before[-1]
    return None
