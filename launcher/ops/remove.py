"""`rm`: delete a finished job's directory, never while anything of the job still runs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from trainctl.launcher import backends, snapshot
from trainctl.supervisor.errors import JobConflictError, JobNotFoundError, StateError
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model import state

from .jobs import live_members


def _refuse_if_anything_runs(jdir: Path, name: str) -> None:
    """Never delete a job directory while its supervisor or any process of it lives.

    Works without a readable state file (rm --force of a corrupt one): the supervisor holds
    supervisor.lock, and every process of every run of this job inherited
    TRAINCTL_PROGRESS=<this directory>/logs/..., which no other job's process has.
    """
    if state.is_locked(jdir, state.SUPERVISOR_LOCK):
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
        snapshot.prune(jdir, 0, set())  # git worktrees are unregistered from their repository
        shutil.rmtree(jdir)
    return jdir
