"""The stall watchdog's deadline, learned from the run (``stall_timeout = "auto"``).

A fixed stall timeout must be longer than the longest save, so a hung collective is
noticed after minutes (20 by custom). Learned instead: the supervisor looks at the run's
activity (the newest write to its log or $TRAINCTL_PROGRESS) every 0.5 s, and at its
newest checkpoint. A gap between two writes during which a checkpoint was written is a
save (its length is learned too); a gap as long as the deadline then in force is a stall
(a SIGSTOPped rank that came back), never learned, else each stall would raise the
deadline (4.4 s -> 19.8 s -> 1m23s after two); any other gap is a step. The deadline is
:data:`FACTOR` times the longest step gap seen, at least :data:`FLOOR_S`; no stall is
called while a save is under way (a checkpoint written since the run's last step, within
:data:`SAVING_S`, and not complete by its format: its completion marker, a zip's end
record...), nor before :data:`LEARN_GAPS` step gaps were seen.

A look every 0.5 s cannot see a gap shorter than itself: a run stepping every 0.05 s
seemed to step every 0.5 s, and its deadline was 4 x 0.5 s whatever its pace (issue 56
§2: a hang seen after 2.6 s, not four steps). So the look also counts the progress lines
written since the one before: n lines in the span between two writes are n gaps, each
learned as the span's mean (a log-only run is still learned by the span). The floor is
what is left of that: a pause of a second (a page-cache flush, a loaded box's scheduler)
is not a hang, whatever the pace. The look that would see a deadline pass is taken when
it passes (:meth:`StallLearner.due_in`), not at the next half second.

A run's start (from its start to its first step: the interpreter, imports, rendezvous,
the checkpoint's load) is not a step gap: a relaunch's seconds of start learned as one
made the deadline of every later run four times as long (a hang seen after 19 s instead
of 2). Starts are learned apart, and a start that hangs (a rendezvous that never
completes) is called against :data:`FACTOR` times the longest start seen; the first start
of a supervisor is never called.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainctl.supervisor.model.checkpoints import candidates, judge
from trainctl.supervisor.records import field, record

FACTOR = 4.0  # a small multiple of the longest normal gap between steps
FLOOR_S = 1.0  # never a deadline under this: a second's pause of a loaded box is no hang
LEARN_GAPS = 5  # step gaps seen before a deadline is called
SAVING_S = 2.0  # a checkpoint written this recently, and since the last step: a save


@record()
class StallLearner:
    """What the run's activity taught: its longest step gap and its longest save."""

    last_activity: float | None = None
    longest_step_s: float = 0.0
    longest_save_s: float = 0.0
    step_gaps: int = 0
    stalls: int = 0  # gaps at least as long as the deadline: not learned
    # the run watched: its start, whether it is still starting (no step yet), and the
    # longest start seen (a run's start to its first step)
    run: int | None = None
    run_started: float = 0.0
    starting: bool = False
    longest_start_s: float = 0.0

    def begin(self, run: int, started_at: float) -> None:
        """Run ``run`` started (a relaunch): until its first step it is starting."""
        self.run, self.run_started, self.starting = run, started_at, True
        self.last_activity = None

    def observe(
        self, activity: float, newest_ckpt: float, *, stepped: bool = True, lines: int = 0
    ) -> None:
        """Feed the newest write time of the run's log/progress and of its checkpoints;
        ``stepped``: the run has reported a step (its start is over); ``lines``: the
        progress lines written since the last look (0: not known, a log-only run)."""
        if self.starting:
            if not stepped:
                return
            self.starting = False
            self.longest_start_s = max(self.longest_start_s, activity - self.run_started)
        last, self.last_activity = self.last_activity, activity
        if last is None or activity <= last:
            return
        gap = activity - last
        if last < newest_ckpt <= activity + SAVING_S:
            self.longest_save_s = max(self.longest_save_s, gap)
            return
        steps = max(1, lines)  # several steps in the span: each gap is its mean
        deadline, each = self.deadline_s, gap / steps
        if deadline is not None and each >= deadline:
            self.stalls += 1
            return
        self.longest_step_s = max(self.longest_step_s, each)
        self.step_gaps += steps

    @property
    def deadline_s(self) -> float | None:
        """The learned stall deadline (None: still learning)."""
        if self.step_gaps < LEARN_GAPS:
            return None
        return max(FLOOR_S, FACTOR * self.longest_step_s)

    def stalled_for(self, now: float, newest_ckpt: float, *, done: bool = False) -> float | None:
        """Seconds past the deadline the run has been quiet (None: not stalled);
        ``done``: the newest checkpoint is complete by its format (its save is over)."""
        if self.starting:  # against the longest start seen; a first start is never called
            idle = now - self.run_started
            limit = max(FLOOR_S, FACTOR * self.longest_start_s)
            return idle if self.longest_start_s and idle >= limit else None
        deadline = self.deadline_s
        if deadline is None or self.last_activity is None:
            return None
        if self.saving(now, newest_ckpt) and not done:
            return None  # a save is under way: its folder is being written
        idle = now - self.last_activity
        return idle if idle >= deadline else None

    def saving(self, now: float, newest_ckpt: float) -> bool:
        """A checkpoint was written since the run's last write (it has not stepped
        since: a save under way), and lately. One written before a step is a save over;
        so is a complete one (the caller judges that only here: ``done``)."""
        last = self.last_activity or 0.0
        return newest_ckpt >= last and now - newest_ckpt < SAVING_S

    def due_in(self, now: float, newest_ckpt: float, *, done: bool = False) -> float | None:
        """Seconds until :meth:`stalled_for` could first say yes with nothing written
        meanwhile (None: it cannot yet: learning, starting, or no write seen; or it is
        past: the stall was seen, and the usual looks follow it)."""
        deadline = self.deadline_s
        if self.starting or deadline is None or self.last_activity is None:
            return None
        due = self.last_activity + deadline
        if self.saving(now, newest_ckpt) and not done:
            due = max(due, newest_ckpt + SAVING_S)
        return due - now if due > now else None


@record()
class CheckpointWatch:
    """The newest checkpoint's mtime, looked at cheaply every 0.5 s: the glob runs again
    only when a folder it matched in changed (a file made, renamed or removed); otherwise
    one stat of the newest path (a save in place changes its mtime). On a folder of 1,000
    checkpoints that is a few stats a look instead of a glob and 1,000 stats (6 ms)."""

    cwd: str
    pattern: str
    _dirs: dict[str, float] = field(default_factory=dict)
    _newest: str | None = None

    def newest_mtime(self) -> float:
        """The newest checkpoint's mtime (0.0: none)."""
        if self._stale():
            found = candidates(self.cwd, self.pattern)
            self._newest = found[0] if found else None
            roots = {os.path.dirname(p) for p in found[:50]} | {self._root()}
            self._dirs = {d: _mtime(d) for d in roots}
        return _mtime(self._newest) if self._newest else 0.0

    def newest_complete(self) -> bool:
        """The newest checkpoint seen is complete by its format, read now without a
        second look (its marker, a zip's end record, a DCP .metadata...)."""
        v = judge(self._newest, look_again=False) if self._newest else None
        return v is not None and v.complete

    def _root(self) -> str:
        fixed = []
        for part in Path(self.pattern).parts[:-1]:
            if any(c in part for c in "*?["):
                break
            fixed.append(part)
        return os.path.join(self.cwd, *fixed)

    def _stale(self) -> bool:
        if not self._dirs or "**" in self.pattern:
            return True
        return any(_mtime(d) != seen for d, seen in self._dirs.items())


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
