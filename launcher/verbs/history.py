"""`trainctl history NAME`: one row per run: when, how long, its code, how it ended."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.ops.history import job_history

from . import Invocation


def run(inv: Invocation, name: str, *, as_json: bool = False) -> int:
    """Print the lineage of job NAME (oldest run first)."""
    rows = job_history(inv.home, name)
    if as_json:
        inv.reply([r.to_doc() for r in rows])
    else:
        render.show(render.history(name, rows))
    return ExitCode.OK
