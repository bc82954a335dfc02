"""The queue's policy (launcher/ops/queue/policy.py) on a temporary home with hand-written
state files: no waiter, no supervisor, no process. What an entry waits for, and when a
dependency can never be met."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trainctl.launcher.ops.queue import After, Entry, HomeView, blockers
from trainctl.supervisor import ids
from trainctl.supervisor.model import state
from trainctl.supervisor.model.reports import Cause
from trainctl.supervisor.model.state import JobState, Phase


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    state.ensure_home(h)
    return h


def ran(home: Path, name: str, phase: Phase, code: int | None = None, run: int = 1) -> None:
    """Record a run of job ``name`` as ``phase`` (a live phase with no supervisor is lost,
    which the queue counts as still going)."""
    jdir = state.job_dir(home, name)
    jdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = time.time()
    ended = phase in state.TERMINAL
    st = JobState(
        name=name,
        run=run,
        phase=phase,
        marker=ids.new_marker(),
        started_at=now - 5,
        ended_at=now if ended else None,
        exit_code=code,
        boot_id=state.current_boot_id(),
    )
    state.write_state(jdir, st)


def entry(name: str, *after: str, singleton: str | None = None, seq: int = 1) -> Entry:
    deps = []
    for a in after:
        job, _, when = a.partition(":")
        deps.append(After(job=job, run=1, when=when or "ok"))
    return Entry(
        name=name,
        token=ids.new_marker(),
        seq=seq,
        queued_at=time.time(),
        spec={},
        after=deps,
        singleton=singleton,
    )


def test_a_dependency_that_ended_as_asked_is_met(home: Path) -> None:
    ran(home, "a", Phase.EXITED, 0)
    got = blockers(HomeView(home), entry("next", "a:ok"), [], set())
    assert (got.waits, got.failed) == ([], None)


def test_a_dependency_that_ended_the_other_way_can_never_be_met(home: Path) -> None:
    ran(home, "bad", Phase.FAILED, 3)
    got = blockers(HomeView(home), entry("doomed", "bad:ok"), [], set())
    assert got.failed == "after bad:ok, but bad run 1 ended failed (exit 3)"
    ran(home, "good", Phase.EXITED, 0)
    got = blockers(HomeView(home), entry("x", "good:failed"), [], set())
    assert got.failed is not None
    assert "good run 1 ended exited" in got.failed
    got = blockers(HomeView(home), entry("y", "bad:any"), [], set())
    assert got.failed is None


def test_a_dependency_that_left_the_queue_without_running_dooms_even_any(home: Path) -> None:
    """Issue 44 §11: z's own dependency failed, so z never ran; `--after z:any` ran anyway
    (a failed phase is 'any'). Nothing ran to be waited for: docs/queue.md says it fails."""
    jdir = state.job_dir(home, "z")
    jdir.mkdir(mode=0o700, parents=True)
    never = JobState(
        name="z", run=1, phase=Phase.FAILED, marker=ids.new_marker(), started_at=time.time(),
        ended_at=time.time(), boot_id=state.current_boot_id(),
        cause=Cause(kind="dependency", summary="after w:ok, but w run 1 was stopped"),
    )  # fmt: skip
    state.write_state(jdir, never)
    for when in ("any", "failed", "ok"):
        got = blockers(HomeView(home), entry("y", f"z:{when}"), [], set())
        assert got.failed == f"after z:{when}, but z run 1 left the queue without running"


def test_a_stopped_dependency_dooms_an_ok_dependent(home: Path) -> None:
    ran(home, "a", Phase.STOPPED, 143)
    got = blockers(HomeView(home), entry("next", "a"), [], set())
    assert got.failed == "after a:ok, but a run 1 was stopped"


def test_a_running_or_queued_dependency_is_waited_for(home: Path) -> None:
    ran(home, "live", Phase.RUNNING)  # no supervisor: lost, and still counted as going
    got = blockers(HomeView(home), entry("next", "live:ok"), [], set())
    assert (got.waits, got.failed) == (["after live:ok"], None)
    got = blockers(HomeView(home), entry("next", "later"), [], {"later"})
    assert (got.waits, got.failed) == (["after later:ok"], None)


def test_a_removed_dependency_can_never_be_met(home: Path) -> None:
    got = blockers(HomeView(home), entry("next", "gone"), [], set())
    assert got.failed == "job gone was removed"


def test_a_singleton_waits_for_its_live_run_and_for_earlier_entries(home: Path) -> None:
    ran(home, "train", Phase.RUNNING)
    got = blockers(HomeView(home), entry("train", singleton="name:train"), [], set())
    assert got.waits == ["singleton: train run 1 is running"]
    first = entry("one", singleton="spec:k", seq=1)
    second = entry("two", singleton="spec:k", seq=2)
    got = blockers(HomeView(home), second, [first], set())
    assert got.waits == ["singleton: queued behind one"]
    assert blockers(HomeView(home), first, [second], set()).waits == []  # later: no bar
