"""A deploy's trial, judged by the new run's own supervisor (issue 55: one controller).

The gate: the new run must report a step past the first one it reports (it resumed and
advanced), or write a complete checkpoint, within the deploy's ``--health``; its first
step, or a checkpoint it writes, behind the one it was handed (beyond the tolerance)
fails it. The probation, after the gate: no crash or stall until its first complete
checkpoint (at or past the handed step), at most ``--probation``.

A look reads only what the run's files gained (:class:`steplines.StepReader`), and a
checkpoint folder only once a file in it is newer than the stage's start: one fstat and
one glob a look while nothing happens. What the run's end means for the trial (a crash,
a stall, the guard's trip) is the lifecycle's decision (life/lifecycle.py ``_trial_ended``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trainctl.supervisor.model import checkpoints
from trainctl.supervisor.model.reports import GATE, Trial
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import JobState, log_path
from trainctl.supervisor.model.tail import tail_lines
from trainctl.supervisor.records import record

from .steplines import StepReader

TRIAL_LOOK_S = 0.2  # how often the trial looks at the run's files


@record(frozen=True)
class TrialPassed:
    """The stage passed (the watcher sends the lifecycle's event of that name)."""

    why: str
    step: float | None = None


@record(frozen=True)
class TrialFailed:
    """The stage failed while the run still runs."""

    why: str
    lines: tuple[str, ...] = ()


def last_lines(jdir: Path, run: int) -> tuple[str, ...]:
    """The last ten lines of the run's log (at most 300 characters each)."""
    return tuple(x[-300:] for x in tail_lines(log_path(jdir, run), 4096)[-10:])


class TrialWatch:
    """The looks of one run's trial; :meth:`look` returns a verdict, or None (not yet)."""

    def __init__(
        self, jdir: Path, spec: Spec, st: JobState, step_at: Callable[[float], float | None]
    ) -> None:
        """``step_at``: the step of a checkpoint written at a time (runsteps.step_before)."""
        self.jdir, self.spec, self.run, self._step_at = jdir, spec, st.run, step_at
        self._reader = StepReader(jdir, st.run, spec.watch.progress_regex)
        self.first: float | None = None
        self.newest: float | None = None

    def look(self, t: Trial, now: float, stalled: bool) -> TrialPassed | TrialFailed | None:
        """One look at the run for the stage it is in (blocking: files)."""
        steps = self._reader.look()
        if steps:
            self.first = steps[0][1] if self.first is None else self.first
            self.newest = steps[-1][1]
        if t.stage == GATE:
            return self._gate(t, now)
        return self._probation(t, now, stalled)

    def _gate(self, t: Trial, now: float) -> TrialPassed | TrialFailed | None:
        first, newest = self.first, self.newest
        if first is not None and (behind := t.behind(first, "started at")) is not None:
            return TrialFailed(behind, last_lines(self.jdir, self.run))
        if first is not None and newest is not None and newest > first:
            return TrialPassed(f"step {newest:g}, past step {first:g}", newest)
        saved = self._saved(t)
        if saved is not None:
            return saved
        if now < t.until:
            return None
        what = "no progress" if first is None else f"no step past {first:g}"
        return TrialFailed(f"{what} within {t.health_s:g} s", last_lines(self.jdir, self.run))

    def _probation(self, t: Trial, now: float, stalled: bool) -> TrialPassed | TrialFailed | None:
        if stalled:
            return TrialFailed(f"run {self.run} stalled", last_lines(self.jdir, self.run))
        saved = self._saved(t)
        if saved is not None:
            return saved
        if now >= t.until:
            return TrialPassed(f"no crash or stall in {t.probation_s:g} s", self.newest)
        return None

    def _saved(self, t: Trial) -> TrialPassed | TrialFailed | None:
        """A complete checkpoint written since the stage began: it passes, unless its step
        is behind the handed one."""
        pattern = self.spec.watch.checkpoint
        if not pattern or (checkpoints.newest_mtime(self.spec.cwd, pattern) or 0.0) <= t.since:
            return None
        ones = checkpoints.complete_ones(self.spec.cwd, pattern, self._step_at, want=1)
        if not ones or ones[0].mtime <= t.since:
            return None
        ck = ones[0]
        behind = None if ck.step is None else t.behind(ck.step, "saved")
        if behind is not None:
            return TrialFailed(behind, last_lines(self.jdir, self.run))
        return TrialPassed(f"it saved checkpoint {ck.path}", self.newest)
