"""`trainctl status [NAME]`: one job's status, or the table of every job."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.ops.status import job_status, status_exit_code

from . import Invocation, load


def run(inv: Invocation, name: str | None, *, as_json: bool = False) -> int:
    """Show job NAME (exit 0 running, 3 ended, 4 supervisor lost); every job without NAME."""
    if name is None:
        return int(load("list").run(inv, as_json=as_json))  # the table: list's own module
    s = job_status(inv.home, name)
    if s.newer is not None:  # on stderr: stdout stays the status (or its document) as ever
        render.show(render.Said(err=render.newer_note(s)))
    inv.reply(render.status_doc(s)) if as_json else render.show(render.status(s))
    return status_exit_code(s)
