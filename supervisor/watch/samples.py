"""Samples worth drawing: a run's CPU, memory, members, GPUs and progress over its life.

The supervisor takes one :class:`Sample` every ``interval_s`` (10 s by default) and
appends it to ``logs/run-N.samples.jsonl``. Two append-only files keep a 7-day run small:

- ``run-N.samples.jsonl``: every sample of the recent past. Past :data:`FINE_MAX` lines
  it is cut back to the newest :data:`FINE_KEEP` (a temp file renamed over it);
- ``run-N.samples.coarse.jsonl``: one point per :data:`COARSE_EVERY` samples (5 min at
  10 s), their mean (the maximum for memory, which a mean would hide), kept for ever.

A reader takes the coarse points older than the first fine one, then the fine ones
(:func:`read_series`). Seven days at the defaults: 2,016 coarse points and at most 720 fine
ones, about half a MB. Each sample reads /proc/<pid>/stat of the run's members (already
known from the member snapshots) and the memory the GPU watch last read: no extra NVML
call, and about 50 µs of CPU every 10 s (scripts/bench_web.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from trainctl.supervisor import ids
from trainctl.supervisor.errors import StateError
from trainctl.supervisor.linux import memory, procfs
from trainctl.supervisor.model import events, steps
from trainctl.supervisor.model.state import open_in
from trainctl.supervisor.records import field, record

FINE_MAX = 720  # fine samples before the file is cut back
FINE_KEEP = 360  # ... to this many (an hour at 10 s)
COARSE_EVERY = 30  # fine samples per coarse point
PAGE = os.sysconf("SC_PAGE_SIZE")


def samples_path(log: Path, coarse: bool = False) -> Path:
    """The samples file of the run whose log is ``log``."""
    stem = log.name.removesuffix(".log")
    return log.with_name(f"{stem}.samples{'.coarse' if coarse else ''}.jsonl")


@record(frozen=True)
class Sample:
    """One look at a run: CPU (% of one core), memory, members, GPUs, progress."""

    t: float
    cpu_pct: float | None = None
    mem_bytes: int | None = None  # the job cgroup's memory, else the members' RSS
    members: int = 0
    gpu_mem: dict[str, int] = field(default_factory=dict)  # {label: bytes}
    gpu_util: dict[str, int] = field(default_factory=dict)  # {label: %}
    progress: dict[str, float] = field(default_factory=dict)  # step, loss, ...

    def to_doc(self) -> dict[str, object]:
        """One line of the samples file (short keys: there are many lines)."""
        doc: dict[str, object] = {"t": round(self.t, 3), "n": self.members}
        if self.cpu_pct is not None:
            doc["cpu"] = round(self.cpu_pct, 1)
        if self.mem_bytes is not None:
            doc["mem"] = self.mem_bytes
        if self.gpu_mem:
            doc["gmem"] = self.gpu_mem
        if self.gpu_util:
            doc["gutil"] = self.gpu_util
        if self.progress:
            doc["p"] = self.progress
        return doc

    @classmethod
    def from_doc(cls, doc: object) -> Sample | None:
        """A line read back; None for one that is not a sample (torn, foreign)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("t"), int | float):
            return None
        return cls(
            t=float(doc["t"]),
            cpu_pct=events.num(doc.get("cpu")),
            mem_bytes=_int(doc.get("mem")),
            members=_int(doc.get("n")) or 0,
            gpu_mem=_ints(doc.get("gmem")),
            gpu_util=_ints(doc.get("gutil")),
            progress=_nums(doc.get("p")),
        )


def _int(v: object) -> int | None:
    n = events.num(v)
    return None if n is None else int(n)


def _nums(v: object) -> dict[str, float]:
    if not isinstance(v, dict):
        return {}
    return {str(k): n for k, x in v.items() if (n := events.num(x)) is not None}


def _ints(v: object) -> dict[str, int]:
    return {k: int(n) for k, n in _nums(v).items()}


def merge(samples: list[Sample]) -> Sample:
    """One coarse point of several samples: means, and the maximum of memory."""

    def mean(values: Iterable[float | None]) -> float | None:
        got = [v for v in values if v is not None]
        return sum(got) / len(got) if got else None

    def most(values: Iterable[int | None]) -> int | None:
        got = [v for v in values if v is not None]
        return max(got) if got else None

    labels = {k for s in samples for k in s.gpu_mem}
    ulabels = {k for s in samples for k in s.gpu_util}
    keys = {k for s in samples for k in s.progress}
    last = samples[-1]
    return Sample(
        t=last.t,
        cpu_pct=mean(s.cpu_pct for s in samples),
        mem_bytes=most(s.mem_bytes for s in samples),
        members=max(s.members for s in samples),
        gpu_mem={k: most(s.gpu_mem.get(k) for s in samples) or 0 for k in sorted(labels)},
        gpu_util={k: round(mean(s.gpu_util.get(k) for s in samples) or 0) for k in sorted(ulabels)},
        progress=_newest(samples, keys),  # a position, not a level: the newest of each
    )


def _newest(samples: list[Sample], keys: set[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in reversed(samples):
        for k in keys - out.keys():
            if k in s.progress:
                out[k] = s.progress[k]
    return out


@record()
class CpuMeter:
    """CPU time of the members between two looks, as % of one core."""

    ticks: dict[tuple[int, int], int] = field(default_factory=dict)  # (pid, start): ticks
    at: float | None = None

    def look(self, stats: list[procfs.Stat], now: float) -> float | None:
        """The members' CPU use since the last look (None at the first)."""
        ticks = {(s.pid, s.start_ticks): s.utime_ticks + s.stime_ticks for s in stats}
        used = sum(t - self.ticks.get(k, 0) for k, t in ticks.items() if k in self.ticks)
        # a member new since the last look: its time before now is not in this interval
        pct = None
        if self.at is not None and now > self.at:
            pct = 100.0 * used / procfs.clock_ticks() / (now - self.at)
        self.ticks, self.at = ticks, now
        return pct


@record()
class SampleLog:
    """The two files of one run's samples; appends, cuts back, merges (never raises)."""

    log: Path
    fine_lines: int = 0
    pending: list[Sample] = field(default_factory=list)

    def append(self, s: Sample) -> None:
        """Record one sample; every COARSE_EVERY, one coarse point too."""
        with contextlib.suppress(OSError, StateError):
            _append(samples_path(self.log), s)
            self.fine_lines += 1
            self.pending.append(s)
            if len(self.pending) >= COARSE_EVERY:
                _append(samples_path(self.log, coarse=True), merge(self.pending))
                self.pending = []
            if self.fine_lines > FINE_MAX:
                self.fine_lines = _cut_back(samples_path(self.log), FINE_KEEP)


def _append(path: Path, s: Sample) -> None:
    fd = open_in(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, json.dumps(s.to_doc(), separators=(",", ":")).encode() + b"\n")
    finally:
        os.close(fd)


def _cut_back(path: Path, keep: int) -> int:
    """Keep the newest ``keep`` lines (temp file + rename: a reader sees one or the other)."""
    lines = path.read_bytes().split(b"\n")[:-1][-keep:]
    tmp = path.with_name(ids.temp_name(path.name))
    fd = open_in(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        os.write(fd, b"".join(line + b"\n" for line in lines))
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return len(lines)


def _read(path: Path) -> list[Sample]:
    try:
        raw = path.read_bytes()
    except OSError:
        return []
    out = []
    for line in raw.split(b"\n")[:-1]:
        with contextlib.suppress(ValueError):
            if (s := Sample.from_doc(json.loads(line))) is not None:
                out.append(s)
    return out


def read_series(log: Path) -> list[Sample]:
    """Every point of a run, oldest first: the coarse past, then the fine recent samples."""
    fine = _read(samples_path(log))
    coarse = _read(samples_path(log, coarse=True))
    first = fine[0].t if fine else float("inf")
    return [s for s in coarse if s.t < first] + fine


def member_stats(pids: Iterable[tuple[int, int]]) -> list[procfs.Stat]:
    """The stat of each member that still is that process (pid and start time)."""
    out = []
    for pid, start in pids:
        st = procfs.read_stat(pid)
        if st is not None and st.start_ticks == start and st.state != "Z":
            out.append(st)
    return out


def rss_bytes(stats: list[procfs.Stat]) -> int:
    """The members' resident memory (shared pages count once per process)."""
    return sum(s.rss_pages for s in stats) * PAGE


@record(frozen=True)
class Sources:
    """Where one run's sample is read from (the supervisor's view of the run, at a tick)."""

    members: tuple[tuple[int, int], ...]  # (pid, start ticks)
    memory_group: Path | None  # the job's memory cgroup, if it has one
    gpu_mem: dict[str, int]  # {label: bytes}: the GPU watch's last look
    gpu_util: dict[str, int]
    progress_file: Path  # $TRAINCTL_PROGRESS
    log: Path
    progress_regex: str | None


def look(src: Sources, meter: CpuMeter, now: float) -> Sample:
    """Take one sample of the run (a thread: it reads /proc and two file tails)."""
    stats = member_stats(src.members)
    mem: int | None = None
    if src.memory_group is not None:
        with contextlib.suppress(OSError):
            mem = memory.usage(src.memory_group).used_bytes
    if mem is None and stats:
        mem = rss_bytes(stats)
    progress = steps.newest_numbers(src.progress_file)
    if progress is None and src.progress_regex:
        with contextlib.suppress(re.error):
            progress = steps.newest_matched(src.log, re.compile(src.progress_regex))
    return Sample(
        t=now,
        cpu_pct=meter.look(stats, now),
        mem_bytes=mem,
        members=len(stats),
        gpu_mem=dict(src.gpu_mem),
        gpu_util=dict(src.gpu_util),
        progress=progress or {},
    )
