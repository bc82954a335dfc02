"""`trainctl logs NAME`: the end of a run's log, and following it across restarts."""

from __future__ import annotations

import contextlib
import datetime
import sys
import time
from pathlib import Path

from trainctl.launcher import output, render
from trainctl.launcher.exitcodes import ExitCode, say_error
from trainctl.launcher.inputs import parse_duration
from trainctl.launcher.ops.logs import (
    START,
    FollowFrom,
    follow,
    log_lines,
    other_nodes,
    run_log,
    timed_lines,
)
from trainctl.supervisor.errors import ConfigError, TrainctlError
from trainctl.supervisor.model import state
from trainctl.supervisor.model.tail import latest_frame

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


def follow_to_stdout(
    inv: Invocation,
    name: str,
    path: Path,
    *,
    detach_note: bool,
    timestamps: bool = False,
    start: FollowFrom | None = None,
) -> None:
    """Stream new log text (from ``start`` on: see ``follow``) until the job
    ends, the reader leaves, or Ctrl-C."""
    stamped = _Stamped() if timestamps else None
    try:
        for chunk in follow(inv.home, name, path, inv.cfg.follow_poll_s, start, say_error):
            render.write(stamped.feed(chunk) if stamped else chunk)
            if output.reader_gone():
                return
    except KeyboardInterrupt:
        if detach_note:
            sys.stderr.write(f"\ndetached; {name} keeps running (trainctl stop {name})\n")


def follow_new_run(inv: Invocation, name: str, path: Path) -> None:
    """A run just started: print its log from the first line, then follow it (Ctrl-C detaches).

    One reader from byte 0: a read of the file, then a follow from its end, lost what a
    short run wrote between the two (seen under load: `restart --follow` without the
    run's only line)."""
    follow_to_stdout(inv, name, path, detach_note=True, start=START)


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
    timestamps: bool = False,
    since: str | None = None,
) -> int:
    """Print the log of job NAME (its last lines with -n; following it with -f)."""
    if as_json and follow_:
        raise ConfigError("--json prints the lines once: it does not go with -f")
    tail = tail_of(lines, follow_ and since is None, inv.cfg.tail_lines)
    since_at = None if since is None else parse_since(since)
    path = run_log(inv.home, name, run_no, node=node)
    mark = FollowFrom.now(path) if follow_ else None  # printed up to here, then followed
    upto = None if mark is None else mark.pos
    times: list[float | None] = []
    if timestamps or since_at is not None:
        timed = timed_lines(path, tail, since_at, upto)
        times, text = [t for t, _ in timed], [line for _, line in timed]
    else:
        _, text = log_lines(inv.home, name, run_no, tail, node=node, upto=upto)
    if not raw:  # a progress bar's frames: its latest one (the file keeps them all)
        text = [_latest(t) for t in text]
    if as_json:
        doc: dict[str, object] = {"name": name, "log": str(path)}
        doc["lines"] = [t.rstrip("\n") for t in text]
        if timestamps:
            doc["times"] = times
        inv.reply(doc)
        return ExitCode.OK
    if timestamps:
        text = [f"{stamp(at)} {line}" for at, line in zip(times, text, strict=True)]
    if node is None:
        _name_other_nodes(inv, name, run_no)
    if not text and not path.exists():
        _say_why_no_log(inv, name, path)
    render.write("".join(text))
    if follow_:
        follow_to_stdout(inv, name, path, detach_note=False, timestamps=timestamps, start=mark)
    return ExitCode.OK


def _name_other_nodes(inv: Invocation, name: str, run_no: int | None) -> None:
    """A multi-node run's log is its first node's: say so, and how to read the others."""
    nodes = other_nodes(inv.home, name, run_no)
    if nodes is not None:
        first, rest = nodes
        hint = " or ".join(f"--node {n}" for n in rest[:3]) + (" ..." if len(rest) > 3 else "")
        sys.stderr.write(
            f"node {first}'s log; the other nodes' logs: trainctl logs {name} {hint}\n"
        )


def stamp(at: float | None) -> str:
    """A line's time as `logs --timestamps` prints it: UTC, to the millisecond (docker's
    RFC 3339 form); a line written since the supervisor's last look has none yet."""
    if at is None:
        return "-".ljust(24)
    t = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def parse_since(value: str) -> float:
    """`--since 10m` (ago) or `--since 2026-12-02T14:00` (local time unless it says): the
    unix time it means."""
    with contextlib.suppress(ValueError):
        return datetime.datetime.fromisoformat(value.strip()).timestamp()
    try:
        return time.time() - parse_duration(value, "--since")
    except ConfigError:
        raise ConfigError(
            f"--since: {value!r} is neither a duration (10m, 2h) nor a time (2026-12-02T14:00)"
        ) from None


class _Stamped:
    """`logs -f --timestamps`: each new line gets the time it was read (within -f's poll)."""

    def __init__(self) -> None:
        self.partial = ""

    def feed(self, chunk: str) -> str:
        text = self.partial + chunk
        *done, self.partial = text.split("\n")
        now = stamp(time.time())
        return "".join(f"{now} {line}\n" for line in done)


def _say_why_no_log(inv: Invocation, name: str, path: Path) -> None:
    """No log file: a run that never started has none; one that ran had it removed.
    Say which, rather than print nothing."""
    with contextlib.suppress(TrainctlError, OSError):
        st = state.read_state(state.job_dir(inv.home, name))
        if st.main is None and st.supervisor is None:
            why = st.cause.summary if st.cause is not None else "it was never started"
            sys.stderr.write(f"trainctl: job {name} run {st.run} never ran ({why}): no log\n")
        else:  # made at the spawn here (a scheduler's node: once the job runs there)
            sys.stderr.write(f"trainctl: {path} is not there: not written yet, or removed\n")


def _latest(line: str) -> str:
    """A line redrawn with carriage returns, as its latest non-empty frame."""
    if "\r" not in line:
        return line
    end = "\n" if line.endswith("\n") else ""
    return latest_frame(line.rstrip("\n")) + end
