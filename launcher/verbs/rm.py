"""`trainctl rm NAME...`: delete finished jobs' directories."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.ops.jobs import existing_job
from trainctl.launcher.ops.remove import remove_job
from trainctl.supervisor.errors import TrainctlError

from . import Invocation


def run(inv: Invocation, names: tuple[str, ...] | str, *, force: bool = False) -> int:
    """Remove each job (refused, for that job, while anything of it runs).

    Every name must exist before anything is removed; a job that is refused is named and
    the others are still removed (exit 1 then, as `rm` of several files does).
    """
    chosen = [names] if isinstance(names, str) else list(dict.fromkeys(names))
    if not force:
        for name in chosen:
            existing_job(inv.home, name)
    if len(chosen) == 1:
        path = remove_job(inv.home, chosen[0], force=force)
        render.line(f"removed {chosen[0]} ({path})")
        return ExitCode.OK
    code = ExitCode.OK
    for name in chosen:
        try:
            path = remove_job(inv.home, name, force=force)
        except TrainctlError as e:
            render.line(f"kept {name}: {e}")
            code = ExitCode.FAILED
            continue
        render.line(f"removed {name} ({path})")
    return code
