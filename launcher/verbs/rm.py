"""`trainctl rm NAME...`: delete finished jobs' directories."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.ops import queue
from trainctl.launcher.ops.remove import remove_job
from trainctl.supervisor.errors import TrainctlError
from trainctl.supervisor.model import state

from . import Invocation


def run(inv: Invocation, names: tuple[str, ...] | str, *, force: bool = False) -> int:
    """Remove each job (refused, for that job, while anything of it runs).

    Every name must exist before anything is removed; a job that is refused is named and
    the others are still removed (exit 1 then, as `rm` of several files does).
    """
    chosen = [names] if isinstance(names, str) else list(dict.fromkeys(names))
    if not force:
        for name in chosen:
            queue.known(inv.home, name)
    if len(chosen) == 1:
        render.line(_remove(inv, chosen[0], force=force))
        return ExitCode.OK
    code = ExitCode.OK
    for name in chosen:
        try:
            said = _remove(inv, name, force=force)
        except TrainctlError as e:
            render.line(f"kept {name}: {e}")
            code = ExitCode.FAILED
            continue
        render.line(said)
    return code


def _remove(inv: Invocation, name: str, *, force: bool) -> str:
    """Dequeue the job if it is queued, then remove its directory if it has one."""
    try:
        live = queue.has_live_run(inv.home, name)
    except TrainctlError:
        live = False  # an untrusted state: remove_job refuses it, or --force removes it
    if live:
        return str(remove_job(inv.home, name, force=force))  # refused: it runs
    entry = queue.dequeue(inv.home, name)
    if entry is not None and not state.job_dir(inv.home, name).exists():
        return f"removed {name} from the queue (it never started)"
    path = remove_job(inv.home, name, force=force)
    return f"removed {name} ({path})" + (", and its queued run" if entry else "")
