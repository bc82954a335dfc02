"""What the next run of a job is handed, gathered for the lifecycle owner: the facts the
one relaunch planner decides on (model/relaunch.py) read from the files and the driver,
the checkpoint guard's put-back, and the way back a deploy left (its previous spec, its
held report). The decisions are the lifecycle's and the planner's; this part only looks.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from trainctl.supervisor.gpu import health
from trainctl.supervisor.model.spec import Spec, spec_from_doc
from trainctl.supervisor.model.state import RESUME_VAR, GpuLease
from trainctl.supervisor.records import replace
from trainctl.supervisor.watch import guard, runsteps

from .errors import TrainctlError
from .life import lifecycle as lc
from .model import checkpoints, deploys, layout, relaunch

if TYPE_CHECKING:  # types only: the owner hands its parts over
    from .core import RunCore
    from .life.judge import DeployJudge


class NextRun:
    """The owner's part that prepares a relaunch (one per supervisor)."""

    def __init__(self, core: RunCore, judge: DeployJudge) -> None:
        self.core, self.judge = core, judge

    def previous_spec(self) -> Spec | None:
        """The spec of the run a deploy replaced, when this run is that deploy's new code,
        its deployer is gone (its probation passed) and that code is still on disk: the way
        back when the new code keeps failing. None otherwise."""
        spec, jdir = self.core.spec, self.core.jdir
        did = spec.env.get(layout.DEPLOY_VAR)
        if not did or not layout.name_ok(did):
            return None
        path = jdir / layout.DEPLOYS / layout.PREVIOUS_SPEC.format(id=did)
        try:
            prev = spec_from_doc(json.loads(path.read_text()), str(path))
        except (OSError, ValueError, TrainctlError):
            return None
        if prev.cwd == spec.cwd or not os.path.isdir(prev.cwd):
            return None  # already the old code; its snapshot pruned
        env = {k: v for k, v in prev.env.items() if k not in (layout.DEPLOY_VAR, RESUME_VAR)}
        return replace(prev, env=env)

    def hold_rollback(self, prev: Spec, run: int) -> None:
        """A deploy's trial failed: before the old code runs again, put back what the new
        code overwrote, then hold the deploy's report for run ``run`` (life/judge.py)."""
        held, t = self.judge.held, self.core.state.trial
        if held is None or t is None:
            return
        restored, done = deploys.put_back(t, t.cwd or prev.cwd)
        for line in done:
            deploys.say(self.core.jdir, t.id, "rollback", line)
        self.judge.held = held = replace(held, restored=restored, rollback_run=run)
        try:
            deploys.hold_rollback(self.core.jdir, held)
        except (OSError, TrainctlError) as e:
            self.core.log.warning("deploy_report_unwritten", error=str(e))

    def put_back(self) -> str | None:
        """After the guard stopped a run that started over: its checkpoints behind the mark
        moved aside, the kept copy put back if the checkpoint was changed (never raises:
        the run's cause still lands, naming the kept copy)."""
        g, st = self.core.state.guard, self.core.state
        if g is None:
            return None
        try:
            done = guard.put_back(g, self.core.spec, st.started_at, f"run-{st.run}")
        except OSError as e:
            done = [f"could not put the checkpoint back ({e.strerror or e}): "
                    f"the copy is in {g.kept or 'no kept copy'}"]  # fmt: skip
        if not done:
            done = [f"{g.path} was not changed" + (f" (a copy is kept in {g.kept})" if g.kept
                                                     else "")]  # fmt: skip
        self.core.log.warning("guard_put_back", done=done, kept=g.kept)
        return "; ".join(done)

    def complete_checkpoints(self) -> list[checkpoints.Verdict]:
        """The two newest complete checkpoints, once the run has stopped (never raises: a
        folder that cannot be read costs the breaker on progress its figure, not the stop)."""
        pattern = self.core.spec.watch.checkpoint
        if not pattern:
            return []
        run, started = self.core.state.run, self.core.state.started_at
        jdir, spec = self.core.jdir, self.core.spec

        def step_at(mtime: float) -> float | None:
            return runsteps.step_before(jdir, run, spec, mtime, started)

        try:
            # called once the run's every process is gone: what is there is final (a
            # second look at each fresh file cost a healing restart 0.25 s a file, twice)
            return checkpoints.complete_ones(spec.cwd, pattern, step_at, want=2, quiet=True)
        except OSError:
            return []

    def resume_target(self, *, rollback: bool = False) -> tuple[str | None, str | None]:
        """(the checkpoint the next run is handed, the one skipped), by the one relaunch
        planner (model/relaunch.py): the newest complete one; the one before it, once,
        when the failed run was handed the newest and failed before it saved anything
        newer. A rollback from a deploy's failed trial: the checkpoint the deploy handed."""
        t = self.core.state.trial
        pinned = t.checkpoint if rollback and t is not None and t.checkpoint else None
        if pinned is not None and not os.path.exists(pinned):
            pinned = None
        ones = self.complete_checkpoints() if pinned is None else []
        facts = relaunch.Facts(
            complete=tuple(relaunch.Candidate(v.path, v.step, v.mtime, v.size) for v in ones),
            failed=True,
            handed=self._handed(ones),
            tried=frozenset(h.resumed_from for h in self.core.life.history if h.resumed_from),
            tolerance=self.core.spec.watch.resume_tolerance,
            pinned=pinned,
        )
        p = relaunch.plan(facts)
        return p.resume, p.skipped

    def _handed(self, ones: list[checkpoints.Verdict]) -> relaunch.Handed | None:
        """What the run that ended was handed, its path as the candidates spell it (a
        link in a snapshot and its target are one file)."""
        g = self.core.state.guard
        if g is None or g.handed is None:
            return None
        real = {os.path.realpath(v.path): v.path for v in ones}
        spelt = real.get(os.path.realpath(g.handed), g.handed)
        mark = real.get(os.path.realpath(g.path), g.path) if g.handed == g.path else g.path
        return relaunch.Handed(spelt, g.handed_step, g.mtime, g.size, mark)

    def healthy_leases(self) -> tuple[GpuLease, ...]:
        """The GPUs the next run gets, by the one relaunch planner (model/relaunch.py):
        the run's own, less those a reset- or reboot-class fault made unhealthy
        (gpu/health.py) and those the stop found still held, when ``min_gpus`` allows
        running on fewer; else TrainctlError says why (the run ends: never relaunched
        onto a lost or held GPU)."""
        leases = self.core.state.gpus
        _, lost = health.split_leases(self.core.jdir.parent.parent, leases)
        report, life = self.core.life.report, self.core.life
        # still held after the stop's release wait: the lifecycle let the relaunch go on
        # without them (the same judgement, lifecycle.gpus_left_out); never started onto
        held = lc.gpus_left_out(report, self.core.spec, lc.gpu_fault_of(life)) if report else None
        sick = {str(u.index): u.line() for u in lost}
        facts = relaunch.Facts(
            asked=tuple(g.label for g in leases),
            unhealthy=frozenset(g.label for g in leases if str(g.index) in sick),
            held=frozenset(g.label for g in leases if held and g.index in held),
            min_gpus=self.core.spec.gpu.min_gpus,
            named=tuple((g.label, sick[str(g.index)]) for g in leases if str(g.index) in sick),
        )
        p = relaunch.plan(facts)
        if p.refused is not None:
            raise TrainctlError(str(p.why))
        keep = tuple(g for g in leases if g.label in p.gpus)
        if p.left_out:
            why = report.held_line() if report is not None and held else None
            why = why or "; ".join(f"GPU {i} is {w}" for i, w in sick.items())
            self.core.log.warning("gpus_left_out", gpus=[g.label for g in keep], why=why)
        return keep
