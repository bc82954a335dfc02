"""Finding a job, waiting for it, removing it: the light operations every verb shares."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from trainctl.launcher import backends
from trainctl.launcher.inputs import closest, human_duration
from trainctl.supervisor.errors import JobNotFoundError, StateError, TrainctlError
from trainctl.supervisor.linux.poll import poll_until
from trainctl.supervisor.model import state
from trainctl.supervisor.model.state import JobState, Phase
from trainctl.supervisor.records import record, replace
from trainctl.supervisor.tree.proctree import Member, alive, scan, target_of

WAIT_POLL_S = 0.05  # `wait`: how often the run's phase is read again


def _queue_dir(home: Path) -> Path:
    """ops/queue/entries.py's queue_dir (imported here it would be an import cycle)."""
    return home / "queue"


def _did_you_mean(home: Path, name: str) -> str:
    """`; did you mean toy?` when a job (or a queued one) is one typo away."""
    try:
        queued = [p.name[:-5] for p in _queue_dir(home).glob("*.json")]
        near = closest(name, [*state.list_jobs(home), *queued])
    except (OSError, TrainctlError):
        return ""
    return f"; did you mean {near}?" if near and near != name else ""


def existing_job(home: Path, name: str) -> Path:
    """Return the job's directory, or raise JobNotFoundError."""
    jdir = state.check_not_symlink(state.job_dir(home, name))
    if not state.JobDir(jdir).is_job:
        if (_queue_dir(home) / f"{name}.json").exists():
            raise JobNotFoundError(
                f"job {name!r} is queued and has not run yet: `trainctl status {name}` says "
                "what it waits for"
            )
        raise JobNotFoundError(f"no job named {name!r} (in {home}){_did_you_mean(home, name)}")
    state.check_owner(jdir)
    return jdir


def current_phase(jdir: Path, st: JobState) -> Phase:
    """The phase now, as the job's backend sees it (LOST: its supervisor is gone)."""
    return backends.of(st).seen(jdir, st).phase


@record(frozen=True)
class StopUnderWay:
    """The newest stop of a job, from its events: when it began, grace left now, by whom."""

    since: float
    grace_left_s: float
    reason: str | None = None


def stop_under_way(jdir: Path) -> StopUnderWay | None:
    """The newest `stopping` (or `grace_shortened`) event, read from the end of the
    events: a few KiB, read only while a stop is on. None when there is none."""
    from trainctl.supervisor.model import events  # noqa: PLC0415  (~0.5 ms: only while a stop is on)

    shortened: tuple[float, float] | None = None
    for ev in events.newest_typed(jdir, 65536):
        if isinstance(ev, events.GraceShortened) and shortened is None:
            shortened = (ev.ts, ev.grace_left_s)
        elif isinstance(ev, events.Stopping):
            at, left = shortened or (ev.ts, ev.grace_s)
            return StopUnderWay(ev.ts, left - (time.time() - at), ev.reason)
    return None


def _phases(home: Path) -> Iterator[tuple[str, JobState, Phase]]:
    """(name, state, phase now) of every job of ``home`` whose state can be trusted."""
    for name in state.list_jobs(home):
        jdir = state.job_dir(home, name)
        try:
            st = state.read_state(jdir)
            yield name, st, current_phase(jdir, st)
        except (StateError, JobNotFoundError, FileNotFoundError):
            continue


def live_jobs(home: Path) -> list[str]:
    """The jobs of ``home`` with a run going (or a lost one with processes left): what
    `stop --all` stops. A job whose state cannot be trusted is left out."""
    return [
        name
        for name, st, phase in _phases(home)
        if not phase.ended and (phase != Phase.LOST or live_members(st))
    ]


def ended_jobs(home: Path, older_than_s: float) -> list[tuple[str, float]]:
    """(name, ended_at) of every job whose run ended over ``older_than_s`` ago, with
    nothing of it left running: what `prune` removes. Untrusted ones are left out."""
    now = time.time()
    return [
        (name, st.ended_at)
        for name, st, phase in _phases(home)
        if phase.ended and st.ended_at is not None and now - st.ended_at >= older_than_s
    ]


def live_members(st: JobState) -> dict[int, Member]:
    """Return the members of the recorded run that are still running."""
    return alive(scan(target_of(st)))


def wait_job(
    home: Path, name: str, timeout_s: float | None, *, asked_s: float | None = None
) -> JobState:
    """Block until the job's current run has ended; return its final state. ``asked_s``:
    the timeout the user gave, for the message (``timeout_s`` may be what is left of it)."""
    jdir = existing_job(home, name)
    last: list[Phase] = []

    def ended() -> JobState | None:
        st = state.read_state(jdir)
        seen = backends.of(st).seen(jdir, st)
        if seen.phase.ended and not state.is_locked(jdir, state.JOB_LOCK):
            # the backend's verdict (Slurm's exit code), a view, not a recorded move
            return replace(st, phase=seen.phase, exit_code=seen.exit_code)
        if seen.phase == Phase.LOST:
            if state.read_state(jdir).phase.ended:
                # the supervisor wrote the run's end and exited between our read and our
                # look at it (a loaded CI run): the next poll reads the end
                return None
            raise StateError(f"job {name}: the supervisor is gone, so the exit code is unknown")
        last[:] = [seen.phase]
        return None

    final = poll_until(ended, timeout_s, WAIT_POLL_S)
    if final is None:
        said = human_duration(asked_s if asked_s is not None else timeout_s or 0.0)
        raise TimeoutError(f"job {name} still {last[0]} after {said}")
    return final
