"""`trainctl history NAME`: the lineage of a job, a run a row, from its events.

Each run's start (``started``), its code (``code``, written by its supervisor once main
has exec'd), its end (``ended``; a relaunch's ``restart_scheduled``) and the deploys that
touched it (``deploy``) are lines of ``events.jsonl``; the state file says how the
newest run stands now. The steps come from each run's progress file (or log).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from trainctl.launcher.progress import read_progress
from trainctl.launcher.results.ops import HistoryRow
from trainctl.supervisor.errors import TrainctlError
from trainctl.supervisor.model import events, state
from trainctl.supervisor.model.events import read_events
from trainctl.supervisor.model.schema import build_document
from trainctl.supervisor.model.sections import CodeRecord
from trainctl.supervisor.records import JsonObject, fields, replace

from .jobs import current_phase, existing_job


def _code_line(ev: JsonObject) -> str:
    """A `code` event in CodeRecord.line()'s words (the diff's hash beside a dirty commit)."""
    with contextlib.suppress(TrainctlError, TypeError, ValueError):
        fields = {k: v for k, v in ev.items() if k in _CODE_FIELDS}
        return build_document(CodeRecord, fields, "code event").line()
    return "?"


_CODE_FIELDS = {f.name for f in fields(CodeRecord)}


def job_history(home: Path, name: str) -> list[HistoryRow]:
    """Every recorded run of job ``name``, oldest first."""
    jdir = existing_job(home, name)
    rows: dict[int, HistoryRow] = {}
    current: int | None = None

    def row(run: int) -> HistoryRow:
        return rows.setdefault(run, HistoryRow(run=run))

    for ev in read_events(jdir):
        kind, run = ev["event"], ev.get("run")
        if kind == "started" and isinstance(run, int):
            current = run
            rows[run] = replace(row(run), started_at=events.num(ev.get("ts")))
        elif kind == "code" and isinstance(run, int):
            rows[run] = replace(
                row(run), code=_code_line(ev), commit=ev.get("git_head"),
                dirty=ev.get("dirty"), snapshot=ev.get("snapshot"),
            )  # fmt: skip
        elif kind in ("ended", "restart_scheduled"):
            r = run if isinstance(run, int) else current
            if r is None:
                continue
            cause = ev.get("cause")
            summary = cause.get("summary") if isinstance(cause, dict) else None
            phase = ev.get("phase") if kind == "ended" else "failed (restarted)"
            rows[r] = replace(row(r), ended_at=events.num(ev.get("ts")), phase=phase, cause=summary)
        elif kind == "deploy":
            _mark_deploy(rows, ev)
    return _finish(jdir, rows)


def _mark_deploy(rows: dict[int, HistoryRow], ev: JsonObject) -> None:
    """A deploy marks the run it left, the run it started and the run it rolled back to."""
    old, new = ev.get("from_commit") or "?", ev.get("to_commit") or "?"
    outcome = ev.get("outcome")
    for key, mark in (
        ("from_run", f"deploy out: {str(old)[:8]} -> {str(new)[:8]}, {outcome}"),
        ("to_run", f"deploy in: {outcome}"),
        ("rollback_run", f"rollback from run {ev.get('to_run')}"),
    ):
        r = ev.get(key)
        if isinstance(r, int):
            was = rows.setdefault(r, HistoryRow(run=r))
            ck = ev.get("checkpoint") if key == "from_run" else was.checkpoint
            rows[r] = replace(was, marks=[*was.marks, mark], checkpoint=ck)


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
