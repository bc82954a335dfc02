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
from collections.abc import Iterable
from pathlib import Path

from trainctl.supervisor.linux.files import open_in

from .tail import tail_lines

TAIL_BYTES = 64 * 1024  # the newest step is near the end of the log


def steps_path(log: Path) -> Path:
    """Where the samples of the run whose log is ``log`` go."""
    return log.with_name(log.name.removesuffix(".log") + ".steps.jsonl")


def number(value: object) -> float | None:
    """A progress value as a number (JSON numbers, numeric strings), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def numbers(fields: dict[str, object]) -> dict[str, float] | None:
    """The numeric fields of one progress report, if it has a ``step``."""
    nums = {k: v for k, v in ((k, number(v)) for k, v in fields.items()) if v is not None}
    return nums if "step" in nums else None


def timed_steps(lines: Iterable[str | bytes]) -> list[tuple[float, float]]:
    """(t, step) of the JSON lines that have both (a $TRAINCTL_PROGRESS file, the
    supervisor's samples), in the order given; other lines are skipped."""
    out = []
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            t, step = number(doc.get("t")), number(doc.get("step"))
            if t is not None and step is not None:
                out.append((t, step))
    return out


def newest_reported(path: Path, nbytes: int = 64 << 10) -> float | None:
    """The newest step a job reported through ``$TRAINCTL_PROGRESS`` (its JSON lines)."""
    nums = newest_numbers(path, nbytes)
    return None if nums is None else nums["step"]


def newest_numbers(path: Path, nbytes: int = 64 << 10) -> dict[str, float] | None:
    """The newest report (step, loss, ...) a job appended to ``$TRAINCTL_PROGRESS``."""
    for line in reversed(tail_lines(path, nbytes)):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and (nums := numbers(doc)) is not None:
            return nums
    return None


def newest_matched(log: Path, rx: re.Pattern[str]) -> dict[str, float] | None:
    """The numbers of the last log line that ``rx`` matches (``progress_regex``)."""
    for line in reversed(tail_lines(log, TAIL_BYTES)):
        if (found := progress_of(line, rx)) is not None:
            return found
    return None


def progress_of(line: str, rx: re.Pattern[str]) -> dict[str, float] | None:
    """The named numbers ``rx`` finds in a log line (a progress bar's latest frame)."""
    m = rx.search(line.rsplit("\r", 1)[-1])
    return numbers(m.groupdict()) if m else None


def newest_step(log: Path, rx: re.Pattern[str]) -> float | None:
    """Return the step of the last log line that ``rx`` matches (group ``step``)."""
    found = newest_matched(log, rx)
    return None if found is None else found["step"]


def append_sample(log: Path, t: float, step: float) -> None:
    """Record that the job was at ``step`` at time ``t`` (O_APPEND; one short line)."""
    fd = open_in(steps_path(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, json.dumps({"t": round(t, 3), "step": step}).encode() + b"\n")
    finally:
        os.close(fd)
