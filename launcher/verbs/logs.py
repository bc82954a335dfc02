"""`trainctl logs NAME`: the end of a run's log, and following it across restarts."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from trainctl.launcher import output, render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.ops.logs import follow, log_lines, other_nodes
from trainctl.supervisor import state
from trainctl.supervisor.errors import ConfigError, TrainctlError

from . import Invocation


def tail_of(lines: str | None, following: bool, configured: int) -> int | None:
    """`-n N|all` -> how many last lines to print (None: all)."""
    if lines is None:
        return 10 if following else (configured or None)  # config: 0 = the whole log
    if lines.strip().lower() == "all":
        return None
    try:
        n = int(lines)
    except ValueError:
        raise ConfigError(f"-n expects a number of lines or `all`, got {lines!r}") from None
    if n < 0:
        raise ConfigError("-n must be >= 0")
    return n


def follow_to_stdout(inv: Invocation, name: str, path: Path, *, detach_note: bool) -> None:
    """Stream new log text until the job ends, the reader leaves, or Ctrl-C."""
    try:
        for chunk in follow(inv.home, name, path, inv.cfg.follow_poll_s):
            render.write(chunk)
            if output.reader_gone():
                return
    except KeyboardInterrupt:
        if detach_note:
            sys.stderr.write(f"\ndetached; {name} keeps running (trainctl stop {name})\n")


def follow_new_run(inv: Invocation, name: str, path: Path) -> None:
    """A run just started: print its log from the first line, then follow it (Ctrl-C detaches)."""
    if path.exists():
        render.write(path.read_text(errors="replace"))
    follow_to_stdout(inv, name, path, detach_note=True)


def run(
    inv: Invocation,
    name: str,
    *,
    follow_: bool = False,
    lines: str | None = None,
    run_no: int | None = None,
    node: str | None = None,
    raw: bool = False,
    as_json: bool = False,
) -> int:
    """Print the log of job NAME (its last lines with -n; following it with -f)."""
    if as_json and follow_:
        raise ConfigError("--json prints the lines once: it does not go with -f")
    tail = tail_of(lines, follow_, inv.cfg.tail_lines)
    path, text = log_lines(inv.home, name, run_no, tail, node=node)
    if not raw:  # a progress bar's frames: its latest one (the file keeps them all)
        text = [_latest(t) for t in text]
    if as_json:
        render.emit_json({"name": name, "log": str(path), "lines": [t.rstrip("\n") for t in text]})
        return ExitCode.OK
    nodes = other_nodes(inv.home, name, run_no) if node is None else None
    if nodes is not None:  # say which node this is: the others' lines are elsewhere
        first, rest = nodes
        hint = " or ".join(f"--node {n}" for n in rest[:3]) + (" ..." if len(rest) > 3 else "")
        sys.stderr.write(
            f"node {first}'s log; the other nodes' logs: trainctl logs {name} {hint}\n"
        )
    if not text and not path.exists():
        _say_why_no_log(inv, name)
    render.write("".join(text))
    if follow_:
        follow_to_stdout(inv, name, path, detach_note=False)
    return ExitCode.OK


def _say_why_no_log(inv: Invocation, name: str) -> None:
    """A run that never started has no log: say why, rather than print nothing."""
    with contextlib.suppress(TrainctlError, OSError):
        st = state.read_state(state.job_dir(inv.home, name))
        if st.main is None and st.supervisor is None:
            why = st.cause.summary if st.cause is not None else "it was never started"
            sys.stderr.write(f"trainctl: job {name} run {st.run} never ran ({why}): no log\n")


def _latest(line: str) -> str:
    """A line redrawn with carriage returns, as its latest non-empty frame."""
    if "\r" not in line:
        return line
    end = "\n" if line.endswith("\n") else ""
    frames = [f for f in line.rstrip("\n").split("\r") if f.strip()]
    return (frames[-1] if frames else "") + end
