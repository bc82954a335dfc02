"""`trainctl report NAME`: goodput, lost time by bucket, and each interruption."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.ops.goodput import report

from . import Invocation


def run(inv: Invocation, name: str, *, as_json: bool = False) -> int:
    """Print how much of job NAME's time was productive, and where the rest went."""
    g = report(inv.home, name)
    if as_json:
        inv.reply(g.to_doc())
    else:
        render.show(render.goodput(g))
    return ExitCode.OK
