"""The RunLedger (issue 55 §3): a job's runs folded once from its typed events, the one
read that `history` and `report` share. Pure: events in, runs out."""

from __future__ import annotations

from trainctl.launcher.ops.ledger import fold
from trainctl.supervisor.model import events
from trainctl.supervisor.model.reports import Cause

CRASH = Cause(kind="exit", summary="exited with code 1")
STOP = Cause(kind="stopped", summary="stopped by `trainctl stop`")


def test_each_run_its_start_end_cause_and_deploys_in_order() -> None:
    deploy = events.Deploy("rolled-back", from_run=1, to_run=2, rollback_run=3,
                           from_commit="aaaa", to_commit="bbbb", ts=25.0)  # fmt: skip
    led = fold([
        events.Dispatched(job="j", run=1, waited_s=7.0, ts=1.0),
        events.Started(job="j", run=1, main_pid=10, argv=["t"], cwd="/", mode="signals",
                       resumed_from=None, ts=10.0),
        events.Stalled(idle_s=5.0, on_stall="notify", ts=14.0),
        events.Unstalled(ts=16.0),
        events.MainExited(pid=10, exit_code=143, ts=19.5),
        events.Ended(1, "stopped", STOP, ts=20.0),
        events.Started(job="j", run=2, main_pid=11, argv=["t"], cwd="/", mode="signals",
                       resumed_from="ck/10.pt", ts=21.0),
        events.RestartScheduled(0.0, 0, run=2, cause=CRASH, ts=24.0,
                                rollback="deploy d of bbbb failed: run 2 ended"),
        deploy,
        events.Started(job="j", run=3, main_pid=12, argv=["t"], cwd="/", mode="signals",
                       resumed_from="ck/10.pt", rolled_back="deploy d of bbbb failed", ts=26.0),
    ])  # fmt: skip
    assert led.queued_s == 7.0
    assert led.stalls == [(14.0, 16.0)]
    one, two, three = led.runs[1], led.runs[2], led.runs[3]
    assert (one.started_at, one.main_exited_at, one.ended_at, one.end) == (10.0, 19.5, 20.0, 19.5)
    assert (one.phase, one.cause_kind) == ("stopped", "stopped")
    assert [part for part, _ in one.deploys] == ["out"]
    assert (two.phase, two.cause, two.resumed_from) == (
        "failed (rolled back)",
        "exited with code 1",
        "ck/10.pt",
    )
    assert two.by_deploy
    assert not one.by_deploy
    assert two.end == 24.0  # no main_exited line: its recorded end
    assert three.rolled_back == "deploy d of bbbb failed"
    assert [part for part, _ in three.deploys] == ["back"]
    assert three.phase is None  # it runs
    assert three.end is None


def test_a_run_named_before_its_start_is_kept_apart_from_started_ones() -> None:
    led = fold([events.Deploy("failed", from_run=4, ts=1.0)])
    assert led.runs[4].started_at is None  # history shows it; goodput skips it
