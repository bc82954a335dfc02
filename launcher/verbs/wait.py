"""`trainctl wait NAME`: block until the run ends; exit with its exit code."""

from __future__ import annotations

import sys

from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import parse_seconds
from trainctl.launcher.ops.jobs import wait_job

from . import Invocation


def run(inv: Invocation, name: str, *, timeout: str | None = None) -> int:
    """The job's exit code (128+N for signal N); 124 when --timeout expires first."""
    timeout_s = None if timeout is None else parse_seconds(timeout, "--timeout")
    try:
        st = wait_job(inv.home, name, timeout_s)
    except TimeoutError as e:
        sys.stderr.write(f"trainctl: {e}\n")
        return ExitCode.TIMEOUT
    return st.exit_code if st.exit_code is not None else ExitCode.OK
