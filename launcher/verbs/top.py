"""`trainctl top`: every job and GPU, live (or one frame with --once)."""

from __future__ import annotations

import sys
import time

from trainctl.launcher import render
from trainctl.launcher import top as screen
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import parse_duration
from trainctl.supervisor.errors import ConfigError

from . import Invocation

MIN_INTERVAL_S = 0.1


def run(
    inv: Invocation,
    *,
    interval: str = "1s",
    once: bool = False,
    as_json: bool = False,
    all_hosts: bool = False,
) -> int:
    """Show the live screen until q; refuse without a terminal (use --once or --json)."""
    every = parse_duration(interval, "--interval")
    if every < MIN_INTERVAL_S:
        raise ConfigError(f"--interval must be at least {MIN_INTERVAL_S:g}s")
    if all_hosts:
        return _all_hosts(inv, every, once=once or as_json, as_json=as_json)
    if as_json:
        inv.reply(screen.frame_doc(inv.home))
    elif once:
        screen.print_once(inv.home)
    elif not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise ConfigError("top needs a terminal; use `top --once` or `top --json`")
    else:
        screen.run(inv.home, every)
    return ExitCode.OK


FLEET_MIN_INTERVAL_S = 2.0  # every host is asked over ssh each round


def _all_hosts(inv: Invocation, every: float, *, once: bool, as_json: bool) -> int:
    """Every host of hosts.toml: its jobs and GPUs, one frame (--once, --json) or a frame
    every ``every`` (at least FLEET_MIN_INTERVAL_S) until Ctrl-C."""
    from trainctl.launcher.ops.fleet import over_hosts  # noqa: PLC0415  (ssh, threads)

    while True:
        answers = over_hosts(["top"])  # each host's one frame, as `top --json`
        if as_json:
            inv.reply([a.to_doc() for a in answers])
            return ExitCode.OK if all(a.error is None for a in answers) else ExitCode.REMOTE
        if not once:
            sys.stdout.write("\x1b[H\x1b[2J")  # a plain refresh: clear, then the frame
        render.show(render.fleet_top(answers))
        if once:
            return ExitCode.OK if all(a.error is None for a in answers) else ExitCode.REMOTE
        try:
            time.sleep(max(every, FLEET_MIN_INTERVAL_S))
        except KeyboardInterrupt:
            return ExitCode.OK
