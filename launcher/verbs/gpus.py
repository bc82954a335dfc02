"""`trainctl gpus`: every GPU, its lease, and who is on it."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.gpus import gpu_views
from trainctl.supervisor.gpu import NoDriverError

from . import Invocation


def run(inv: Invocation, *, as_json: bool = False) -> int:
    """Print the GPUs; without an NVIDIA driver, one line and exit 0."""
    try:
        views = gpu_views(inv.home)
    except NoDriverError as e:
        render.emit_json({"gpus": [], "error": str(e)}) if as_json else render.line(str(e))
        return ExitCode.OK
    render.emit_json([v.to_doc() for v in views]) if as_json else render.gpus(views)
    return ExitCode.OK
