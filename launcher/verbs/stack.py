"""`trainctl stack NAME`: where every Python process of the job is, right now."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.ops.stack import job_stacks

from . import Invocation


def run(inv: Invocation, name: str, *, native: bool = False, as_json: bool = False) -> int:
    """Print the job's stacks grouped (or their JSON); nothing is signalled."""
    report = job_stacks(inv.home, name, native=native)
    inv.reply(report.to_doc()) if as_json else render.show(render.stacks(report))
    return ExitCode.OK
