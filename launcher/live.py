"""Live feedback while a stop runs: grace left, who is still alive, the newest checkpoint.

A stop can take its whole grace (minutes, for a big checkpoint). On a terminal, one line
is redrawn at most 4 times a second; elsewhere (a log, a pipe) a plain line is printed
when the number of processes left changes, at most once a second. The first Ctrl-C does
not abandon a stop: through the supervisor it carries on without us; run directly, it
runs in this process, so a second Ctrl-C is needed to give it up.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

from trainctl.supervisor.errors import TrainctlError
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model import state
from trainctl.supervisor.tree.proctree import alive, scan, target_of

from . import term
from .ops.jobs import stop_under_way
from .render import clean

T = TypeVar("T")
REDRAW_S = 0.25
INTERRUPTED = 130


def _in_thread(work: Callable[[], T]) -> tuple[threading.Thread, dict[str, object]]:
    """Start ``work`` in a daemon thread; its result or error lands in the box."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["result"] = work()
        except BaseException as e:  # noqa: BLE001  (handed to the main thread as it is)
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def _outcome(box: dict[str, object]) -> object:
    """The thread's result; its error raised here, in the caller's thread."""
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]


def run_with_feedback(jdir: Path, name: str, work: Callable[[], T], *, enabled: bool) -> T | int:
    """Run ``work`` (a stop) in a thread and narrate it; return its result, or 130."""
    direct = not state.supervised(jdir)
    thread, box = _in_thread(work)
    line = _Line(jdir, name, tty=sys.stderr.isatty()) if enabled else None
    interrupted = False
    while thread.is_alive():
        try:
            thread.join(REDRAW_S)
            if line is not None and thread.is_alive():
                line.draw()
        except KeyboardInterrupt:
            if not direct or interrupted:
                _say(line, _continues(name, direct, interrupted))
                return INTERRUPTED
            interrupted = True
            _say(line, _continues(name, direct, interrupted=False))
    if line is not None:
        line.clear()
    return cast(T, _outcome(box))


TICK_PLAIN_S = 15.0  # off a terminal, a waiting line is printed this often
# off a terminal (a script, a log, a pipe), a stop says nothing until it has run this
# long: a quick stop's output stays its report alone (under load, a 0.3 s stop of one
# `sleep` printed "stopping p: 59s of grace left, 0 left" into a script's stderr)
PLAIN_FIRST_S = 2.0


def run_with_ticker(work: Callable[[], T], describe: Callable[[], str], *, enabled: bool) -> T:
    """Run ``work`` (a wait of minutes) in a thread, with a line that says how it goes:
    redrawn on a terminal, printed every TICK_PLAIN_S elsewhere. Ctrl-C ends the wait (the
    work is a wait: nothing is left half done)."""
    thread, box = _in_thread(work)
    tty, shown, printed = sys.stderr.isatty(), False, time.monotonic()
    try:
        while thread.is_alive():
            thread.join(REDRAW_S)
            if not enabled or not thread.is_alive():
                continue
            if tty:
                sys.stderr.write(f"\r\x1b[K{describe()[:160]}")
                shown = True
            elif time.monotonic() - printed >= TICK_PLAIN_S:
                sys.stderr.write(f"trainctl: {describe()}\n")
                printed = time.monotonic()
            sys.stderr.flush()
    finally:
        if shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
    return cast(T, _outcome(box))


def _continues(name: str, direct: bool, interrupted: bool) -> str:
    if not direct:
        return f"the stop continues in the background (`trainctl status {name}`)"
    if not interrupted:
        return "the stop runs in this process (no supervisor): Ctrl-C again abandons it"
    return f"stop abandoned; processes may be left (`trainctl stop {name}` again)"


def _say(line: _Line | None, text: str) -> None:
    if line is not None:
        line.clear()
    sys.stderr.write(f"\ntrainctl: {text}\n")
    sys.stderr.flush()


class _Line:
    """One status line about a running stop."""

    def __init__(self, jdir: Path, name: str, *, tty: bool) -> None:
        self.jdir, self.name, self.tty = jdir, name, tty
        self.last_count: int | None = None
        self.last_plain = time.monotonic() + PLAIN_FIRST_S - 1.0  # the first after PLAIN_FIRST_S
        self.shown = False
        self.since = time.time() - 1.0  # a `stopping` event older than this is another stop's
        self.st: state.JobState | None = None  # read once: the run and whom to count
        self.joined = False  # a stop was under way before ours: its grace is shown

    def draw(self) -> None:
        if self.st is None:
            try:
                self.st = state.read_state(self.jdir)
            except TrainctlError:
                return
            self.joined = self.st.phase == state.Phase.STOPPING
        st = self.st
        grace = self._grace(joined=self.joined)
        if grace is None:
            return  # no stop is under way (yet): say nothing rather than something wrong
        members = sorted(alive(scan(target_of(st))).values(), key=lambda m: m.stat.pid)
        text = f"stopping {self.name}: {grace}, {len(members)} left"
        if 0 < len(members) <= 3:
            text += ": " + ", ".join(f"{m.stat.pid} {_short(m.stat.pid)}" for m in members)
        if self.tty:
            sys.stderr.write(f"\r\x1b[K{text[:160]}")
            self.shown = True
        elif len(members) != self.last_count and time.monotonic() - self.last_plain >= 1:
            sys.stderr.write(f"trainctl: {text}\n")
            self.last_count, self.last_plain = len(members), time.monotonic()
        sys.stderr.flush()

    def _grace(self, *, joined: bool) -> str | None:
        """Grace left, from the newest `stopping` event: ours, or the one we joined.

        None while no stop is under way (e.g. the CLI is still retrying a mute supervisor).
        """
        going = stop_under_way(self.jdir)
        if going is None or (not joined and going.since < self.since):
            return None
        return _left(going.grace_left_s)

    def clear(self) -> None:
        if self.tty and self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _left(seconds: float) -> str:
    return f"{seconds:.0f}s of grace left" if seconds > 0 else "grace over: SIGKILL"


def _short(pid: int) -> str:
    """A member's command as the tables show it (no bin/ dirs), cut to fit the line."""
    return term.middle(clean(term.short_cmd(procfs.read_cmdline(pid), None)), 30)
