"""Goodput: how much of a job's time since its first start was productive, and where the
rest went, from what trainctl already records, with no change to the user's code.

Sources: ``events.jsonl`` (each run's start; its end: the moment main exited, with the
cause; stalls; deploys; the queue's wait) and each run's progress (its
``$TRAINCTL_PROGRESS`` lines with their ``t``, or the supervisor's timed samples of a
``progress_regex`` step).

Per run, with its progress points (time, step): a $TRAINCTL_PROGRESS line's own ``t``, or,
for a line that has none (a ``progress_regex`` line, a ``{"step": N}`` line), its file's
mtime when the supervisor's look found it (supervisor/watch/steplines.py: the newest line
of each look, one point a look):

- its *typical step* is the median time per step between consecutive points (over all
  runs): a point may be many steps on from the one before;
- **productive** time is the time in which steps advanced: each gap up to 3 times the
  typical time of its steps whole, a longer one as that typical time, less the steps
  that were redone afterwards;
- a longer gap is a **checkpoint save stall**, or **stalled** when the stall watchdog
  marked the run stalled meanwhile;
- **start-up** (the first run, or one that did not resume) and **restore** (a run that
  resumed) are the time from its start to its first step;
- **steps redone**: at each interruption, the steps since the checkpoint the next run
  resumed from (its first step - 1), plus the time from the last step to the end; the
  last run, stopped, is measured against the newest complete checkpoint; and a run that
  started over (its first step 1: no checkpoint handed, or code that ignored it) did
  again every step up to the highest an earlier run reached;
- **down** is the time between a run's end and the next run's start (a restart backoff, a
  person's reaction), **deploys** that time when a deploy started the next run, **queued**
  the time the queue held the job for its GPUs;
- **stopped by you**: the time between a stop you asked for and the next start is not
  lost, and not in the denominator: goodput is productive time over the time the job was
  meant to run (``stopped_s`` apart);
- **gpu faults**: what a run's end on a GPU fault (cause kind ``gpu``: a GPU fell off the
  bus or needs a reset) cost, its steps redone, the time down and the next run's restore
  together: the hardware's share of the lost time, apart from the code's.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from array import array
from pathlib import Path

from trainctl.launcher.checkpoint import newest_checkpoint
from trainctl.launcher.results.ops import Goodput, Interruption, InterruptionParts
from trainctl.supervisor.errors import TrainctlError
from trainctl.supervisor.model import state
from trainctl.supervisor.model.steps import steps_path, timed_steps
from trainctl.supervisor.model.tail import Mark, read_appended
from trainctl.supervisor.records import field, record

from .jobs import current_phase, existing_job
from .ledger import ledger

SLOW = 3.0  # a gap over this many typical steps is not a step: a save, or a stall
BUCKETS = (
    "queued",
    "startup",
    "restore",
    "checkpoint_save",
    "steps_redone",
    "down",
    "stalled",
    "deploys",
    "gpu_faults",
)
STOPPED = "stopped"  # between a stop you asked for and the next start (not in BUCKETS)
NEEDS_PROGRESS = ("productive_s", "goodput", "startup", "restore", "checkpoint_save",
                  "steps_redone", "steps_lost")  # fmt: skip


@record()
class _Run:
    run: int
    start: float
    end: float | None = None  # main exited (None: it runs)
    cause: str | None = None
    stopped: bool = False  # ended by a stop (not an interruption of its own)
    by_deploy: bool = False  # a deploy started it
    gpu_fault: bool = False  # it ended on a GPU fault (cause kind "gpu")
    points: list[tuple[float, float]] = field(default_factory=list)
    acted_at: float | None = None  # trainctl's first move on it (a stall mark, a stop)
    quiet_since: float | None = None  # a stall mark's first: when the run went quiet
    ended_at: float | None = None  # its end as its supervisor recorded it
    backoff_s: float = 0.0


def _runs(jdir: Path) -> tuple[dict[int, _Run], float, list[tuple[float, float]]]:
    """The runs that started, the queue's wait, and the stalled periods (RunLedger)."""
    led = ledger(jdir)
    runs = {
        n: _Run(
            n,
            e.started_at,
            e.end,
            e.cause,
            e.cause_kind == "stopped",
            e.by_deploy,
            e.cause_kind == "gpu",
            acted_at=e.acted_at,
            quiet_since=e.quiet_since,
            ended_at=e.ended_at,
            backoff_s=e.backoff_s or 0.0,
        )
        for n, e in led.runs.items()
        if e.started_at is not None
    }
    return runs, led.queued_s, led.stalls


class PointsCache:
    """Each progress file's (t, step) points, parsed once and then from where the last
    read stopped: the files only grow (the trainer appends its lines, the supervisor its
    samples). For a reader that lives (`trainctl web`), so a week of per-step lines is
    parsed once, not on every look. Held as two arrays of doubles, 16 bytes a point; a
    file replaced (another inode) or shorter than what was read is read again whole."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the web server's threads share one cache
        # path -> (where the last read stopped, times, steps)
        self._files: dict[str, tuple[Mark, array[float], array[float]]] = {}

    def read(self, path: Path) -> list[tuple[float, float]]:
        """The file's points in the order written; OSError when it cannot be read."""
        with self._lock:
            kept = self._files.get(str(path))
        try:
            mark, _, data, fresh, _ = read_appended(path, None if kept is None else kept[0])
        except OSError:
            with self._lock:  # gone (a job removed): forgotten
                self._files.pop(str(path), None)
            raise
        ts, steps = (array("d"), array("d")) if fresh or kept is None else kept[1:]
        new = timed_steps(data.splitlines())
        if new:  # new arrays: a reader of the kept ones is not disturbed
            ts = ts + array("d", (t for t, _ in new))
            steps = steps + array("d", (n for _, n in new))
        with self._lock:
            self._files[str(path)] = (mark, ts, steps)
        return list(zip(ts, steps, strict=True))


def _read_points(path: Path) -> list[tuple[float, float]]:
    """A file's points, read whole (a one-shot reader: `trainctl report`)."""
    with open(path, "rb") as f:
        return timed_steps(f)


def _points(jdir: Path, run: int, cache: PointsCache | None) -> list[tuple[float, float]]:
    """(t, step) of the run, in time order: its reported lines, else timed samples."""
    read = _read_points if cache is None else cache.read
    for path in (state.progress_path(jdir, run), steps_path(state.log_path(jdir, run))):
        try:
            pts = read(path)
        except OSError:
            continue
        if pts:
            return sorted(pts)
    return []


def _typical(jdir: Path, runs: dict[int, _Run], cache: PointsCache | None) -> float | None:
    """Read each run's progress; the median time per step over all runs."""
    for r in runs.values():
        r.points = _points(jdir, r.run, cache)
    per_step = [
        (b[0] - a[0]) / (b[1] - a[1])
        for r in runs.values()
        for a, b in itertools.pairwise(r.points)
        if b[1] > a[1] and b[0] > a[0]
    ]
    return statistics.median(per_step) if per_step else None


def _overlaps(a: float, b: float, periods: list[tuple[float, float]]) -> bool:
    return any(s < b and e > a for s, e in periods)


def report(home: Path, name: str, cache: PointsCache | None = None) -> Goodput:
    """The goodput of job ``name`` since its first start (or queueing); ``cache``: a
    long-lived reader's, so each progress file is parsed from where it was last read."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    runs, queued, stalls = _runs(jdir)
    if not runs:
        raise TrainctlError(f"job {name} has no recorded run yet")
    typical = _typical(jdir, runs, cache)
    ordered = [runs[k] for k in sorted(runs)]
    live = not current_phase(jdir, st).ended
    now = time.time()
    first = ordered[0].start - queued
    last_end = now if live else max((r.end or r.start) for r in ordered)
    lost = dict.fromkeys((*BUCKETS, STOPPED), 0.0)
    lost["queued"] = queued
    productive, steps_lost, interruptions = _walk(jdir, st, ordered, typical, stalls, lost, live)
    wall = max(0.0, last_end - first)
    stopped = lost.pop(STOPPED)
    meant = wall - stopped  # the time the job was meant to run
    has_progress = typical is not None
    return Goodput(
        name=name,
        wall_s=round(wall, 3),
        productive_s=round(max(0.0, productive), 3) if has_progress else None,
        goodput=round(max(0.0, productive) / meant, 4) if has_progress and meant > 0 else None,
        lost_s={k: round(v, 3) for k, v in lost.items()},
        steps_lost=steps_lost if has_progress else None,
        interruptions=interruptions,
        runs=len(ordered),
        typical_step_s=None if typical is None else round(typical, 4),
        needs_progress=[] if has_progress else list(NEEDS_PROGRESS),
        running=live,
        stopped_s=round(stopped, 3),
    )


def _walk(
    jdir: Path,
    st: state.JobState,
    ordered: list[_Run],
    typical: float | None,
    stalls: list[tuple[float, float]],
    lost: dict[str, float],
    live: bool,
) -> tuple[float, float, list[Interruption]]:
    """Run by run: the productive time, the steps lost, the interruptions; ``lost`` gets
    each bucket's seconds."""
    now = time.time()
    productive = 0.0
    steps_lost = 0.0
    interruptions: list[Interruption] = []
    reached = 0.0  # the highest step an earlier run reached
    measured_from: int | None = None  # the run its predecessor's redone steps came from
    for i, r in enumerate(ordered):
        nxt = ordered[i + 1] if i + 1 < len(ordered) else None
        end = r.end if r.end is not None else (now if nxt is None and live else None)
        productive += _steps_time(r, typical, stalls, lost)
        if r.run != measured_from:  # a run that started over, skipped by the one before
            again = _started_over(r, reached)
            steps_lost += again
            lost["steps_redone"] += again * (typical or 0.0)
            productive -= again * (typical or 0.0)
        reached = max([reached, *(s for _, s in r.points[-1:])])
        _start_cost(r, i, typical, lost, after_gpu_fault=i > 0 and ordered[i - 1].gpu_fault)
        if nxt is not None:
            gap = max(0.0, nxt.start - (end or nxt.start))
            lost[_gap_bucket(r, nxt)] += gap
        # the run that picked up its work: the next one that resumed (a run that started
        # over, rolled back by a deploy, did not: the one after it did)
        resumer = next((x for x in ordered[i + 1 :] if x.points and x.points[0][1] > 1), nxt)
        measured_from = resumer.run if resumer is not None else None
        steps, redone_s = _redone(r, resumer, typical, end, final_ck=_final_ck(jdir, st, r, nxt))
        steps_lost += steps
        lost["gpu_faults" if r.gpu_fault else "steps_redone"] += redone_s
        productive -= steps * (typical or 0.0)
        # an interruption: a run that ended and was followed, or ended on its own (not
        # the live one: its "end" is now)
        if end is not None and (nxt is not None or (r.end is not None and not r.stopped)):
            stepped = next((x for x in ordered[i + 1 :] if x.points), None)
            interruptions.append(_interruption(r, nxt, end, typical, steps, redone_s, stepped))
    return productive, steps_lost, interruptions


def _started_over(r: _Run, reached: float) -> float:
    """The steps run ``r`` did again because it started over (its first step 1, a start
    that handed no checkpoint, a deploy's code that ignored it): those up to the highest
    step an earlier run had reached. Asked only of a run its predecessor's end was not
    measured against (a rollback after it resumed): otherwise they are counted there,
    as the steps past the point it started from."""
    if not r.points or r.points[0][1] > 1 + 1e-9:
        return 0.0
    return max(0.0, min(r.points[-1][1], reached) - r.points[0][1] + 1)


def _gap_bucket(r: _Run, nxt: _Run) -> str:
    """Where the time between run ``r``'s end and the next run's start goes."""
    if nxt.by_deploy:
        return "deploys"
    if r.gpu_fault:
        return "gpu_faults"
    return STOPPED if r.stopped else "down"


def _steps_time(r: _Run, typical: float | None, stalls: list[tuple[float, float]],
                lost: dict[str, float]) -> float:  # fmt: skip
    """Time in which run ``r``'s steps advanced; its long gaps go to save stalls/stalled."""
    if typical is None:
        return 0.0
    advancing = 0.0
    for a, b in itertools.pairwise(r.points):
        gap, usual = b[0] - a[0], typical * max(1.0, b[1] - a[1])
        if gap <= SLOW * usual:
            advancing += gap
            continue
        advancing += usual
        lost["stalled" if _overlaps(a[0], b[0], stalls) else "checkpoint_save"] += gap - usual
    return advancing


def _start_cost(
    r: _Run, i: int, typical: float | None, lost: dict[str, float], *, after_gpu_fault: bool
) -> None:
    """Start-up (a first run, or one that did not resume) or restore (one that resumed):
    from its start to its first step (the time until then is the run's getting going,
    whatever of its first step it holds); a GPU fault's, after one."""
    if not r.points or typical is None:
        return
    resumed = i > 0 and r.points[0][1] > 1 + 1e-9
    bucket = "gpu_faults" if after_gpu_fault else "restore" if resumed else "startup"
    lost[bucket] += max(0.0, r.points[0][0] - r.start)


def _interruption(
    r: _Run,
    nxt: _Run | None,
    end: float,
    typical: float | None,
    steps: float,
    redone_s: float,
    stepped: _Run | None,
) -> Interruption:
    """What run ``r``'s end cost: the steps redone, the time down, the next run's restore
    (its parts run to ``stepped``, the next run that stepped: past one that never did)."""
    down = max(0.0, nxt.start - end) if nxt else 0.0
    restore = 0.0
    if nxt is not None and nxt.points:
        restore = max(0.0, nxt.points[0][0] - nxt.start)
    return Interruption(
        run=r.run,
        at=end,
        cause=r.cause or "?",
        lost_s=round(redone_s + down + restore, 3),
        steps_lost=steps,
        parts=_parts(r, nxt if nxt is None or nxt.points else stepped, end, typical, steps),
    )


def _parts(
    r: _Run, nxt: _Run | None, end: float, typical: float | None, steps: float
) -> InterruptionParts | None:
    """The interruption's timeline cut at each move: run ``r``'s last step, the first
    move on it (main's exit, a stall mark, a stop's start), its recorded end, the next
    run's start, its first step. None without progress or a next run that stepped."""
    if not r.points or typical is None or nxt is None or not nxt.points:
        return None
    last = r.points[-1][0]
    if r.quiet_since is not None:  # a stall: a rank set going to stop may step once more
        last = min(last, r.quiet_since)  # the quiet began at the last write before the mark
    # trainctl's first move, when it came before main's exit (a job that steps on after
    # the signal, finishing its step and saving, was moved on before its last step:
    # nothing to detect, and its exit is the stop's)
    acted = r.acted_at if r.acted_at is not None and r.acted_at <= end else end
    since = max(acted, last)
    ended = max(since, r.ended_at if r.ended_at is not None else end)
    start, first = max(ended, nxt.start), nxt.points[0][0]
    return InterruptionParts(
        detect=round(max(0.0, acted - last), 3),
        stop=round(ended - since, 3),
        down=round(start - ended, 3),
        backoff=round(r.backoff_s, 3),
        restore=round(max(0.0, first - start), 3),
        redo=round(steps * typical, 3),
    )


def _final_ck(jdir: Path, st: state.JobState, r: _Run, nxt: _Run | None) -> float | None:
    """For the last run, ended: the step of the newest complete checkpoint now."""
    if nxt is not None or r.end is None:
        return None
    try:
        ck = newest_checkpoint(state.read_spec(jdir), jdir, r.run)
    except TrainctlError:
        return None
    if ck is None or not ck.step_estimated:
        return None if ck is None else ck.step
    return _interpolated(r.points, ck.mtime, ck.step)


def _interpolated(points: list[tuple[float, float]], at: float, low: float | None) -> float | None:
    """The step at ``at`` between the two points around it, at their pace: a checkpoint's
    step, where the newest point before it (``low``, the guard's lower bound) may be a
    look's worth of steps behind (points are stamped every half second). For accounting
    only: never above the point after it."""
    after = next((p for p in points if p[0] > at), None)
    before = [p for p in points if p[0] <= at]
    if after is None or not before or low is None:
        return low
    (t1, s1), (t2, s2) = before[-1], after
    if t2 <= t1 or s2 <= s1:
        return low
    return max(low, float(int(s1 + (at - t1) / (t2 - t1) * (s2 - s1))))


def _redone(
    r: _Run, nxt: _Run | None, typical: float | None, end: float | None, *, final_ck: float | None
) -> tuple[float, float]:
    """(steps, seconds) of run ``r`` thrown away at its end: the steps past the checkpoint
    the next run resumed from (its first step - 1), and the time from its last step to
    its end (a step in progress)."""
    if not r.points or typical is None or end is None:
        return 0.0, 0.0
    last_t, last_step = r.points[-1]
    if nxt is not None and nxt.points:
        resumed_from = nxt.points[0][1] - 1
    elif final_ck is not None:
        resumed_from = final_ck
    else:
        return 0.0, 0.0
    steps = max(0.0, last_step - resumed_from)
    tail = max(0.0, end - last_t) if steps or nxt is not None else 0.0
    return steps, steps * typical + tail
