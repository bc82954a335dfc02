"""A deploy's records and files under ``<job>/deploys/``, shared by the verb, the
deployer and the supervisors that judge the new code.

The deployer (launcher/ops/deploy.py) takes the checkpoint, keeps it aside, stops the
running run and starts the new code; from there the run's own supervisor is the one
controller of the deploy (issue 55): it holds the new code to its gate and probation
(:class:`Trial`, state.json ``trial``), and a failure there is one decision of its
lifecycle, a rollback or not. The rollback run's supervisor writes the final report
once its checkpoint guard has judged it (:func:`pending_rollback`).

Files, for deploy ``ID``:

- ``ID.plan.json``: the verb's plan (launcher/results/ops.py ``DeployPlan``);
- ``ID.trial.json``: what the new run is held to (:class:`Trial`), claimed by the first
  run that starts with ``TRAINCTL_DEPLOY=ID`` (its ``run``);
- ``ID.steps.jsonl``: each step, in words (:class:`DeployStep`), whoever wrote it;
- ``ID.report.json``: how it ended (:class:`DeployReport`; a second one replaces the
  first when new code that passed its gate is rolled back in its probation);
- ``ID.rollback.json``: a rollback's report, until its run's guard judged it;
- ``ID.previous.json``: the spec of the run the deploy replaced (the way back);
- ``ID.cancel``: the verb was interrupted before the stop.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from trainctl.supervisor.errors import StateError, TrainctlError
from trainctl.supervisor.records import JsonObject, asdict, field, record, replace

from . import events, keepsafe, layout
from .reports import GATE, Trial
from .schema import build_document
from .state import open_append, write_json_atomic


@record(frozen=True)
class DeployStep:
    """One line of a deploy's progress, as the deployer or the supervisor wrote it."""

    step: str  # checkpoint | keep | stop | start | gate | probation | rollback | done
    line: str
    at: float = 0.0
    left_s: float | None = None  # a wait's time left when it was written


@record(frozen=True)
class DeployReport:
    """How a deploy ended: deployed, rolled back, failed (nothing rolled back) or cancelled."""

    id: str
    name: str
    outcome: str  # deployed | rolled-back | failed | cancelled | refused
    step: str  # the step it ended in
    summary: str
    from_run: int | None = None
    to_run: int | None = None
    rollback_run: int | None = None
    from_commit: str | None = None
    to_commit: str | None = None
    checkpoint: str | None = None  # what the new run (and a rollback) resumed from
    resumed_step: float | None = None  # the first step the new run reported
    reached_step: float | None = None
    cause: str | None = None  # why the gate failed
    last_lines: list[str] = field(default_factory=list)
    started_at: float = 0.0
    ended_at: float = 0.0
    checkpoint_step: float | None = None  # the step of the checkpoint handed over
    kept: str | None = None  # where the handed checkpoint is kept aside until probation ends
    restored: bool = False  # the kept copy was put back (the new code overwrote it)
    probation_until: float | None = None  # deployed, on probation until then (or a save)

    @property
    def ok(self) -> bool:
        """The new code runs and passed its gate."""
        return self.outcome == "deployed"

    def event(self) -> events.Deploy:
        """The typed `deploy` event: what history and report read back (the line has the
        whole report, :meth:`to_doc`, beside it)."""
        return events.Deploy(
            self.outcome, self.from_run, self.to_run, self.rollback_run, self.from_commit,
            self.to_commit, self.checkpoint,
        )  # fmt: skip

    def to_doc(self) -> JsonObject:
        """The JSON form (the report file, `deploy --json`)."""
        return {**asdict(self), "ok": self.ok}


def trial_report(trial: Trial, outcome: str, summary: str, **more: object) -> DeployReport:
    """The deploy's report, as its trial ended."""
    t = trial
    return DeployReport(
        id=t.id, name=t.name, outcome=outcome, step=t.stage, summary=summary,
        from_run=t.from_run, to_run=t.run, from_commit=t.from_commit, to_commit=t.to_commit,
        checkpoint=t.checkpoint, checkpoint_step=t.checkpoint_step, kept=t.kept,
        started_at=t.started_at, ended_at=time.time(), resumed_step=t.first_step,
        **more,  # type: ignore[arg-type]
    )  # fmt: skip


def deploys_dir(jdir: Path) -> Path:
    return jdir / layout.DEPLOYS


def plan_path(jdir: Path, did: str) -> Path:
    return deploys_dir(jdir) / f"{did}.plan.json"


def trial_path(jdir: Path, did: str) -> Path:
    return deploys_dir(jdir) / f"{did}.trial.json"


def steps_path(jdir: Path, did: str) -> Path:
    return deploys_dir(jdir) / f"{did}.steps.jsonl"


def report_path(jdir: Path, did: str) -> Path:
    return deploys_dir(jdir) / f"{did}.report.json"


def rollback_path(jdir: Path, did: str) -> Path:
    return deploys_dir(jdir) / f"{did}.rollback.json"


def cancel_path(jdir: Path, did: str) -> Path:
    return deploys_dir(jdir) / f"{did}.cancel"


def say(jdir: Path, did: str, step: str, line: str, left_s: float | None = None) -> None:
    """Append one step line (best effort: a full disk costs the verb a line, not the run)."""
    doc = asdict(DeployStep(step, line, time.time(), left_s))
    with contextlib.suppress(OSError, ValueError, TrainctlError):
        fd = open_append(steps_path(jdir, did))
        try:
            os.write(fd, (json.dumps(doc) + "\n").encode())
        finally:
            os.close(fd)


def write_report(jdir: Path, rep: DeployReport) -> None:
    """The report file (what the verb waits for) and its `deploy` event."""
    write_json_atomic(report_path(jdir, rep.id), rep.to_doc())
    with contextlib.suppress(OSError):
        events.append_event(jdir, rep.event(), **rep.to_doc())


def claim_trial(jdir: Path, did: str, run: int, now: float) -> Trial | None:
    """The trial of deploy ``did``, claimed by run ``run`` (its gate starts now); None when
    there is none, or an earlier run claimed it (a later run of the same code: a policy
    restart after the probation is not judged again)."""
    path = trial_path(jdir, did)
    try:
        trial = build_document(Trial, json.loads(path.read_text()), str(path))
    except (OSError, ValueError, TrainctlError):
        return None
    if trial.run is not None and trial.run != run:
        return None
    trial = replace(trial, run=run, stage=GATE, since=now, until=now + trial.health_s)
    try:
        write_json_atomic(path, asdict(trial))
    except OSError:
        return None  # unclaimed, it would be judged again by the next run: not at all
    return trial


def report_at(path: Path) -> DeployReport:
    """A report file, checked field by field (FileNotFoundError: there is none;
    StateError: it is not a report)."""
    try:
        doc = json.loads(path.read_text())
    except ValueError:
        raise StateError(f"{path} is not valid JSON") from None
    if isinstance(doc, dict):
        doc.pop("ok", None)  # derived from the outcome
    return build_document(DeployReport, doc, str(path))


def hold_rollback(jdir: Path, rep: DeployReport) -> None:
    """A rollback's report, held until the rollback run's guard has judged it."""
    write_json_atomic(rollback_path(jdir, rep.id), rep.to_doc())


def pending_rollback(jdir: Path, run: int) -> DeployReport | None:
    """The held report of the deploy that rolled back into run ``run``, if any."""
    with contextlib.suppress(OSError):
        for path in sorted(deploys_dir(jdir).glob("*.rollback.json"))[-3:][::-1]:
            with contextlib.suppress(OSError, TrainctlError):
                rep = report_at(path)
                if rep.rollback_run == run:
                    return rep
    return None


def release_rollback(jdir: Path, rep: DeployReport) -> None:
    """Write the held rollback report as the deploy's final one."""
    with contextlib.suppress(OSError, TrainctlError):
        write_report(jdir, replace(rep, ended_at=time.time()))
        rollback_path(jdir, rep.id).unlink(missing_ok=True)


@record(frozen=True)
class _Handed:
    """The checkpoint a deploy handed over, as keepsafe holds one."""

    path: str
    mtime: float
    size: int


def put_back(t: Trial, cwd: str) -> tuple[bool, list[str]]:
    """Before the old code runs again: the new code's checkpoints behind the handed one
    moved aside, and the kept copy put back if the new code changed it. (whether the
    copy went back, what was done in lines); never raises."""
    if t.checkpoint is None or not t.checkpoint_glob or t.checkpoint_mtime is None:
        return False, []
    done: list[str] = []
    try:
        if t.checkpoint_step is not None:
            moved = keepsafe.reject_behind(
                cwd, t.checkpoint_glob, t.checkpoint_mtime, t.checkpoint_step, t.id
            )
            if moved:
                done.append(f"moved aside the new code's checkpoints behind step "
                            f"{t.checkpoint_step:g}: {', '.join(moved)}")  # fmt: skip
        ck = _Handed(t.checkpoint, t.checkpoint_mtime, t.checkpoint_size)
        if t.kept is None or not keepsafe.changed_since(ck):
            return False, done
        keepsafe.restore(t.kept, ck)
    except OSError as e:
        return False, [*done, f"could not put checkpoint {t.checkpoint} back ({e.strerror or e})"]
    step = "" if t.checkpoint_step is None else f" (step {t.checkpoint_step:g})"
    done.append(f"checkpoint {t.checkpoint} was changed by the new code: put back the one "
                f"handed over{step}")  # fmt: skip
    return True, done
