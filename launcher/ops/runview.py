"""What the web page shows of a run beyond `status`: its samples, its checkpoints on a time
axis, the timeline of its last stop, and the end of its log from an offset on.

Reads only: files under the job's directory and the checkpoint glob's matches.
"""

from __future__ import annotations

import glob
import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainctl.launcher.results import Skipped, StackReport
from trainctl.launcher.results.ops import (
    CheckpointFile,
    LogTail,
    ProgressPoint,
    StopTimeline,
    TimelineEntry,
)
from trainctl.supervisor.errors import TrainctlError
from trainctl.supervisor.model import events, state
from trainctl.supervisor.model.events import newest_typed
from trainctl.supervisor.model.reports import StopReport
from trainctl.supervisor.model.steps import numbers, progress_of
from trainctl.supervisor.model.tail import (
    Mark,
    latest_frame,
    read_appended,
    read_span,
    shown_lines,
    tail_lines,
)
from trainctl.supervisor.watch.samples import Sample, read_series

from .jobs import existing_job
from .stack import add_threads

MAX_CHECKPOINTS = 500  # the newest ones, when a glob matches more
# the progress points of a chart refresh (every 10 s): the newest lines of the progress
# files (or of the logs progress_regex reads), newest run first, this much in all (~30,000
# lines of ~60 bytes: ~0.1 s here; a week of per-step lines, 72 MB, whole took 3.8 s)
POINTS_BYTES = 2 << 20
TAIL_BYTES = 64 << 10  # the first look at a log: its end
EVENTS_BYTES = 1 << 20  # a stop's events are near the end of events.jsonl


def run_samples(home: Path, name: str, run: int | None = None) -> list[Sample]:
    """Every sample of the run (the current one by default), oldest first."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    return read_series(state.log_path(jdir, st.run if run is None else run))


def job_samples(home: Path, name: str, runs: int = 20) -> list[Sample]:
    """Every sample of the job's last ``runs`` runs, oldest first: a chart of the whole
    job, its run boundaries marked by the caller."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    out: list[Sample] = []
    for run in range(max(1, st.run - runs + 1), st.run + 1):
        out += read_series(state.log_path(jdir, run))
    return sorted(out, key=lambda s: s.t)


def stored_stacks(path: str | None, name: str, run: int) -> StackReport | None:
    """A stacks file the supervisor wrote (a stall, a before-SIGKILL look), grouped as
    `trainctl stack` groups them; None when there is none or it cannot be read."""
    text = read_stacks(path, limit=4 << 20)
    if text is None:
        return None
    try:
        doc = json.loads(text)
        report = StackReport(name, int(doc.get("run", run)))
        for p in doc["processes"]:
            add_threads(report, int(p["pid"]), str(p.get("cmd") or ""), p.get("threads"))
            if p.get("error"):
                report.skipped.append(Skipped(int(p["pid"]), str(p.get("cmd") or ""), p["error"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return report


Parse = Callable[[str], "ProgressPoint | None"]


class TailCache:
    """The points of each file's newest POINTS_BYTES, parsed once, then only what was
    appended (the files only grow): for a reader that lives, `trainctl web`, whose chart
    refresh read and parsed the newest 2 MiB every 10 s (~0.18 s of JSON here). Each point
    is kept with its line's offset, so a read of fewer bytes (the budget a newer run left)
    takes the lines that start within them. A line not yet ended waits for the next read;
    a file replaced (another inode) or shorter than what was read is read again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the web server's threads share one cache
        # (path, parser) -> (where the last read stopped, [(line start, point)])
        self._files: dict[tuple[str, str], tuple[Mark, list[_At]]] = {}

    def newest(
        self, path: Path, budget: int, parse: Parse, kind: str
    ) -> tuple[list[ProgressPoint], int]:
        """As :func:`_newest_points`, through the cache (``kind`` names ``parse``)."""
        if budget <= 0:
            return [], budget
        key = (str(path), kind)
        with self._lock:
            kept = self._files.get(key)
        try:
            mark, offset, data, fresh, size = read_appended(
                path, None if kept is None else kept[0], POINTS_BYTES
            )
        except OSError:  # gone (a job removed): forgotten
            with self._lock:
                self._files.pop(key, None)
            return [], budget
        old = [] if fresh or kept is None else kept[1]
        at = [(o, p) for o, p in old if o >= size - POINTS_BYTES]
        for raw in data.split(b"\n")[:-1]:  # whole lines only: data ends with one
            # as tail_lines splits: a progress bar's carriage returns end lines too
            for line in raw.decode(errors="replace").splitlines():
                if (point := parse(line)) is not None:
                    at.append((offset, point))
            offset += len(raw) + 1
        with self._lock:
            self._files[key] = (mark, at)
        floor = size - budget  # as tail_lines: a line starting at it may be cut
        return [p for o, p in at if o > floor or not floor], budget - min(budget, size)


_At = tuple[int, ProgressPoint]


def progress_points(
    home: Path, name: str, runs: int = 8, cache: TailCache | None = None
) -> list[ProgressPoint]:
    """The progress reports of the job's last ``runs`` runs, oldest first: the lines of
    each run's $TRAINCTL_PROGRESS file (a step, and a time when the trainer gave one),
    and its log's lines that match ``progress_regex`` (no time: the supervisor's samples
    time those). Read from the end, newest run first, POINTS_BYTES in all; ``cache``: a
    long-lived reader's (each file parsed once, then what was appended)."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    try:
        rx = state.read_spec(jdir).watch.progress_regex
    except TrainctlError:
        rx = None
    pattern = re.compile(rx) if rx else None
    budget, by_run = POINTS_BYTES, []
    for run in range(st.run, max(0, st.run - runs), -1):
        got, budget = _newest(cache, state.progress_path(jdir, run), budget, _json_of(run), "json")
        if pattern is not None:
            matched = _matched_of(run, pattern)
            more, budget = _newest(cache, state.log_path(jdir, run), budget, matched, rx or "")
            got += more
        by_run.append(got)
    return [p for got in reversed(by_run) for p in got]


def _json_of(run: int) -> Parse:
    def parse(line: str) -> ProgressPoint | None:
        try:
            doc = json.loads(line)
        except ValueError:
            return None
        nums = numbers(doc) if isinstance(doc, dict) else None
        return None if nums is None else _point(run, nums)

    return parse


def _matched_of(run: int, pattern: re.Pattern[str]) -> Parse:
    def parse(line: str) -> ProgressPoint | None:
        nums = progress_of(line, pattern)
        return None if nums is None else _point(run, nums)

    return parse


def _newest(
    cache: TailCache | None, path: Path, budget: int, parse: Parse, kind: str
) -> tuple[list[ProgressPoint], int]:
    if cache is not None:
        return cache.newest(path, budget, parse, kind)
    return _newest_points(path, budget, parse)


def _newest_points(path: Path, budget: int, parse: Parse) -> tuple[list[ProgressPoint], int]:
    """The points of the whole lines within the last ``budget`` bytes of ``path``, and
    what is left of the budget after them."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return [], budget
    if budget <= 0 or not size:
        return [], budget
    got = [p for line in tail_lines(path, budget) if (p := parse(line)) is not None]
    return got, budget - min(budget, size)


def _point(run: int, nums: dict[str, float]) -> ProgressPoint:
    values = {k: v for k, v in nums.items() if k not in ("step", "t")}
    return ProgressPoint(run, nums["step"], nums.get("t"), values)


def checkpoints(home: Path, name: str) -> list[CheckpointFile]:
    """The files the job's checkpoint glob matches now, oldest first (none without one)."""
    jdir = existing_job(home, name)
    try:
        spec = state.read_spec(jdir)
    except TrainctlError:
        return []
    if not spec.watch.checkpoint:
        return []
    found = []
    for path in glob.glob(os.path.join(spec.cwd, spec.watch.checkpoint)):
        try:
            st = os.stat(path)
        except OSError:
            continue
        found.append(CheckpointFile(path, st.st_mtime, st.st_size))
    found.sort(key=lambda c: c.at)
    return found[-MAX_CHECKPOINTS:]


def log_tail(home: Path, name: str, offset: int | None) -> LogTail:
    """The current run's whole lines after ``offset`` (None: those in its last 64 KiB),
    and the offset the next look starts at: each line comes once, when its newline does.

    An offset past the end (the log was rotated, or a new run began) starts again at 0.
    A line longer than one read (a progress bar's carriage-return frames, with no
    newline for a while) is not waited for: the look moves past its older frames.
    """
    jdir = existing_job(home, name)
    path = state.log_path(jdir, state.read_state(jdir).run)
    start, data, size = read_span(path, offset, TAIL_BYTES)
    if not size:
        return LogTail(str(path), 0)
    if offset is None and start > 0:  # the read began inside a line: not a whole one
        cut = data.find(b"\n") + 1
        start, data = start + cut, data[cut:]
    end = data.rfind(b"\n") + 1  # whole lines only: the rest comes with the next look
    partial = latest_frame(data[end:].decode(errors="replace"))
    if not end and len(data) >= TAIL_BYTES:  # one line longer than a read
        end = data.rfind(b"\r") + 1  # its older frames: its latest comes with its newline
        if not end:  # no frames: shown in pieces rather than never
            return LogTail(str(path), start + len(data), _lines(data))
        return LogTail(str(path), start + end, partial=partial)
    return LogTail(str(path), start + end, _lines(data[:end]), partial)


def _lines(data: bytes) -> list[str]:
    return shown_lines(data.decode(errors="replace"))


def stop_timeline(home: Path, name: str) -> StopTimeline | None:
    """The last stop of the job's current run, second by second (None: it has not had one)."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    report = st.last_stop
    if not isinstance(report, StopReport) or report.already_stopped:
        return None
    began, escalated = _stop_events(jdir)
    t0 = began.ts if began else None
    entries = [_request(report, began)]
    for p in sorted(report.sent, key=lambda p: p.at_s or 0.0):
        at = p.at_s or 0.0
        entries.append(TimelineEntry(at, "signal", f"{report.signal} → {p.pid} {p.cmd}", p.pid))
        if p.exit_s is not None:
            how = "exited on SIGKILL" if p.killed else "exited"
            entries.append(TimelineEntry(round(at + p.exit_s, 4), "exit", f"{p.pid} {how}", p.pid))
    for p in report.unsignalled:  # every member: those their parent shut down too
        entries.append(
            TimelineEntry(p.at_s or 0.0, "exit", f"{p.pid} {p.cmd} exited, unsignalled", p.pid)
        )
    if report.killed:
        esc_ts = escalated.ts if escalated else None
        at = esc_ts - t0 if esc_ts is not None and t0 else report.grace_s
        who = ", ".join(f"{k.pid} {k.cmd}"[:60] for k in report.killed_procs[:5])
        entries.append(TimelineEntry(round(at, 4), "kill", f"SIGKILL → {report.killed}: {who}"))
    gone = report.gone_s if report.gone_s is not None else report.total_s
    entries.append(TimelineEntry(round(gone, 4), "gone", f"{report.found} process(es) gone"))
    for g in report.gpus:
        entries.append(_gpu(g, gone, report.total_s))
    verdict = _verdict(report)
    entries.append(TimelineEntry(round(report.total_s, 4), "verdict", verdict))
    entries.sort(key=lambda e: e.at_s)
    return StopTimeline(name, st.run, t0, report.total_s, report.ok, verdict, entries)


def _request(report: StopReport, began: events.Stopping | None) -> TimelineEntry:
    reason = began.reason if began else report.reason
    return TimelineEntry(
        0.0,
        "request",
        f"stop requested ({reason}): {report.signal}, order {report.order}, "
        f"grace {report.grace_s:g} s; {report.found} process(es) found",
    )


def _gpu(g: Any, gone: float, total: float) -> TimelineEntry:
    label = g.label
    if g.ok:
        back = f", {g.released_bytes / 2**20:.0f} MiB back" if g.released_bytes else ""
        at = min(total, gone + (g.seconds or 0.0))
        return TimelineEntry(round(at, 4), "gpu", f"GPU {label} released{back}")
    why = g.error or g.note or "memory still held"
    return TimelineEntry(round(total, 4), "gpu", f"GPU {label} NOT proven free: {why}")


def _verdict(r: StopReport) -> str:
    """The verdict `stop` prints (StopReport.verdict), with the stop's length."""
    return f"{r.verdict()} ({r.total_s:.2f} s)"


def _stop_events(jdir: Path) -> tuple[events.Stopping | None, events.Escalated | None]:
    """The newest `stopping` event and the `escalated` after it, from events.jsonl's end."""
    escalated = None
    for ev in newest_typed(jdir, EVENTS_BYTES):
        if isinstance(ev, events.Escalated) and escalated is None:
            escalated = ev
        elif isinstance(ev, events.Stopping):
            return ev, escalated
    return None, escalated


def read_stacks(path: str | None, limit: int = 64 << 10) -> str | None:
    """The text of a stacks file the supervisor wrote (a stall, a before-SIGKILL look)."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return None
