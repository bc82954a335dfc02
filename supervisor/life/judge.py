"""What the lifecycle owner does with a deploy's verdicts (lifecycle ``Judge``): the
deploy's report and step lines, the run's ``trial`` record, the kept copy, the
on_deploy_failed hook; and the rollback run's held report, released once its checkpoint
guard has judged it.

The decisions are the lifecycle's (life/lifecycle.py); this module only writes them,
in the words the deployer used to (``deploys/ID.*``, model/deploys.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trainctl.supervisor.model import deploys, keepsafe
from trainctl.supervisor.model.deploys import DeployReport
from trainctl.supervisor.model.reports import PROBATION, Cause, Trial
from trainctl.supervisor.records import replace

if TYPE_CHECKING:  # a type only: the owner hands each verdict over
    from .lifecycle import Judge

# What the owner is given: the job's folder, the run's trial now, how to replace it in
# the state, and how to tell on_deploy_failed (the owner's hook runner).
Fire = Callable[[str, Cause], None]


def stamp(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


class DeployJudge:
    """Writes a trial's verdicts for the owner (one per supervisor)."""

    def __init__(self, jdir: Path, cwd: str, fire: Fire) -> None:
        self.jdir, self.cwd, self._fire = jdir, cwd, fire
        self.held: DeployReport | None = None  # a rollback's report, for the next run

    def judged(self, a: Judge, t: Trial) -> Trial | None:
        """Write verdict ``a`` on trial ``t``; return the run's trial from now on."""
        now = time.time()
        if a.outcome == "deployed":
            return self._deployed(a, t, now)
        if a.outcome == "passed":
            keepsafe.discard(t.kept)
            deploys.say(self.jdir, t.id, "done", f"run {t.run} passed its probation: {a.why}")
            return None
        if a.outcome == "ended":
            self._ended(a, t)
            return None
        if a.outcome == "rolled-back":
            self.held = deploys.trial_report(
                t, "rolled-back", f"deploy of {t.to_commit or '?'} failed: {a.why}; rolled "
                f"back to {t.from_commit or '?'} (run {a.rollback_run})", cause=a.why,
                rollback_run=a.rollback_run, last_lines=list(a.lines),
            )  # fmt: skip
            deploys.say(self.jdir, t.id, "rollback", f"{a.why}: rolling back to run "
                        f"{t.from_run}'s code ({t.from_commit or '?'})")  # fmt: skip
            self._tell(f"deploy of {t.to_commit or '?'} failed: {a.why}; rolled back to "
                       f"{t.from_commit or '?'}")  # fmt: skip
            return t  # the run has ended: its record stays as it was judged
        self._failed(a, t)
        return None

    def _deployed(self, a: Judge, t: Trial, now: float) -> Trial:
        until = now + t.probation_s
        deploys.say(self.jdir, t.id, "gate", f"run {t.run} passed its gate: {a.why}")
        rep = deploys.trial_report(
            t, "deployed", f"run {t.run} runs the new code: {a.why}",
            reached_step=a.step, probation_until=until,
        )  # fmt: skip
        deploys.write_report(self.jdir, rep)
        deploys.say(self.jdir, t.id, "probation", f"on probation until {stamp(until)} or its "
                    "first complete checkpoint; a crash or stall meanwhile rolls back",
                    t.probation_s)  # fmt: skip
        return replace(t, stage=PROBATION, since=now, until=until)

    def _ended(self, a: Judge, t: Trial) -> None:
        """A user's stop (or a newer deploy's) ended the trial."""
        if t.stage == PROBATION:
            keepsafe.discard(t.kept)
            deploys.say(self.jdir, t.id, "done", f"the probation ended: {a.why}")
            return
        rep = deploys.trial_report(t, "failed", f"{a.why} during its gate; not rolled back",
                                   cause=a.why)  # fmt: skip
        deploys.write_report(self.jdir, rep)

    def _failed(self, a: Judge, t: Trial) -> None:
        """The trial failed with no way back, or the rollback could not start."""
        if self.held is not None:  # the rollback's relaunch failed
            rep = replace(self.held, outcome="failed", summary=a.why)
            self.held = None
            deploys.release_rollback(self.jdir, rep)
            self._tell(f"deploy of {t.to_commit or '?'} failed: {a.why}")
            return
        restored, done = deploys.put_back(t, t.cwd or self.cwd)
        for line in done:
            deploys.say(self.jdir, t.id, "rollback", line)
        why = t.no_rollback_why or "--rollback never"
        rep = deploys.trial_report(
            t, "failed", f"the new code failed its {t.stage} ({a.why}); not rolled back: {why}",
            cause=a.why, last_lines=list(a.lines), restored=restored, reached_step=a.step,
        )  # fmt: skip
        deploys.write_report(self.jdir, rep)
        self._tell(f"deploy of {t.to_commit or '?'} failed: {a.why}; not rolled back ({why})")

    def _tell(self, summary: str) -> None:
        self._fire("deploy_failed", Cause(kind="deploy_failed", summary=summary))


def release_held(jdir: Path, rep: DeployReport, over: str | None) -> None:
    """The rollback run's verdict: its guard passed (or it had none, or it ended before
    its first step): the held report as it is; its guard stopped it (``over``): failed."""
    if over is not None:
        summary = f"{rep.summary}, which was stopped by the checkpoint guard: {over}"
        rep = replace(rep, outcome="failed", summary=summary)
    deploys.release_rollback(jdir, rep)
