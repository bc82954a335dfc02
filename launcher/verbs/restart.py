"""`trainctl restart NAME`: a verified stop, then the recorded spec with the code on disk."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import parse_seconds
from trainctl.launcher.ops.start import restart_job

from . import Invocation
from .stop import NO_CHECKPOINT, CheckpointFlags, prepare


def run(
    inv: Invocation,
    name: str,
    *,
    grace: str | None = None,
    ckpt: CheckpointFlags = NO_CHECKPOINT,
    as_json: bool = False,
) -> int:
    """Restart job NAME on the same GPUs; refuse while anything of the old run survives."""
    grace_s = None if grace is None else parse_seconds(grace, "--grace")
    pre = prepare(inv, name, ckpt, quiet=as_json)
    stopped, started = restart_job(inv.home, name, inv.cfg, grace_s=grace_s)
    if as_json:
        render.emit_json(
            {
                "checkpoint": pre.to_doc() or {},
                "stop": {"via": stopped.via, "ok": stopped.ok, "report": stopped.report.to_doc()},
                "start": {"run": started.run, "main_pid": started.main_pid, "log": started.log},
            }
        )
    else:
        render.stop(stopped)
        render.start(started)
    return ExitCode.OK
