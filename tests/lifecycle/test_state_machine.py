"""The supervisor's lifecycle, event by event (pure: no processes, no clock, no disk)."""

from __future__ import annotations

import dataclasses

import pytest

from trainctl.supervisor.life import lifecycle as lc
from trainctl.supervisor.model import events
from trainctl.supervisor.model.reports import Cause, RestartEntry, StopReport
from trainctl.supervisor.model.spec import RestartPolicy, Spec, StopPolicy, Watch
from trainctl.supervisor.model.state import Phase

SPEC = Spec(
    name="j",
    argv=("true",),
    cwd="/",
    env={},
    stop=StopPolicy(grace_s=5.0),
    restart=RestartPolicy(mode="on-failure", max_restarts=2, backoff_s=1.0),
)
CLEAN = StopReport(ok=True, killed=0)


def run(events: list[lc.Event], spec: Spec = SPEC, life: lc.Life | None = None):  # type: ignore[no-untyped-def]
    """Feed events in order; return the final life and every action, flattened."""
    life = life or lc.Life()
    actions: list[lc.Action] = []
    for ev in events:
        life, acts = lc.step(life, ev, spec)
        actions += acts
    return life, actions


def kinds(actions: list[lc.Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def persisted(actions: list[lc.Action]) -> list[Phase]:
    return [a.phase for a in actions if isinstance(a, lc.Persist)]


def replies(actions: list[lc.Action]) -> list[lc.Reply]:
    return [a for a in actions if isinstance(a, lc.Reply)]


def test_user_stop_runs_the_stop_first_and_writes_after() -> None:
    life, actions = run([lc.StopRequested(1, 2.0, "all")])
    assert life.stage is lc.Stage.STOPPING
    assert isinstance(actions[0], lc.RunStop)  # signal first ...
    assert actions[0] == lc.RunStop("stop", 2.0, "all", None)
    assert persisted(actions) == [Phase.STOPPING]  # ... write after


def test_user_stop_ends_stopped_and_answers_every_waiter() -> None:
    events: list[lc.Event] = [lc.StopRequested(1, 2.0), lc.StopRequested(2, 9.0)]
    life, actions = run([*events, lc.MainExited(143), lc.StopFinished(CLEAN)])
    assert life.stage is lc.Stage.ENDED
    assert kinds(actions).count("RunStop") == 1  # the second stop joined the first
    assert persisted(actions)[-1] is Phase.STOPPED
    (reply,) = replies(actions)
    assert reply.tokens == (1, 2)
    assert reply.report is not None
    assert reply.report.reason == "stop"


def test_main_failure_cleans_up_then_backs_off_then_relaunches() -> None:
    life, actions = run([lc.MainExited(3), lc.StopFinished(CLEAN)])
    assert life.stage is lc.Stage.BACKOFF
    assert lc.WaitBackoff(1.0) in actions
    assert persisted(actions) == [Phase.STOPPING, Phase.STARTING]  # never a terminal phase
    life, actions = run([lc.BackoffElapsed()], life=life)
    assert life.stage is lc.Stage.RELAUNCHING
    assert kinds(actions) == ["Relaunch"]
    life, actions = run([lc.Relaunched()], life=life)
    assert life.stage is lc.Stage.HANDED_OVER
    assert lc.ended(life)


def test_a_stop_during_the_cleanup_after_main_exited_is_never_undone() -> None:
    """The race where a user's stop joined the cleanup and the policy relaunched anyway."""
    life, actions = run([lc.MainExited(3), lc.StopRequested(7, 5.0), lc.StopFinished(CLEAN)])
    assert life.stage is lc.Stage.ENDED
    assert "WaitBackoff" not in kinds(actions)
    assert "Relaunch" not in kinds(actions)
    assert persisted(actions)[-1] is Phase.STOPPED
    assert replies(actions)[0].tokens == (7,)


def test_a_stop_during_the_backoff_cancels_the_relaunch() -> None:
    life, _ = run([lc.MainExited(1), lc.StopFinished(CLEAN)])
    life, actions = run([lc.StopRequested(4, 5.0), lc.BackoffElapsed()], life=life)
    assert life.stage is lc.Stage.ENDED
    assert "CancelBackoff" in kinds(actions)
    assert "Relaunch" not in kinds(actions)
    assert persisted(actions) == [Phase.STOPPING, Phase.STOPPED]
    assert replies(actions)[0].report == lc.CANCELLED


def test_a_stop_during_the_relaunch_is_forwarded_to_the_successor() -> None:
    life, _ = run([lc.MainExited(1), lc.StopFinished(CLEAN), lc.BackoffElapsed()])
    life, actions = run([lc.StopRequested(5, 5.0), lc.Relaunched()], life=life)
    assert life.stage is lc.Stage.HANDED_OVER
    (reply,) = replies(actions)
    assert reply.tokens == (5,)
    assert reply.forward
    # and one that comes later still is sent on too
    _, actions = run([lc.StopRequested(6, 5.0)], life=life)
    assert replies(actions)[0].forward


def test_a_failed_relaunch_after_a_user_stop_ends_stopped() -> None:
    life, _ = run([lc.MainExited(1), lc.StopFinished(CLEAN), lc.BackoffElapsed()])
    life, actions = run([lc.StopRequested(5, 5.0), lc.Relaunched("no such file")], life=life)
    assert life.stage is lc.Stage.ENDED
    assert persisted(actions) == [Phase.STOPPING, Phase.STOPPED]
    life2, actions2 = run([lc.MainExited(1), lc.StopFinished(CLEAN), lc.BackoffElapsed()])
    _, actions2 = run([lc.Relaunched("boom")], life=life2)
    assert persisted(actions2) == [Phase.FAILED]


@pytest.mark.parametrize(
    ("code", "restarts", "final"),
    [(0, 0, Phase.EXITED), (3, 2, Phase.FAILED)],  # clean exit; restarts exhausted
)
def test_no_relaunch_when_the_policy_says_no(code: int, restarts: int, final: Phase) -> None:
    life, actions = run(
        [lc.MainExited(code), lc.StopFinished(CLEAN)], life=lc.Life(restarts=restarts)
    )
    assert life.stage is lc.Stage.ENDED
    assert persisted(actions)[-1] is final


def test_leftovers_that_survived_block_the_relaunch() -> None:
    life, actions = run([lc.MainExited(3), lc.StopFinished(StopReport(ok=False))])
    assert life.stage is lc.Stage.ENDED
    assert persisted(actions)[-1] is Phase.FAILED


def test_stall_restarts_only_while_running() -> None:
    spec = dataclasses.replace(SPEC, watch=Watch(on_stall="restart"))
    life, actions = run([lc.Stalled()], spec=spec)
    assert life.stage is lc.Stage.STOPPING
    assert actions[0] == lc.RunStop("stalled", 5.0, None)
    life, actions = run([lc.Stalled()], spec=spec, life=life)
    assert actions == []
    life, actions = run([lc.StopFinished(CLEAN)], spec=spec, life=life)
    assert life.stage is lc.Stage.BACKOFF  # the watchdog's stop may relaunch


def test_a_stop_after_the_end_gets_the_final_report_at_once() -> None:
    life, _ = run([lc.StopRequested(1, 2.0), lc.StopFinished(CLEAN)])
    life, actions = run([lc.StopRequested(2, 2.0), lc.MainExited(0), lc.Stalled()], life=life)
    assert kinds(actions) == ["Reply"]
    report = replies(actions)[0].report
    assert report is not None
    assert dataclasses.replace(report, cause=None) == dataclasses.replace(CLEAN, reason="stop")
    assert report.cause is not None
    assert report.cause.kind == "stopped"
    assert report.cause.by == "stop"


def test_events_out_of_their_stage_change_nothing() -> None:
    life = lc.Life()
    for ev in (lc.StopFinished(CLEAN), lc.BackoffElapsed(), lc.Relaunched()):
        assert lc.step(life, ev, SPEC) == (life, [])


def test_a_watchers_look_is_recorded_by_the_owner_until_the_run_has_ended() -> None:
    look = lc.Observed(put=(("oom_kills", 1),), add=(("gpu_faults", ("Xid 79",), 20),))
    life, acts = run([look])
    assert acts == [lc.Record(look.put, look.add)]
    assert life == lc.Life()  # a look decides nothing
    ended = dataclasses.replace(lc.Life(), stage=lc.Stage.ENDED)
    assert run([look], life=ended)[1] == []  # the final record is never rewritten
    stopping = dataclasses.replace(lc.Life(), stage=lc.Stage.STOPPING)
    assert kinds(run([look], life=stopping)[1]) == ["Record"]  # members seen mid-stop


def test_every_stage_is_stored_as_its_phase_and_every_move_is_legal() -> None:
    """Random event orders (seeded): after each step, the last phase written belongs to
    the new stage (lc.STORED_AS, the one mapping of Stage to Phase), and every phase move
    written is one state.TRANSITIONS allows."""
    import random  # noqa: PLC0415  (this test's generator only)

    from trainctl.supervisor.model.state import TRANSITIONS  # noqa: PLC0415

    pool: list[lc.Event] = [
        lc.MainExited(0),
        lc.MainExited(1),
        lc.MainExited(143),
        lc.StopRequested(1, 2.0),
        lc.StopRequested(2, None),
        lc.StopFinished(CLEAN),
        lc.StopFinished(StopReport(ok=False, killed=1)),
        lc.BackoffElapsed(),
        lc.Relaunched(),
        lc.Relaunched(error="exec failed"),
        lc.Stalled(),
        lc.Observed(put=(("oom_kills", 1),)),
    ]
    stall = dataclasses.replace(SPEC, watch=Watch(stall_timeout_s=5.0, on_stall="restart"))
    rng = random.Random(34)  # noqa: S311  (a seeded test generator, not a secret)
    for spec in (SPEC, stall):
        for _ in range(400):
            life, phase = lc.Life(), Phase.RUNNING
            for ev in rng.choices(pool, k=10):
                life, actions = lc.step(life, ev, spec)
                written = persisted(actions)
                for nxt in written:
                    assert nxt in TRANSITIONS[phase], (phase, nxt, ev)
                    phase = nxt
                if written:
                    assert written[-1] in lc.STORED_AS[life.stage], (life.stage, written, ev)


# ---------------------------------------------------------------- a deploy's trial (issue 55)

CRASH = Cause(kind="exit", summary="exited with code 1 (RuntimeError: eval blew up)", exit_code=1)
TRIAL = lc.Life(trial="gate", trial_rollback=True, trial_of="deploy 1-ab of 3f2a9c1e")


def judged(actions: list[lc.Action]) -> list[tuple[str, str]]:
    return [(a.outcome, a.why) for a in actions if isinstance(a, lc.Judge)]


def test_a_trial_passes_its_gate_then_its_probation_and_is_over() -> None:
    life, actions = run([lc.TrialPassed("step 12, past step 10", 12.0)], life=TRIAL)
    assert (life.stage, life.trial) == (lc.Stage.RUNNING, "probation")
    assert judged(actions) == [("deployed", "step 12, past step 10")]
    life, actions = run([lc.TrialPassed("it saved checkpoint ck-20")], life=life)
    assert life.trial is None
    assert judged(actions) == [("passed", "it saved checkpoint ck-20")]
    life, actions = run([lc.TrialPassed("again")], life=life)  # no trial: nothing
    assert actions == []


@pytest.mark.parametrize("stage", ["gate", "probation"])
def test_a_crash_in_the_trial_is_one_decision_the_rollback(stage: str) -> None:
    """One crash, one answer: the rollback at once, the restart policy not asked (it
    would have relaunched the new code after its backoff, and a deployer rolled back over
    it: two controllers)."""
    life = dataclasses.replace(TRIAL, trial=stage)
    life, actions = run([lc.MainExited(1), lc.StopFinished(CLEAN, cause=CRASH)], life=life)
    assert life.stage is lc.Stage.BACKOFF
    assert lc.WaitBackoff(0.0) in actions  # no backoff
    (scheduled,) = [a.event for a in actions if isinstance(a, lc.Log)
                    and isinstance(a.event, events.RestartScheduled)]  # fmt: skip
    why = ("on probation: " if stage == "probation" else "") + "run 1 ended: exited with code 1"
    assert scheduled.rollback is not None
    assert scheduled.rollback.startswith(f"deploy 1-ab of 3f2a9c1e failed: {why}")
    assert [o for o, _ in judged(actions)] == ["rolled-back"]
    assert not [a for a in actions if isinstance(a, lc.Log) and a.event == "not_restarting"]
    life, actions = run([lc.BackoffElapsed()], life=life)
    (relaunch,) = actions
    assert isinstance(relaunch, lc.Relaunch)
    assert relaunch.rollback == scheduled.rollback


def test_a_failed_trial_without_a_way_back_leaves_the_run_to_the_policy() -> None:
    life = dataclasses.replace(TRIAL, trial_rollback=False)
    life, actions = run([lc.TrialFailed("no progress within 2 s")], life=life)
    assert life.stage is lc.Stage.RUNNING  # not stopped: nothing to go back to
    assert judged(actions) == [("failed", "no progress within 2 s")]
    life = dataclasses.replace(TRIAL, trial="probation", trial_rollback=False)
    life, actions = run([lc.MainExited(1), lc.StopFinished(CLEAN, cause=CRASH)], life=life)
    assert [o for o, _ in judged(actions)] == ["failed"]
    assert life.stage is lc.Stage.BACKOFF  # on-failure relaunches the new code, as any run
    assert lc.WaitBackoff(1.0) in actions


def test_a_gate_that_fails_while_the_run_lives_stops_it_then_rolls_back() -> None:
    life, actions = run([lc.TrialFailed("no progress within 2 s")], life=TRIAL)
    assert actions[0] == lc.RunStop(lc.DEPLOY_FAILED, 5.0, None)
    life, actions = run([lc.MainExited(143), lc.StopFinished(CLEAN)], life=life)
    (persist,) = [a for a in actions if isinstance(a, lc.Persist)]
    cause = persist.fields["cause"]
    assert isinstance(cause, Cause)
    assert (cause.kind, cause.summary) == (
        "deploy-failed",
        "deploy 1-ab of 3f2a9c1e failed: no progress within 2 s",
    )
    assert judged(actions) == [("rolled-back", "no progress within 2 s")]


def test_a_user_stop_ends_the_trial_and_a_clean_end_passes_it() -> None:
    life, actions = run([lc.StopRequested(1, 2.0), lc.StopFinished(CLEAN)], life=TRIAL)
    assert life.stage is lc.Stage.ENDED
    assert judged(actions) == [("ended", "run 1 was stopped by `trainctl stop`")]
    clean = Cause(kind="clean", summary="exited 0", exit_code=0)
    life, actions = run([lc.MainExited(0), lc.StopFinished(CLEAN, cause=clean)], life=TRIAL)
    assert life.stage is lc.Stage.ENDED
    assert judged(actions) == [("deployed", "it finished cleanly within the gate")]


def test_a_rollback_that_cannot_start_fails_the_deploy() -> None:
    events_ = [lc.MainExited(1), lc.StopFinished(CLEAN, cause=CRASH), lc.BackoffElapsed()]
    life, _ = run(events_, life=TRIAL)
    life, actions = run([lc.Relaunched(error="the code the deploy replaced is gone")], life=life)
    assert life.stage is lc.Stage.ENDED
    ((outcome, why),) = judged(actions)
    assert outcome == "failed"
    assert why.endswith("; the rollback failed: the code the deploy replaced is gone")


def test_the_first_failure_after_a_healthy_stretch_restarts_at_once() -> None:
    """issue 56 §1: a run that ran 30 s with no restart in the window is relaunched
    without backoff; a crash at start, or a second one, waits as before."""
    healthy = lc.Life(started_at=100.0, now=100.0 + 31)
    _, actions = run([lc.MainExited(1), lc.StopFinished(CLEAN, cause=CRASH)], life=healthy)
    assert lc.WaitBackoff(0.0) in actions
    early = lc.Life(started_at=100.0, now=100.0 + 3)
    _, actions = run([lc.MainExited(1), lc.StopFinished(CLEAN, cause=CRASH)], life=early)
    assert lc.WaitBackoff(1.0) in actions  # SPEC's backoff: a crash at start may loop
    again = lc.Life(started_at=100.0, now=200.0,
                    history=(RestartEntry(run=1, at=150.0, cause="x", kind="exit"),))  # fmt: skip
    _, actions = run([lc.MainExited(1), lc.StopFinished(CLEAN, cause=CRASH)], life=again)
    assert lc.WaitBackoff(2.0) in actions  # the second within the window: 1 s * 2


def test_a_stall_is_stopped_with_the_stall_grace_not_the_whole_grace() -> None:
    """issue 56 §2: a hung rank's peers wait in their collective and cannot save; the stop
    that answers a stall gives the job `stall_grace` (default: its grace, at most 10 s)."""
    long = dataclasses.replace(SPEC, stop=StopPolicy(grace_s=300.0))
    _, actions = run([lc.Stalled()], spec=long)
    assert actions[0] == lc.RunStop("stalled", 10.0, None)
    _, actions = run([lc.Stalled()], spec=SPEC)  # a grace under 10 s is kept
    assert actions[0] == lc.RunStop("stalled", 5.0, None)
    asked = dataclasses.replace(long, watch=Watch(stall_grace_s=60.0))
    life, actions = run([lc.Stalled()], spec=asked)
    assert actions[0] == lc.RunStop("stalled", 60.0, None)
    assert life.grace_s == 60.0  # the cause names the grace the stop gave


def test_no_backoff_after_a_run_that_saved_since_the_last_failure() -> None:
    """issue 56 §1: a backoff is for a loop, and a loop saves nothing new. Two faults
    25 s apart (too soon for a healthy stretch): the second relaunch waits 2 s when the
    run saved nothing since the first failure, and not at all when it saved a
    checkpoint past it."""
    first = RestartEntry(run=1, at=100.0, cause="exit code 1", kind="exit", ckpt_step=40.0)
    base = lc.Life(restarts=1, history=(first,), started_at=110.0, now=125.0)
    _, looped = run([lc.MainExited(1), lc.StopFinished(CLEAN, ckpt_step=40.0)], life=base)
    assert lc.WaitBackoff(2.0) in looped
    _, saved = run([lc.MainExited(1), lc.StopFinished(CLEAN, ckpt_step=80.0)], life=base)
    assert lc.WaitBackoff(0.0) in saved
    # unknown steps (no checkpoint glob, or a step nobody can read): the backoff, as ever
    _, unknown = run([lc.MainExited(1), lc.StopFinished(CLEAN, ckpt_step=None)], life=base)
    assert lc.WaitBackoff(2.0) in unknown


def test_no_backoff_at_a_first_failure_after_the_run_saved() -> None:
    """A first failure 20 s into a run (too soon for a healthy stretch) goes at once when
    the run saved past the checkpoint it was handed, or saved at all when handed none; a
    run that crashes before any save (an import error) gets the backoff from the first."""
    young = lc.Life(started_at=100.0, now=120.0)

    def wait_after(ckpt: float | None, resumed: float | None) -> list[lc.Action]:
        ev = lc.StopFinished(CLEAN, ckpt_step=ckpt, resumed_step=resumed)
        return run([lc.MainExited(1), ev], life=young)[1]

    assert lc.WaitBackoff(0.0) in wait_after(80.0, 40.0)  # saved past what it was handed
    assert lc.WaitBackoff(0.0) in wait_after(40.0, None)  # handed none, saved one
    assert lc.WaitBackoff(1.0) in wait_after(40.0, 40.0)  # saved nothing new: a loop's shape
    assert lc.WaitBackoff(1.0) in wait_after(None, None)  # nothing known: as ever
