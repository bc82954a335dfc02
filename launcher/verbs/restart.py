"""`trainctl restart NAME`: a verified stop, then the recorded spec with the code on disk."""

from __future__ import annotations

import sys
from pathlib import Path

from trainctl.launcher import backends, codecheck, render, snapshot
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import parse_seconds
from trainctl.launcher.ops.changes import spec_changes
from trainctl.launcher.ops.jobs import existing_job
from trainctl.launcher.ops.start import plan_restart, reloaded_spec, restart_job, watch_health
from trainctl.launcher.ops.status import spec_file_touched
from trainctl.launcher.results import StartResult, StopResult
from trainctl.launcher.results.ops import Health
from trainctl.supervisor.errors import TrainctlError
from trainctl.supervisor.model import state
from trainctl.supervisor.records import JsonObject, asdict

from . import Invocation
from .logs import follow_new_run
from .stop import NO_CHECKPOINT, CheckpointFlags, prepare

DEFAULT_HEALTH = "3s"


def run(
    inv: Invocation,
    name: str,
    *,
    grace: str | None = None,
    ckpt: CheckpointFlags = NO_CHECKPOINT,
    as_json: bool = False,
    health: str = DEFAULT_HEALTH,
    follow: bool = False,
    reload: bool = False,
    from_scratch: bool = False,
    dry_run: bool = False,
    no_check: bool = False,
) -> int:
    """Restart job NAME on the same GPUs; refuse while anything of the old run survives.

    Then watch the new run for ``health`` (0: not at all): if it dies within it, exit 1
    with its cause and last lines, instead of reporting a restart that did not take.
    """
    grace_s = None if grace is None else parse_seconds(grace, "--grace")
    window = parse_seconds(health, "--health")
    if not no_check:
        _look_at(inv, name, reload=reload)
    if dry_run:
        return _dry_run(inv, name, from_scratch=from_scratch, as_json=as_json)
    if not reload:
        _note_spec_changes(inv, name)
    pre = prepare(inv, name, ckpt, quiet=as_json)
    stopped, started = restart_job(
        inv.home, name, inv.cfg, grace_s=grace_s, reload=reload, from_scratch=from_scratch
    )
    if not as_json:
        render.show(render.stop(stopped))
        render.show(render.start(started))
    seen = watch_health(inv.home, name, started.run, window) if window > 0 else None
    if as_json:
        inv.reply(_doc(pre.to_doc() or {}, stopped, started, seen))
    elif seen is not None:
        render.show(render.health(name, started.run, seen))
    if seen is not None and not seen.ok:
        return ExitCode.FAILED
    if follow:
        follow_new_run(inv, name, Path(started.log))
    return ExitCode.OK


def _doc(
    checkpoint: JsonObject, stopped: StopResult, started: StartResult, seen: Health | None
) -> JsonObject:
    """`restart --json`: the checkpoint asked for, the stop, the start (what it was handed
    and guarded by), the health window."""
    return {
        "checkpoint": checkpoint,
        "stop": {"via": stopped.via, "ok": stopped.ok, "report": stopped.report.to_doc()},
        "start": {
            "run": started.run,
            "main_pid": started.main_pid,
            "log": started.log,
            "guard": None if started.guard is None else asdict(started.guard),
            "from_scratch": started.from_scratch,
        },
        "health": None if seen is None else {**asdict(seen), "ok": seen.ok},
    }


def _dry_run(inv: Invocation, name: str, *, from_scratch: bool, as_json: bool) -> int:
    """`restart --dry-run`: the checkpoint the new run would be handed, the copy kept
    aside, the guard's floor; nothing changes."""
    plan = plan_restart(inv.home, name, from_scratch=from_scratch)
    inv.reply(asdict(plan)) if as_json else render.show(render.restart_plan(plan))
    return ExitCode.OK


def _look_at(inv: Invocation, name: str, *, reload: bool) -> None:
    """The code on disk, looked at by the job's own interpreter before the stop
    (launcher/codecheck.py): code that cannot start is refused, nothing stopped. Local
    jobs only: a Slurm job's code runs on a node whose Python this host may not have."""
    jdir = existing_job(inv.home, name)
    try:
        st, spec = state.read_state(jdir), state.read_spec(jdir)
    except TrainctlError:
        return  # the restart itself says what is wrong with the job, as it always did
    if not backends.of(st).can.deploy:
        return
    if reload:
        spec = reloaded_spec(spec, inv.cfg)
    codecheck.refuse_broken(name, spec, snapshot.source_of(spec), verb="restarts")


def _note_spec_changes(inv: Invocation, name: str) -> None:
    """One line when the spec file changed: this restart keeps the recorded spec."""
    jdir = existing_job(inv.home, name)
    try:
        spec = state.read_spec(jdir)
    except TrainctlError:
        return  # the restart itself says what is wrong
    changed = spec_changes(spec) if spec_file_touched(spec) else []
    if changed:
        sys.stderr.write(
            f"trainctl: note: {spec.spec_file} changed since the start ({', '.join(changed)}); "
            "this restart keeps the recorded spec: `restart --reload` takes the file\n"
        )
