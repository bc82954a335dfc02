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
from trainctl.supervisor.model import state
from trainctl.supervisor.records import replace

from .jobs import current_phase, existing_job
from .ledger import RunEntry, ledger


def job_history(home: Path, name: str) -> list[HistoryRow]:
    """Every recorded run of job ``name``, oldest first (from its RunLedger)."""
    jdir = existing_job(home, name)
    rows = {run: _row(e) for run, e in ledger(jdir).runs.items()}
    return _finish(jdir, rows)


def _row(e: RunEntry) -> HistoryRow:
    """A run's row: its start's marks, then the deploys that touched it, in order."""
    marks = []
    if e.from_scratch:
        marks.append("from scratch (--from-scratch)")
    elif e.resumed_from:
        marks.append(f"resumed from {e.resumed_from}")
    if e.rolled_back:
        marks.append(f"rolled back: {e.rolled_back}")
    checkpoint = None
    for part, ev in e.deploys:
        old, new = _short(ev.from_commit), _short(ev.to_commit)
        if part == "out":
            marks.append(f"deploy out: {old} -> {new}, {ev.outcome}")
            checkpoint = ev.checkpoint
        elif part == "in":
            marks.append(f"deploy in: {ev.outcome}")
        else:
            marks.append(f"rollback from run {ev.to_run}")
    code = e.code
    return HistoryRow(
        run=e.run, started_at=e.started_at, ended_at=e.ended_at, phase=e.phase,
        cause=e.cause, checkpoint=checkpoint, marks=marks,
        code=code.line() if code else ("?" if e.code_said else None),
        commit=code.git_head if code else None, dirty=code.dirty if code else None,
        snapshot=code.snapshot if code else None,
    )  # fmt: skip


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
        ended = st.ended_at if phase.ended else None
        cause = st.cause.summary if st.cause is not None and ended else r.cause
        rows[st.run] = replace(
            r,
            started_at=r.started_at or st.started_at,
            ended_at=ended or r.ended_at,
            phase=str(phase) if phase.ended or str(phase) == "lost" else None,
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
