"""The supervisor's lifecycle as one pure state machine: ``step(life, event) -> (life, actions)``.

One task of the supervisor owns a :class:`Life` and feeds it every event (main exited, a
user's stop, the stall watchdog, a finished stop, the backoff elapsed, a relaunch's
result); watchers and control-socket handlers only send events. The actions it returns
are carried out by the supervisor (run a stop, write the state, wait, relaunch, answer).

The rules that used to be spread over flags and events:

- a user's stop wins in every phase: it joins a stop already running (and turns it into
  a user stop, so no relaunch follows), cancels a pending backoff, and a stop that
  arrives while a successor is being launched is answered with ``forward`` so the CLI
  asks the successor; a stop that returned "stopped" is never followed by a relaunch;
- main exiting on its own, or the watchdog, starts the same stop sequence (to clean up
  leftovers) and the restart policy decides what follows it;
- once the run has ended, every later stop gets the final report at once.

::

    RUNNING --main exited / stop / stalled / started over--> STOPPING --finished--> BACKOFF | ENDED
    STOPPING --stop--> STOPPING (joined; becomes a user stop)
    BACKOFF --stop--> ENDED (stopped)      BACKOFF --elapsed--> RELAUNCHING
    RELAUNCHING --ok--> HANDED_OVER        RELAUNCHING --failed--> ENDED (failed|stopped)

A deploy's new code is judged here too (issue 55: the supervisor is the one controller of
its run). While RUNNING, ``Life.trial`` says what it is held to:

    gate --passed--> probation --passed--> (none)
    gate | probation --failed, or the run ended badly--> STOPPING --> RELAUNCHING (rollback)

A failure in the trial is one decision: with a way back, the rollback, and the restart
policy is not asked; without one, the deploy fails and the policy decides as for any run.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from trainctl.supervisor.model import events
from trainctl.supervisor.model.reports import (
    STARTED_OVER,
    Cause,
    Failure,
    RestartEntry,
    StopReport,
)
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import Phase
from trainctl.supervisor.records import field, record, replace

from . import causes
from .policy import HEALTHY_STRETCH_S, Verdict, backoff_s, count_in_window, decide


class Stage(StrEnum):
    """Where the supervisor is (STORED_AS below says which phase state.json shows for each)."""

    RUNNING = "running"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    RELAUNCHING = "relaunching"
    ENDED = "ended"
    HANDED_OVER = "handed_over"


# The one mapping between the two enums: a Stage is where this supervisor is, a Phase is
# what state.json says of the run. Each stage is stored as one of these phases (the last
# phase an event's actions persist); HANDED_OVER persists nothing: the successor writes.
STORED_AS: dict[Stage, frozenset[Phase]] = {
    Stage.RUNNING: frozenset({Phase.RUNNING}),
    Stage.STOPPING: frozenset({Phase.STOPPING}),
    Stage.BACKOFF: frozenset({Phase.STARTING}),
    Stage.RELAUNCHING: frozenset({Phase.STARTING}),
    Stage.ENDED: frozenset({Phase.STOPPED, Phase.EXITED, Phase.FAILED}),
    Stage.HANDED_OVER: frozenset(),
}


# ---------------------------------------------------------------- events


@record(frozen=True)
class MainExited:
    """The main process was reaped with this shell-style exit code (None: an adopted main,
    not our child, whose exit code nobody can read)."""

    code: int | None


@record(frozen=True)
class StopRequested:
    """A user's `trainctl stop`; ``token`` identifies the client waiting for the answer."""

    token: int
    grace_s: float | None  # None: the job's own grace (the user gave no --grace)
    order: str | None = None
    gpu_timeout_s: float | None = None
    verb: str = "stop"  # the verb that asked: stop, restart, rm (for the run's cause)


@record(frozen=True)
class Stalled:
    """The stall watchdog fired and the spec says ``on_stall = "restart"``."""


@record(frozen=True)
class StartedOver:
    """The checkpoint guard saw the run's first step below its checkpoint's (watch/guard.py):
    it started over and is stopped at once, before its first save; no restart follows."""

    first_step: float
    summary: str  # "started over at step 0; its checkpoint is at step 1050 (...)"


@record(frozen=True)
class GpuLost:
    """A leased GPU took a reset- or reboot-class fault: the run cannot go on on it.

    Facts only (the watcher words nothing): ``causes.gpu_lost`` writes the run's cause."""

    gpu: int | None = None  # the GPU's index
    xid: int | None = None
    action: str = ""  # what the fault needs: "reboot needed", "reset the GPU", ...
    healthy: tuple[str, ...] = ()  # the labels of the run's GPUs left healthy
    leased: int = 0  # how many GPUs the run held


@record(frozen=True)
class StopFinished:
    """The stop sequence ended with ``report``.

    ``cause``: the supervisor's analysis of a run whose main ended on its own (its kind
    and the job's reason: supervisor/life/causes.py); None for a stop trainctl began.
    """

    report: StopReport
    cause: Cause | None = None
    # the newest complete checkpoint's step when the run ended (None: none, or no glob)
    ckpt_step: float | None = None
    resumed_from: str | None = None  # the checkpoint the run was handed (its RESUME_FROM)
    resumed_step: float | None = None  # ... its step
    guard_note: str | None = None  # what the guard did after the stop (put back, kept)
    no_checkpoint: bool = False  # the job names a checkpoint glob and has no complete one
    # the run is a deploy's new code, its probation over (no deployer), and the code it
    # replaced is still there: a policy end on it goes back to that code instead
    rollback_ready: bool = False


@record(frozen=True)
class BackoffElapsed:
    """The restart backoff is over."""


@record(frozen=True)
class Relaunched:
    """The successor supervisor answered (``error`` None) or could not be started."""

    error: str | None = None


@record(frozen=True)
class Observed:
    """What a watcher saw of the run, for its record: members, code drift, a stall mark,
    OOM kills, GPU faults, work handed off. Watchers only look; the owner records it, in
    order, onto the state as it is then: ``put`` replaces fields, ``add`` appends lines
    to a field and keeps the newest ``keep`` of them."""

    put: tuple[tuple[str, object], ...] = ()
    add: tuple[tuple[str, tuple[str, ...], int], ...] = ()  # (field, lines, keep)
    durable: bool = True


@record(frozen=True)
class TrialPassed:
    """A deploy's new run passed its gate (a step past its first one, a checkpoint) or its
    probation (its first complete checkpoint, or the time without a crash or stall)."""

    why: str
    step: float | None = None  # the newest step it reported


@record(frozen=True)
class TrialFailed:
    """A deploy's new run failed its gate or probation while it still runs: no progress
    within the gate, a save behind the checkpoint it was handed, a stall."""

    why: str
    lines: tuple[str, ...] = ()  # the last lines of its log


Event = (
    MainExited
    | StopRequested
    | TrialPassed
    | TrialFailed
    | Stalled
    | StartedOver
    | GpuLost
    | StopFinished
    | BackoffElapsed
    | Relaunched
    | Observed
)

# ---------------------------------------------------------------- actions


@record(frozen=True)
class RunStop:
    """Run the stop sequence (in a thread) and send StopFinished when it is done."""

    reason: str  # "stop" | "main exited" | "stalled"
    grace_s: float
    order: str | None
    gpu_timeout_s: float | None = None


@record(frozen=True)
class Persist:
    """Write the run's phase and these fields to state.json (best effort, never blocking)."""

    phase: Phase
    fields: Mapping[str, object] = field(default_factory=dict)
    durable: bool = True


@record(frozen=True)
class WaitBackoff:
    """Sleep, then send BackoffElapsed (cancelled by CancelBackoff)."""

    seconds: float


@record(frozen=True)
class CancelBackoff:
    """Stop the pending backoff sleep."""


@record(frozen=True)
class ShortenGrace:
    """A later `stop --grace S` joined a running stop: its grace ends within S, never later."""

    seconds: float


@record(frozen=True)
class Relaunch:
    """Hand the job (and supervisor.lock) to a new supervisor for the next run."""

    failure: Failure
    rollback: str | None = None  # back to the code a deploy replaced: why, in a line


@record(frozen=True)
class Reply:
    """Answer these waiting clients: with ``report``, or ``forward`` to the successor."""

    tokens: tuple[int, ...]
    report: StopReport | None = None
    forward: bool = False


@record(frozen=True)
class Record:
    """Write what a watcher observed (see Observed) to state.json, the phase unchanged."""

    put: tuple[tuple[str, object], ...] = ()
    add: tuple[tuple[str, tuple[str, ...], int], ...] = ()
    durable: bool = True


@record(frozen=True)
class Log:
    """Record an event in events.jsonl: a kind trainctl reads back as its typed record
    (model/events.py), any other by its name and fields."""

    event: str | events.Event
    fields: Mapping[str, object] = field(default_factory=dict)


@record(frozen=True)
class Hook:
    """Run the job's hook for ``event`` and tell its notify URL (never waited for)."""

    event: str  # exit | failure | restart (stall and checkpoint_stale come from watchers)
    cause: Cause
    notify: bool = True  # False: the hook only (a failed end notifies once, as `failure`)


@record(frozen=True)
class Judge:
    """A deploy's trial came to a verdict: the owner writes the deploy's report (a
    rollback's is held until its run's guard judged it), its step line and the state's
    trial, and tells on_deploy_failed.

    ``outcome``: deployed (the gate passed) | passed (the probation) | rolled-back |
    failed (no way back, or the rollback could not start) | ended (a user's stop)."""

    outcome: str
    why: str
    rollback_run: int | None = None
    step: float | None = None
    lines: tuple[str, ...] = ()


Action = (
    RunStop
    | Judge
    | Persist
    | Record
    | WaitBackoff
    | CancelBackoff
    | ShortenGrace
    | Relaunch
    | Reply
    | Log
    | Hook
)

# ---------------------------------------------------------------- the machine


@record(frozen=True)
class Life:
    """Everything the lifecycle decides on (frozen: ``step`` returns a new one)."""

    stage: Stage = Stage.RUNNING
    restarts: int = 0
    run: int = 1
    main_code: int | None = None
    stop_reason: str | None = None  # why the current/last stop sequence ran
    user_stop: bool = False  # a user asked to stop this run: no relaunch, phase `stopped`
    stop_by: str = "stop"  # ... with this verb (the first one that asked)
    grace_s: float | None = None  # the grace of the stop that ran
    history: tuple[RestartEntry, ...] = ()  # the job's restarts so far
    waiters: tuple[int, ...] = ()  # clients waiting for the stop's answer
    joined: tuple[int, ...] = ()  # ... of which these joined a stop already running
    report: StopReport | None = None  # the final answer, once the run has ended
    now: float = 0.0  # the time of the event being handled (set by the caller)
    started_at: float = 0.0  # when this run started (a healthy stretch restarts at once)
    gpu_lost: GpuLost | None = None  # the GPU fault that stopped the run
    started_over: str | None = None  # the checkpoint guard stopped the run: why
    rolling_back: str | None = None  # the relaunch goes back to a deploy's previous code
    # a deploy's new code: the trial it is held to now (gate | probation; None: none)
    trial: str | None = None
    trial_rollback: bool = False  # ... and whether a failure there can go back
    trial_of: str = "the deploy"  # ... in words: "deploy 1733-ab12 of 3f2a9c1e7b2d"
    trial_failed: str | None = None  # the trial stopped the run: why


CANCELLED = StopReport(
    ok=True, already_stopped=True, reason="stop during restart backoff: restart cancelled"
)
NOTHING_TO_STOP = StopReport(ok=True, already_stopped=True)


Outcome = tuple[Life, list[Action]]


def step(life: Life, ev: Event, spec: Spec) -> Outcome:
    """Return the next lifecycle and what to do for ``ev``; pure, so it is unit-tested."""
    if isinstance(ev, MainExited):
        return _main_exited(life, ev, spec)
    if isinstance(ev, StopRequested):
        return _stop_requested(life, ev, spec)
    if isinstance(ev, StopFinished):
        return _stop_finished(life, ev, spec)
    if isinstance(ev, Relaunched):
        return _relaunched(life, ev)
    if isinstance(ev, Observed):
        # a look that lands after the run ended must not rewrite its final record
        return life, [] if ended(life) else [Record(ev.put, ev.add, ev.durable)]
    return _timer(life, ev, spec)


def _timer(
    life: Life,
    ev: Stalled | StartedOver | GpuLost | BackoffElapsed | TrialPassed | TrialFailed,
    spec: Spec,
) -> Outcome:
    """The watchdogs, the backoff and a deploy's trial: each matters in one stage only."""
    if isinstance(ev, TrialPassed | TrialFailed):
        return _trial(life, ev, spec)
    if isinstance(ev, StartedOver) and life.stage is Stage.RUNNING:
        # at once, every member, SIGKILL: a trainer that saves on SIGTERM would save the
        # state it started over from onto the checkpoint (run_stop waits for no save)
        life = replace(life, grace_s=0.0, started_over=ev.summary)
        return _begin_stop(life, STARTED_OVER, RunStop(STARTED_OVER, 0.0, "all"))
    if isinstance(ev, GpuLost) and life.stage is Stage.RUNNING:
        # leader-first, as any stop: the healthy ranks get their grace to checkpoint
        life = replace(life, grace_s=spec.stop.grace_s, gpu_lost=ev)
        return _begin_stop(life, "gpu fault", RunStop("gpu fault", spec.stop.grace_s, None))
    if isinstance(ev, Stalled) and life.stage is Stage.RUNNING:
        failed = f"run {life.run} stalled" if life.trial else None
        # the stall's own grace (stall_grace): the healthy ranks of a hung job wait in
        # their collective and cannot save; a whole grace was lost time (issue 56 §2)
        grace = spec.watch.stall_grace(spec.stop.grace_s)
        life = replace(life, grace_s=grace, trial_failed=failed)
        return _begin_stop(life, "stalled", RunStop("stalled", grace, None))
    if isinstance(ev, BackoffElapsed) and life.stage is Stage.BACKOFF:
        cause = life.report.cause if life.report is not None else None
        failure = Failure(
            run=life.run, exit_code=life.main_code, reason=life.stop_reason, cause=cause
        )
        return _to(life, Stage.RELAUNCHING), [Relaunch(failure, life.rolling_back)]
    return life, []


DEPLOY_FAILED = "deploy failed"  # the stop reason when a trial stops the run


def _trial(life: Life, ev: TrialPassed | TrialFailed, spec: Spec) -> Outcome:
    """A verdict of the deploy's trial while the run lives (its end is judged when the
    stop finishes: _trial_ended)."""
    if life.stage is not Stage.RUNNING or life.trial is None:
        return life, []
    stage = life.trial
    if isinstance(ev, TrialPassed):
        after = "probation" if stage == "gate" else None
        outcome = "deployed" if stage == "gate" else "passed"
        return replace(life, trial=after), [
            Judge(outcome, ev.why, step=ev.step),
            Log(f"deploy_{stage}", {"outcome": "passed", "why": ev.why}),
        ]
    why = ev.why if stage == "gate" else f"on probation: {ev.why}"
    if not life.trial_rollback:  # no way back: said, and the run goes on as it is
        return replace(life, trial=None), [
            Judge("failed", why, lines=ev.lines),
            Log(f"deploy_{stage}", {"outcome": "failed", "why": why}),
        ]
    life = replace(life, grace_s=spec.stop.grace_s, trial_failed=why)
    return _begin_stop(life, DEPLOY_FAILED, RunStop(DEPLOY_FAILED, spec.stop.grace_s, None))


def _trial_ended(
    life: Life, spec: Spec, end: _Ending, leftover_log: list[Action]
) -> tuple[Life, list[Action], Outcome | None]:
    """The run of a deploy's new code ended during its trial: the one decision for it.

    A user's stop ends the trial (said); a clean end passes it; a failure rolls back where
    there is a way back, and the restart policy is not asked (one crash, one answer: the
    third element); without one, the deploy fails and the policy decides as for any run.
    """
    stage, cause = str(life.trial), end.cause
    life = replace(life, trial=None)
    if life.user_stop:
        return (
            life,
            [Judge("ended", f"run {life.run} was stopped by `trainctl {life.stop_by}`")],
            None,
        )
    if cause.kind == "clean":
        why = "it finished cleanly" + (" within the gate" if stage == "gate" else "")
        return life, [Judge("deployed" if stage == "gate" else "passed", why)], None
    why = life.trial_failed or f"run {life.run} ended: {cause.summary}"
    if stage == "probation" and not why.startswith("on probation: "):
        why = f"on probation: {why}"
    if not life.trial_rollback:
        return life, [Judge("failed", why)], None
    line = f"{life.trial_of} failed: {why}"
    life, actions = _schedule_relaunch(replace(life, rolling_back=line), spec, end, wait_s=0.0)
    # one line says it: restart_scheduled with its ``rollback`` (no policy verdict beside it)
    return life, [], (life, [*leftover_log, Judge("rolled-back", why, rollback_run=life.run + 1),
                             *actions])  # fmt: skip


def _to(life: Life, stage: Stage, **changes: Any) -> Life:
    return replace(life, stage=stage, **changes)


def _begin_stop(life: Life, reason: str, stop: RunStop) -> Outcome:
    # Signal first, write after: the stop thread starts before the phase is written.
    return _to(life, Stage.STOPPING, stop_reason=reason), [
        stop,
        Persist(Phase.STOPPING, durable=False),
        Log(events.Stopping(reason, stop.grace_s, stop.order)),
    ]


def _main_exited(life: Life, ev: MainExited, spec: Spec) -> Outcome:
    life = replace(life, main_code=ev.code)
    if life.stage is not Stage.RUNNING:
        return life, []  # a stop is running (it made main exit) or the run is over
    # Whatever main left behind (orphaned workers holding GPUs) is cleaned up now, with
    # the grace a stop would give.
    life = replace(life, grace_s=spec.stop.grace_s)
    return _begin_stop(life, "main exited", RunStop("main exited", spec.stop.grace_s, None))


def _stop_requested(life: Life, ev: StopRequested, spec: Spec) -> Outcome:
    stage = life.stage
    if stage is Stage.RUNNING:
        grace = spec.stop.grace_s if ev.grace_s is None else ev.grace_s
        life = replace(life, user_stop=True, waiters=(ev.token,), stop_by=ev.verb, grace_s=grace)
        return _begin_stop(life, "stop", RunStop("stop", grace, ev.order, ev.gpu_timeout_s))
    if stage in (Stage.STOPPING, Stage.RELAUNCHING):
        # Join the running stop (or the launch); from now on nothing relaunches this run.
        joined = replace(
            life,
            stop_by=life.stop_by if life.user_stop else ev.verb,
            user_stop=True,
            waiters=(*life.waiters, ev.token),
            joined=(*life.joined, ev.token),
        )
        actions: list[Action] = [Log("stop_joined", {"stage": str(stage)})]
        if ev.grace_s is not None and stage is Stage.STOPPING:
            actions.append(ShortenGrace(ev.grace_s))
        return joined, actions
    if stage is Stage.BACKOFF:
        ended = _to(life, Stage.ENDED, user_stop=True, report=CANCELLED)
        cause = causes.stopped(ev.verb, life.main_code)
        cause = replace(cause, summary=f"{cause.summary} during the restart backoff")
        return ended, [
            CancelBackoff(),
            Persist(Phase.STOPPING),  # STARTING -> STOPPING -> STOPPED: the legal path
            Persist(Phase.STOPPED, {"restart_at": None, "last_stop": CANCELLED, "cause": cause}),
            Log("restart_cancelled", {"cause": cause.to_doc()}),
            Hook("exit", cause),
            Reply((ev.token,), CANCELLED),
        ]
    if stage is Stage.HANDED_OVER:
        return life, [Reply((ev.token,), forward=True)]
    return life, [Reply((ev.token,), life.report or NOTHING_TO_STOP)]


def _cause_of(life: Life, ev: StopFinished, spec: Spec) -> Cause:
    """The run's cause: who stopped it, or the supervisor's analysis of its own end."""
    # the grace the stop applied (a joining `stop --grace S` may have shortened it)
    grace = life.grace_s
    if ev.report.signal and (grace is None or ev.report.grace_s < grace):
        grace = ev.report.grace_s
    if life.user_stop:
        return causes.stopped(life.stop_by, life.main_code, grace)
    if life.stop_reason == "stalled":
        return causes.stopped("stall watchdog", life.main_code, grace)
    if (ours := _verdict_cause(life, ev)) is not None:
        return ours
    if life.stop_reason == "gpu fault" and (lost := life.gpu_lost) is not None:
        return causes.gpu_lost(
            causes.LostGpu(lost.gpu, lost.xid, lost.action, lost.healthy, lost.leased),
            job=spec.name,
            min_gpus=spec.gpu.min_gpus,
            code=life.main_code,
        )
    if ev.cause is not None:
        return ev.cause
    return causes.ended_on_its_own(life.main_code, None, causes.Reason())


def _verdict_cause(life: Life, ev: StopFinished) -> Cause | None:
    """The cause of a run trainctl stopped on a verdict of its own: the checkpoint guard
    (it started over) or a deploy's trial (the new code failed its gate or probation)."""
    if life.stop_reason == STARTED_OVER and life.started_over is not None:
        note = f"; {ev.guard_note}" if ev.guard_note else ""
        return Cause(kind="started-over", summary=life.started_over + note,
                     exit_code=life.main_code)  # fmt: skip
    if life.stop_reason == DEPLOY_FAILED and life.trial_failed is not None:
        return Cause(kind="deploy-failed", summary=f"{life.trial_of} failed: {life.trial_failed}",
                     exit_code=life.main_code)  # fmt: skip
    return None


@record(frozen=True)
class _Ending:
    """What every end of a stop records, whatever follows it (a relaunch or the end)."""

    report: StopReport  # with its reason (the run's cause is added once it is final)
    cause: Cause
    reason: str  # stop | main exited | stalled
    verdict: Verdict
    fields: Mapping[str, object]  # the state's fields for the end of the run: exit code, when
    ckpt_step: float | None = None
    resumed_from: str | None = None
    resumed_step: float | None = None


def _stop_finished(life: Life, ev: StopFinished, spec: Spec) -> Outcome:
    """The stop sequence is done: name the run's cause, then relaunch it or end."""
    if life.stage is not Stage.STOPPING:
        return life, []
    reason = "stop" if life.user_stop else str(life.stop_reason)
    report = replace(ev.report, reason=reason)
    cause, leftover_log = _with_leftovers(life, _cause_of(life, ev, spec), report)
    lost = gpu_fault_of(life)
    left_out = gpus_left_out(report, spec, lost)
    verdict = decide(
        spec,
        restarts=life.restarts,
        cause=cause,
        cleaned_up=report.ok or left_out is not None,
        reason=reason,
        history=life.history,
        now=life.now,
        ckpt_step=ev.ckpt_step,
        no_checkpoint=ev.no_checkpoint,
        healthy_gpus=(len(lost.healthy) - len(left_out or ())) if lost is not None else None,
        held=report.held_line(),
    )
    ended = {"exit_code": life.main_code, "ended_at": life.now, "members": ()}
    end = _Ending(
        report, cause, reason, verdict, ended, ev.ckpt_step, ev.resumed_from, ev.resumed_step
    )
    judged: list[Action] = []
    if life.trial is not None:
        life, judged, decided = _trial_ended(life, spec, end, leftover_log)
        if decided is not None:
            return decided
    if verdict.gave_up and ev.rollback_ready and not life.user_stop:
        life, actions = _schedule_rollback(life, spec, end, leftover_log)
        return life, [*judged, *actions]
    life, actions = _schedule_relaunch(life, spec, end) if verdict.relaunch else _end(life, end)
    return life, [*judged, *leftover_log, *actions]


def _schedule_rollback(life: Life, spec: Spec, end: _Ending, leftover_log: list[Action]) -> Outcome:
    """Probation that holds: a deploy's code the policy gave up on (its restarts
    exhausted, a crash loop, no progress) is not the end of the job; the code it replaced
    runs again, from the newest complete checkpoint, with a budget of its own (as Argo
    Rollouts and Kubernetes' progress deadline go back to the last good revision)."""
    verdict = end.verdict
    line = f"{verdict.gave_up} on the deploy's new code ({verdict.why}): back to the previous code"
    gave = causes.gave_up(str(verdict.gave_up), end.cause, life.restarts, line)
    end = replace(end, cause=gave, verdict=replace(verdict, gave_up=None))
    life, actions = _schedule_relaunch(replace(life, rolling_back=line), spec, end, wait_s=0.0)
    return life, [*leftover_log, *actions]


def gpu_fault_of(life: Life) -> GpuLost | None:
    """The GPU fault that stopped the run (not a user's stop that joined it), if any."""
    return life.gpu_lost if not life.user_stop and life.stop_reason == "gpu fault" else None


def gpus_left_out(report: StopReport, spec: Spec, lost: GpuLost | None) -> set[int] | None:
    """The GPUs a relaunch leaves out, when nothing of the run is left and only they stand
    in its way: the lost one (its driver answers nothing), and, with ``min_gpus``, those
    still held after the release wait (a leftover holder, never started onto) while at
    least ``min_gpus`` of the others are released. None: the run's end is not that."""
    if report.survivors or report.unproven is not None:
        return None
    lost_gpu = {lost.gpu} if lost is not None and lost.gpu is not None else set()
    held = {g.index for g in report.gpus if not g.ok} - lost_gpu
    if not held and not lost_gpu:
        return None  # the stop failed for another reason than a GPU
    need = spec.gpu.min_gpus
    if held and (need is None or len(report.gpus) - len(held | lost_gpu) < need):
        return None
    return held


def _with_leftovers(life: Life, cause: Cause, report: StopReport) -> tuple[Cause, list[Action]]:
    """Processes that outlived their main (the stale-download case this tool exists for):
    the cause counts them, and the log names a few."""
    left = report.found if life.stop_reason == "main exited" else 0
    if not left or life.user_stop:
        return cause, []
    cmds = [p.cmd for p in report.sent][:5]
    summary = f"{cause.summary}; {left} leftover process(es) stopped"
    cause = replace(cause, leftovers=left, summary=summary)
    return cause, [Log("leftovers_cleaned", {"count": left, "cmds": cmds})]


def _saved_since(
    history: tuple[RestartEntry, ...], ckpt_step: float | None, resumed_step: float | None
) -> bool:
    """The newest complete checkpoint is past the one of the last restart's failure, or,
    at a first failure, past the one the run was handed (any, when it was handed none)."""
    if ckpt_step is None:
        return False
    last = next((h for h in reversed(history) if h.kind != "gpu"), None)
    if last is not None:
        return last.ckpt_step is not None and ckpt_step > last.ckpt_step
    return resumed_step is None or ckpt_step > resumed_step


def _schedule_relaunch(
    life: Life, spec: Spec, end: _Ending, wait_s: float | None = None
) -> Outcome:
    """The policy relaunches: record the failure and the restart, then wait the backoff.

    Straight from STOPPING to STARTING: `wait` and `logs -f` must never see a terminal
    phase for a run that is about to be relaunched."""
    cause = end.cause
    # a GPU fault restarts at once: the hardware failed, not the code; so does the first
    # failure after a healthy stretch (nothing restarted within the window, and the run
    # ran HEALTHY_STRETCH_S), and a failure after the run saved a checkpoint past the one
    # of the last failure: a backoff is for a loop, and a loop saves nothing new (a
    # week-long run's one crash cost every fault its 5 s, two faults a minute apart 2 s
    # more: issue 56)
    count = count_in_window(spec, life.history, life.now)
    healthy = (count == 0 and 0 < life.started_at <= life.now - HEALTHY_STRETCH_S) or (
        _saved_since(life.history, end.ckpt_step, end.resumed_step)
    )
    wait = 0.0 if cause.kind == "gpu" or healthy else backoff_s(spec, count)
    wait = wait if wait_s is None else wait_s
    failure = Failure(
        run=life.run, exit_code=life.main_code, at=life.now, reason=end.reason, cause=cause
    )
    entry = RestartEntry(
        run=life.run, at=life.now, cause=cause.summary, kind=cause.kind,
        matched=end.verdict.matched, ckpt_step=end.ckpt_step, resumed_from=end.resumed_from,
        resumed_step=end.resumed_step,
    )  # fmt: skip
    history = (*life.history, entry)[-50:]
    report = replace(end.report, cause=cause)
    fields = {
        **end.fields,
        "last_stop": report,
        "restart_at": life.now + wait,
        "last_failure": failure,
        "cause": cause,
        "restart_history": history,
    }
    scheduled = events.RestartScheduled(
        wait, life.restarts, failure.run, failure.exit_code, failure.at, failure.reason,
        failure.cause, rollback=life.rolling_back,
    )  # fmt: skip
    return _to(life, Stage.BACKOFF, report=report, history=history), [
        Persist(Phase.STARTING, fields),
        Log(scheduled),
        Hook("restart", cause),
        WaitBackoff(wait),
    ]


def _end(life: Life, end: _Ending) -> Outcome:
    """No relaunch: the run's final phase, its record, its hooks and every waiter's answer."""
    cause, verdict = end.cause, end.verdict
    if end.reason == "stop":
        final = Phase.STOPPED
    else:
        # an adopted main's end is `exited`: its exit code is unknown, not a failure
        final = Phase.EXITED if cause.kind in ("clean", "unknown") else Phase.FAILED
    fields: dict[str, object] = {}
    if verdict.gave_up:
        # the run the policy gave up on is the last failure now, not the one before it
        fields["last_failure"] = Failure(
            run=life.run, exit_code=life.main_code, at=life.now, reason=end.reason, cause=cause
        )
        cause = causes.gave_up(verdict.gave_up, cause, life.restarts, verdict.why)
    report = replace(end.report, cause=cause)
    fields = {**end.fields, **fields, "last_stop": report, "cause": cause}
    actions: list[Action] = []
    if verdict.why:
        actions.append(Log("not_restarting", {"why": verdict.why}))
        fields["error"] = verdict.why
    actions += [
        Persist(final, fields),
        Log(events.Ended(life.run, str(final), cause)),
        Hook("exit", cause, notify=final is not Phase.FAILED),
    ]
    if final is Phase.FAILED:
        actions.append(Hook("failure", cause))
    actions.append(Reply(life.waiters, report))
    return _to(life, Stage.ENDED, report=report, waiters=()), actions


def _relaunched(life: Life, ev: Relaunched) -> Outcome:
    if life.stage is not Stage.RELAUNCHING:
        return life, []
    if ev.error is None:
        # The successor owns the job now: a stop that waited here must ask it instead.
        return _to(life, Stage.HANDED_OVER, waiters=()), [Reply(life.waiters, forward=True)]
    failed = {"restart_at": None, "error": f"relaunch failed: {ev.error}"}
    report = life.report or NOTHING_TO_STOP
    actions: list[Action] = [Log("relaunch_failed", {"error": ev.error})]
    if life.rolling_back is not None:  # a rollback's held report is not what happened
        actions.append(Judge("failed", f"{life.rolling_back}; the rollback failed: {ev.error}"))
    if life.user_stop:
        cause = causes.stopped(life.stop_by, life.main_code)
        actions += [Persist(Phase.STOPPING), Persist(Phase.STOPPED, {**failed, "cause": cause})]
        actions.append(Hook("exit", cause))
    else:
        last = report.cause or Cause(kind="unknown", summary="a failed run")
        why = f"relaunch failed: {ev.error}"
        gave = causes.gave_up("relaunch-failed", last, life.restarts, why)
        actions.append(Persist(Phase.FAILED, {**failed, "cause": gave}))
        actions += [Hook("exit", gave, notify=False), Hook("failure", gave)]
    actions.append(Reply(life.waiters, report))
    return _to(life, Stage.ENDED, report=report, waiters=()), actions


def ended(life: Life) -> bool:
    """Tell whether this supervisor has nothing left to supervise."""
    return life.stage in (Stage.ENDED, Stage.HANDED_OVER)
