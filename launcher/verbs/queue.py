"""`trainctl queue [list|resume]`: the home's queue in order; give it waiters again."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.ops import queue
from trainctl.launcher.ops.queue import dispatch
from trainctl.launcher.ops.status import queued_status

from . import Invocation


def run(inv: Invocation, action: str = "list", *, as_json: bool = False) -> int:
    """List the queue (the same rows as `list`), or resume it after a reboot."""
    if action == "resume":
        started = dispatch.ensure_waiters(inv.home)
        if as_json:
            inv.reply({"resumed": started})
        elif started:
            render.line(f"resumed {len(started)} queued job(s): {', '.join(started)}")
        else:
            render.line("every queued job has its waiter; nothing to resume")
        return ExitCode.OK
    rows = [queued_status(queue.queued_of(inv.home, e)) for e in queue.entries(inv.home)]
    if as_json:
        inv.reply([r.to_doc() for r in rows])
    elif rows:
        render.show(render.job_table(list(rows), str(inv.home)))
    else:
        render.line(f"nothing queued in {inv.home}")
    return ExitCode.OK
