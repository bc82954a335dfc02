"""`trainctl history NAME`: the lineage of a job, a run a row, from its events.

Each run's start (``started``), its code (``code``, written by its supervisor once main
has exec'd), its end (``ended``; a relaunch's ``restart_scheduled``) and the deploys that
touched it (``deploy``) are lines of ``events.jsonl``; the state file says how the
newest run stands now. The steps come from each run's progress file (or log).
"""

from __future__ import annotations

from pathlib import Path

from trainctl.launcher.progress import read_progress
from trainctl.launcher.results.ops import HistoryRow
from trainctl.supervisor.errors import TrainctlError
from trainctl.supervisor.model import events, state
from trainctl.supervisor.model.events import read_typed
from trainctl.supervisor.records import replace

from .jobs import current_phase, existing_job


def job_history(home: Path, name: str) -> list[HistoryRow]:
    """Every recorded run of job ``name``, oldest first."""
    jdir = existing_job(home, name)
    rows: dict[int, HistoryRow] = {}
    current: int | None = None

    def row(run: int) -> HistoryRow:
        return rows.setdefault(run, HistoryRow(run=run))

    for ev in read_typed(jdir):
        if isinstance(ev, events.Started):
            current = ev.run
            marks = row(ev.run).marks
            if ev.from_scratch:
                marks = [*marks, "from scratch (--from-scratch)"]
            elif ev.resumed_from:
                marks = [*marks, f"resumed from {ev.resumed_from}"]
            if ev.rolled_back:
                marks = [*marks, f"rolled back: {ev.rolled_back}"]
            rows[ev.run] = replace(row(ev.run), started_at=ev.ts, marks=marks)
        elif isinstance(ev, events.Code):
            code = ev.code
            rows[ev.run] = replace(
                row(ev.run), code=code.line() if code else "?",
                commit=code.git_head if code else None, dirty=code.dirty if code else None,
                snapshot=code.snapshot if code else None,
            )  # fmt: skip
        elif isinstance(ev, events.Ended | events.RestartScheduled):
            r = ev.run if ev.run is not None else current
            if r is None:
                continue
            summary = ev.cause.summary if ev.cause is not None else None
            phase = ev.phase if isinstance(ev, events.Ended) else "failed (restarted)"
            if isinstance(ev, events.RestartScheduled) and ev.rollback:
                phase = "failed (rolled back)"
            rows[r] = replace(row(r), ended_at=ev.ts, phase=phase, cause=summary)
        elif isinstance(ev, events.Deploy):
            _mark_deploy(rows, ev)
    return _finish(jdir, rows)


def _mark_deploy(rows: dict[int, HistoryRow], ev: events.Deploy) -> None:
    """A deploy marks the run it left, the run it started and the run it rolled back to."""
    old, new = _short(ev.from_commit), _short(ev.to_commit)
    for left, r, mark in (
        (True, ev.from_run, f"deploy out: {old} -> {new}, {ev.outcome}"),
        (False, ev.to_run, f"deploy in: {ev.outcome}"),
        (False, ev.rollback_run, f"rollback from run {ev.to_run}"),
    ):
        if r is not None:
            was = rows.setdefault(r, HistoryRow(run=r))
            ck = ev.checkpoint if left else was.checkpoint
            rows[r] = replace(was, marks=[*was.marks, mark], checkpoint=ck)


def _short(commit: str | None) -> str:
    """A deploy's code, short: ``3adf61e1`` or, dirty, ``3adf61e1+5d41402a`` (the diff's
    hash tells two dirty trees on one commit apart)."""
    if not commit:
        return "?"
    head, plus, diff = commit.partition("+")
    return head[:8] + (f"+{diff[:8]}" if plus else "")


def _finish(jdir: Path, rows: dict[int, HistoryRow]) -> list[HistoryRow]:
    """Durations, steps, and the newest run as its state says it stands."""
    try:
        st = state.read_state(jdir)
        spec = state.read_spec(jdir)
    except TrainctlError:
        return [rows[r] for r in sorted(rows)]
    phase = current_phase(jdir, st)
    if st.run in rows or not rows:
        r = rows.get(st.run, HistoryRow(run=st.run, started_at=st.started_at))
        ended = st.ended_at if phase in state.TERMINAL else None
        cause = st.cause.summary if st.cause is not None and ended else r.cause
        rows[st.run] = replace(
            r,
            started_at=r.started_at or st.started_at,
            ended_at=ended or r.ended_at,
            phase=str(phase) if phase in state.TERMINAL or str(phase) == "lost" else None,
            cause=cause,
            code=r.code or (st.code.line() if st.code else None),
        )
    out = []
    for run in sorted(rows):
        r = rows[run]
        prog = read_progress(jdir, replace(st, run=run), spec)
        end = r.ended_at
        took = (end - r.started_at) if end and r.started_at else None
        out.append(replace(r, duration_s=took, steps=prog.step if prog else None))
    return out
