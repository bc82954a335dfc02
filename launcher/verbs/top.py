"""`trainctl top`: every job and GPU, live (or one frame with --once)."""

from __future__ import annotations

import sys

from trainctl.launcher import render
from trainctl.launcher import top as screen
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import parse_duration
from trainctl.supervisor.errors import ConfigError

from . import Invocation

MIN_INTERVAL_S = 0.1


def run(inv: Invocation, *, interval: str = "1s", once: bool = False, as_json: bool = False) -> int:
    """Show the live screen until q; refuse without a terminal (use --once or --json)."""
    every = parse_duration(interval, "--interval")
    if every < MIN_INTERVAL_S:
        raise ConfigError(f"--interval must be at least {MIN_INTERVAL_S:g}s")
    if as_json:
        render.emit_json(screen.frame_doc(inv.home))
    elif once:
        screen.print_once(inv.home)
    elif not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise ConfigError("top needs a terminal; use `top --once` or `top --json`")
    else:
        screen.run(inv.home, every)
    return ExitCode.OK
