"""Finding a job, waiting for it, removing it: the light operations every verb shares."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from trainctl.launcher import backends
from trainctl.supervisor import procfs, state
from trainctl.supervisor.errors import (
    JobConflictError,
    JobNotFoundError,
    StateError,
)
from trainctl.supervisor.poll import poll_until
from trainctl.supervisor.proctree import Member, alive, scan, target_of
from trainctl.supervisor.state import JobState, Phase

WAIT_POLL_S = 0.05  # `wait`: how often the run's phase is read again


def existing_job(home: Path, name: str) -> Path:
    """Return the job's directory, or raise JobNotFoundError."""
    jdir = state.check_not_symlink(state.job_dir(home, name))
    if not (jdir / "state.json").exists() and not (jdir / "spec.json").exists():
        raise JobNotFoundError(f"no job named {name!r} (in {home})")
    state.check_owner(jdir)
    return jdir


def current_phase(jdir: Path, st: JobState) -> Phase:
    """The phase now, as the job's backend sees it (LOST: its supervisor is gone)."""
    return backends.of(st).seen(jdir, st).phase


def _refuse_if_anything_runs(jdir: Path, name: str) -> None:
    """Never delete a job directory while its supervisor or any process of it lives.

    Works without a readable state file (rm --force of a corrupt one): the supervisor holds
    supervisor.lock, and every process of every run of this job inherited
    TRAINCTL_PROGRESS=<this directory>/logs/..., which no other job's process has.
    """
    if state.is_locked(jdir, "supervisor.lock"):
        raise JobConflictError(f"job {name} still has a live supervisor; stop it first")
    roots = {str(jdir), os.path.realpath(jdir)}
    prefixes = tuple(f"TRAINCTL_PROGRESS={r}/logs/".encode() for r in roots)
    me = os.getpid()
    pids = [p for p in procfs.list_pids() if p != me and procfs.has_env_prefix(p, prefixes)]
    live = [p for p in pids if (s := procfs.read_stat(p)) is not None and s.state != "Z"]
    if live:
        raise JobConflictError(
            f"{len(live)} process(es) of job {name} are still running (pids "
            f"{', '.join(map(str, sorted(live)[:8]))}); not removing it. Stop them first "
            "(`trainctl stop` needs a readable state file: repair or restore it)"
        )


def live_members(st: JobState) -> dict[int, Member]:
    """Return the members of the recorded run that are still running."""
    return alive(scan(target_of(st)))


def wait_job(home: Path, name: str, timeout_s: float | None) -> JobState:
    """Block until the job's current run has ended; return its final state."""
    jdir = existing_job(home, name)
    last: list[Phase] = []

    def ended() -> JobState | None:
        st = state.read_state(jdir)
        seen = backends.of(st).seen(jdir, st)
        if seen.phase in state.TERMINAL and not state.is_locked(jdir, "lock"):
            # the backend's verdict (Slurm's exit code), a view, not a recorded move
            return dataclasses.replace(st, phase=seen.phase, exit_code=seen.exit_code)
        if seen.phase == Phase.LOST:
            raise StateError(f"job {name}: the supervisor is gone, so the exit code is unknown")
        last[:] = [seen.phase]
        return None

    final = poll_until(ended, timeout_s, WAIT_POLL_S)
    if final is None:
        raise TimeoutError(f"job {name} still {last[0]} after {timeout_s:g} s")
    return final


def remove_job(home: Path, name: str, *, force: bool = False) -> Path:
    """Delete a finished job's directory (logs included)."""
    jdir = state.check_not_symlink(state.job_dir(home, name))
    if not jdir.exists():
        raise JobNotFoundError(f"no job named {name!r} (in {home})")
    with state.job_lock(jdir, 10.0):
        try:
            st = state.read_state(jdir)
        except (StateError, JobNotFoundError):
            if not force:
                raise
            st = None
        if st is not None:
            seen = backends.of(st).seen(jdir, st)
            # ended: a scheduler that purged the job counts too; only leftovers matter then
            if not seen.ended or live_members(st):
                raise JobConflictError(f"job {name} is {seen.phase}: stop it before removing it")
        _refuse_if_anything_runs(jdir, name)
        shutil.rmtree(jdir)
    return jdir
