"""`trainctl rm NAME`: delete a finished job's directory."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.ops.remove import remove_job

from . import Invocation


def run(inv: Invocation, name: str, *, force: bool = False) -> int:
    """Remove the job (refused while anything of it runs)."""
    path = remove_job(inv.home, name, force=force)
    render.line(f"removed {name} ({path})")
    return ExitCode.OK
