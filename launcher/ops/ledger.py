"""A job's runs, folded once from its typed events (issue 55 §3): the one read of a job's
lineage that `history` and `report` (goodput) share, so a run's start, end, cause and
deploys mean the same in both (each used to fold the events by rules of its own).

Per run: when it started (``started``), what it was handed (``resumed_from``, ``from
scratch``, a rollback), its code (``code``), when main exited, when it ended and how
(``ended``; ``restart_scheduled`` for a relaunch, ``failed (rolled back)`` when the
relaunch went back to a deploy's previous code), its cause, and the deploys that touched
it. For the job: the time its queue held it, and the stretches marked stalled.
"""

from __future__ import annotations

import time
from pathlib import Path

from trainctl.supervisor.model import events
from trainctl.supervisor.model.events import read_typed
from trainctl.supervisor.model.sections import CodeRecord
from trainctl.supervisor.records import field, record


@record()
class RunEntry:
    """One run, as the events tell it."""

    run: int
    started_at: float | None = None
    main_exited_at: float | None = None  # main's exit (goodput's end of the run)
    # trainctl's first move on the run: the stall watchdog's mark, or a stop's start
    acted_at: float | None = None
    # when the run went quiet, if the stall watchdog's mark was that first move (its
    # last write: the mark's time less the quiet it saw)
    quiet_since: float | None = None
    backoff_s: float | None = None  # the restart policy's wait before its relaunch
    ended_at: float | None = None  # its end as recorded (ended, or the relaunch's)
    phase: str | None = None  # how it ended: stopped | exited | failed | failed (restarted)...
    cause: str | None = None
    cause_kind: str | None = None
    code: CodeRecord | None = None
    code_said: bool = False  # its supervisor wrote a code line (``?`` when it had none)
    resumed_from: str | None = None
    from_scratch: bool = False
    rolled_back: str | None = None  # it went back to a deploy's previous code: why
    # the deploys that touched it, in order, each with its part: "out" (it replaced this
    # run), "in" (it started it), "back" (this run is its rollback)
    deploys: list[tuple[str, events.Deploy]] = field(default_factory=list)

    @property
    def by_deploy(self) -> bool:
        """A deploy started it."""
        return any(part == "in" for part, _ in self.deploys)

    @property
    def end(self) -> float | None:
        """When the run stopped running: main's exit, else its recorded end."""
        return self.main_exited_at or self.ended_at


@record()
class RunLedger:
    """Every run of a job (by number), the queue's wait and the stalled stretches."""

    runs: dict[int, RunEntry] = field(default_factory=dict)
    queued_s: float = 0.0
    stalls: list[tuple[float, float]] = field(default_factory=list)

    def entry(self, run: int) -> RunEntry:
        """Run ``run``'s entry (made when an event names a run before its start)."""
        return self.runs.setdefault(run, RunEntry(run))


def ledger(jdir: Path) -> RunLedger:
    """The job's runs, from its events.jsonl (unreadable lines skipped)."""
    return fold(read_typed(jdir))


def fold(evs: list[events.Event]) -> RunLedger:
    """The ledger of ``evs``, in their order."""
    led = RunLedger(
        queued_s=sum(ev.waited_s for ev in evs if isinstance(ev, events.Dispatched)),
        stalls=_stalls(evs),
    )
    current: int | None = None
    for ev in evs:
        if isinstance(ev, events.Started):
            current = ev.run
            e = led.entry(ev.run)
            e.started_at, e.resumed_from = ev.ts, ev.resumed_from
            e.from_scratch, e.rolled_back = bool(ev.from_scratch), ev.rolled_back
        elif isinstance(ev, events.Code):
            e = led.entry(ev.run)
            e.code, e.code_said = ev.code, True
        elif isinstance(ev, events.MainExited):
            if current is not None and led.entry(current).main_exited_at is None:
                led.entry(current).main_exited_at = ev.ts
        elif isinstance(ev, events.Stalled | events.Stopping | events.Unstalled):
            if current is not None:
                _acted(led.entry(current), ev)
        elif isinstance(ev, events.Ended | events.RestartScheduled):
            run = current if ev.run is None else ev.run
            if run is not None:
                _ended(led.entry(run), ev)
        elif isinstance(ev, events.Deploy):
            _deployed(led, ev)
    return led


def _acted(e: RunEntry, ev: events.Stalled | events.Stopping | events.Unstalled) -> None:
    """trainctl's first move on run ``e``: a stop's start, or the stall watchdog's mark
    (with when the run went quiet), undone when the run moved again (Unstalled)."""
    if isinstance(ev, events.Unstalled):  # it went on: that mark did not end it
        if e.quiet_since is not None:
            e.acted_at = e.quiet_since = None
    elif e.acted_at is None:
        e.acted_at = ev.ts
        if isinstance(ev, events.Stalled):
            e.quiet_since = ev.ts - ev.idle_s


def _stalls(evs: list[events.Event]) -> list[tuple[float, float]]:
    """The stretches the stall watchdog marked (one still open ends now)."""
    out, since = [], None
    for ev in evs:
        if isinstance(ev, events.Stalled):
            since = ev.ts
        elif isinstance(ev, events.Unstalled) and since is not None:
            out.append((since, ev.ts))
            since = None
    if since is not None:
        out.append((since, time.time()))
    return out


def _ended(e: RunEntry, ev: events.Ended | events.RestartScheduled) -> None:
    e.ended_at = ev.ts
    e.cause = ev.cause.summary if ev.cause is not None else None
    e.cause_kind = ev.cause.kind if ev.cause is not None else None
    if isinstance(ev, events.Ended):
        e.phase = ev.phase
    else:
        e.phase = "failed (rolled back)" if ev.rollback else "failed (restarted)"
        e.backoff_s = ev.backoff_s


def _deployed(led: RunLedger, ev: events.Deploy) -> None:
    for run, part in ((ev.from_run, "out"), (ev.to_run, "in"), (ev.rollback_run, "back")):
        if run is not None:
            led.entry(run).deploys.append((part, ev))
