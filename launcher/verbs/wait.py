"""`trainctl wait NAME`: block until the run ends; exit with its exit code."""

from __future__ import annotations

import sys
import time

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import parse_seconds
from trainctl.launcher.ops import queue
from trainctl.launcher.ops.jobs import wait_job
from trainctl.launcher.ops.status import cause_of

from . import Invocation


def run(inv: Invocation, name: str, *, timeout: str | None = None, as_json: bool = False) -> int:
    """The job's exit code (128+N for signal N); 124 when --timeout expires first."""
    timeout_s = None if timeout is None else parse_seconds(timeout, "--timeout")
    t0 = time.monotonic()
    try:
        dispatched = queue.wait_dispatched(inv.home, name, timeout_s)
        if not dispatched:
            say = f"{name} left the queue before it started (dequeued): nothing ran"
            if as_json:
                inv.reply({"name": name, "state": "dequeued", "exit_code": None})
            else:
                render.line(say)
            return ExitCode.NOT_RUNNING
        left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - t0))
        st = wait_job(inv.home, name, left, asked_s=timeout_s)
    except TimeoutError as e:
        sys.stderr.write(f"trainctl: {e}\n")
        return ExitCode.TIMEOUT
    cause = cause_of(st, st.phase)
    if as_json:
        inv.reply(
            {
                "name": st.name,
                "run": st.run,
                "state": str(st.phase),
                "exit_code": st.exit_code,
                "cause": None if cause is None else cause.to_doc(),
            }
        )
    elif cause is not None:
        render.line(f"{st.name} run {st.run} {st.phase}: {render.clean(cause.summary)}")
    if st.exit_code is None and cause is not None and cause.kind == "unknown":
        return ExitCode.STATE_UNKNOWN  # an adopted main: its exit code was never ours to read
    if st.exit_code is None and st.phase == "failed":
        return ExitCode.FAILED  # it never ran: a failed start, or a dependency not met
    return st.exit_code if st.exit_code is not None else ExitCode.OK
