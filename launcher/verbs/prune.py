"""`trainctl prune --older-than D`: remove the jobs that ended more than D ago."""

from __future__ import annotations

from trainctl.launcher import render, snapshot
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import parse_duration
from trainctl.launcher.ops.jobs import ended_jobs
from trainctl.launcher.ops.remove import remove_job
from trainctl.supervisor.errors import TrainctlError
from trainctl.supervisor.model import state

from . import Invocation


def run(inv: Invocation, *, older_than: str, dry_run: bool = False, as_json: bool = False) -> int:
    """Remove (or with --dry-run, list) every job that ended over ``older_than`` ago.

    A job that cannot be removed (something of it runs again, a lock is held) is named
    and kept; the exit code is 1 then.
    """
    age_s = parse_duration(older_than, "--older-than")
    found = ended_jobs(inv.home, age_s)
    removed: list[tuple[str, float]] = []
    kept: list[tuple[str, str]] = []
    for name, ended_at in found:
        try:
            if not dry_run:
                remove_job(inv.home, name)
        except TrainctlError as e:
            kept.append((name, str(e)))
            continue
        removed.append((name, ended_at))
    trimmed = {} if dry_run else _trim_snapshots(inv)
    if as_json:
        inv.reply(
            {
                "dry_run": dry_run,
                "removed": [{"name": n, "ended_at": at} for n, at in removed],
                "kept": [{"name": n, "error": err} for n, err in kept],
                "snapshots_removed": trimmed,
            }
        )
    else:
        verb = "would remove" if dry_run else "removed"
        for name, at in removed:
            render.line(f"{verb} {name} (ended {render.ago(at)})")
        for name, err in kept:
            render.line(f"kept {name}: {err}")
        for name, runs in trimmed.items():
            render.line(f"removed the code snapshots of {name} run(s) {', '.join(map(str, runs))}")
        if not found:
            render.line(f"no job in {inv.home} ended more than {render.age(age_s)} ago")
    return ExitCode.FAILED if kept else ExitCode.OK


def _trim_snapshots(inv: Invocation) -> dict[str, list[int]]:
    """Every remaining job's code snapshots beyond its snapshot_keep."""
    out = {}
    for name in state.list_jobs(inv.home):
        runs = snapshot.trim(state.job_dir(inv.home, name))
        if runs:
            out[name] = runs
    return out
