"""`trainctl doctor`: what decides whether jobs survive logout and stop cleanly here."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.ops.doctor import run_doctor

from . import Invocation


def run(inv: Invocation, *, as_json: bool = False) -> int:
    """Print every check; exit 1 when one needs action."""
    checks = run_doctor(inv.home)
    inv.reply(render.doctor_doc(checks)) if as_json else render.show(render.doctor(checks))
    return ExitCode.OK if all(ch.ok for ch in checks) else ExitCode.FAILED
