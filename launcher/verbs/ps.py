"""`trainctl ps NAME`: the job's live process tree."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.ops.ps import job_cwd, job_ps, job_unit

from . import Invocation


def run(inv: Invocation, name: str, *, as_json: bool = False) -> int:
    """Print the tree (escapees marked), or every row as JSON."""
    rows = job_ps(inv.home, name)
    if as_json:
        inv.reply([r.to_doc() for r in rows])
        return ExitCode.OK
    unit = job_unit(inv.home, name)
    if unit:
        render.line(f"unit {unit}")
    render.show(render.ps(rows, job_cwd(inv.home, name)))
    return ExitCode.OK
