"""Timed samples of a job's progress, for an ETA measured over a recent window.

A job that reports progress only through log lines (``progress_regex``) gives steps
without times: the CLI sees the steps in the log's tail, but not when each was printed.
The supervisor, which is running anyway, samples the newest step every SAMPLE_S or so
and appends ``{"t": ..., "step": ...}`` to ``logs/run-N.steps.jsonl``; the ETA is then
the rate of the same recent window of steps and times.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .state import open_in

TAIL_BYTES = 64 * 1024  # the newest step is near the end of the log


def steps_path(log: Path) -> Path:
    """Where the samples of the run whose log is ``log`` go."""
    return log.with_name(log.name.removesuffix(".log") + ".steps.jsonl")


def newest_step(log: Path, rx: re.Pattern[str]) -> float | None:
    """Return the step of the last log line that ``rx`` matches (group ``step``)."""
    try:
        fd = open_in(log, os.O_RDONLY)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - TAIL_BYTES))
        lines = f.read().decode(errors="replace").splitlines()
    for line in reversed(lines):
        m = rx.search(line.rsplit("\r", 1)[-1])
        if m and "step" in m.groupdict():
            try:
                return float(m.group("step"))
            except (TypeError, ValueError):
                continue
    return None


def append_sample(log: Path, t: float, step: float) -> None:
    """Record that the job was at ``step`` at time ``t`` (O_APPEND; one short line)."""
    fd = open_in(steps_path(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, json.dumps({"t": round(t, 3), "step": step}).encode() + b"\n")
    finally:
        os.close(fd)
