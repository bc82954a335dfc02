"""`trainctl attach NAME`: the caller's terminal on a `--tty` job's terminal, as in tmux.

Keys go to the job (Ctrl-C included: the job's own terminal turns it into the job's
SIGINT, never into a trainctl stop); the detach keys (Ctrl-\\ then d by default) leave it
running. The terminal is put in raw mode while attached and always restored.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import sys
import termios
import tty
from collections.abc import Callable, Iterator
from pathlib import Path

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.ops.attach import Attached, attach, last_stop, still_served
from trainctl.supervisor.errors import ConfigError
from trainctl.supervisor.linux.poll import poll_until
from trainctl.supervisor.records import JsonObject, record
from trainctl.supervisor.tree import terminal as wire

from . import Invocation

DEFAULT_DETACH_KEYS = "ctrl-\\,d"


def parse_detach_keys(spec: str) -> bytes:
    """``ctrl-\\,d`` -> b'\\x1cd': comma-separated keys, each ``ctrl-X`` or one character."""
    out = bytearray()
    for raw in spec.split(","):
        key = raw.strip()
        if key.lower().startswith("ctrl-") and len(key) == 6:
            ch = key[5].upper()
            if not ("@" <= ch <= "_"):
                raise ConfigError(f"--detach-keys: no control key {key!r} (use ctrl-a ... ctrl-_)")
            out.append(ord(ch) ^ 0x40)
        elif len(key) == 1 and key.isprintable():
            out.append(ord(key))
        else:
            raise ConfigError(
                f"--detach-keys: {key!r} is not a key (give e.g. 'ctrl-\\,d' or 'ctrl-a,ctrl-d')"
            )
    if not out:
        raise ConfigError("--detach-keys: give at least one key")
    return bytes(out)


@record()
class DetachMatcher:
    """Spots the detach sequence in what is typed; passes everything else through."""

    seq: bytes
    held: bytes = b""

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """Return (the bytes for the job, whether the sequence was completed).

        The prefix typed twice sends it once to the job (tmux's send-prefix, screen's
        ``C-a a``): a job that needs Ctrl-\\ still gets it."""
        out = bytearray()
        for b in data:
            if len(self.seq) > 1 and self.held == self.seq[:1] and bytes([b]) == self.held:
                out += self.held
                self.held = b""
                continue
            held = self.held + bytes([b])
            if self.seq.startswith(held):
                if held == self.seq:
                    self.held = b""
                    return bytes(out), True
                self.held = held
                continue
            # the held prefix was not the sequence after all: it was meant for the job
            out += self.held
            self.held = b""
            if self.seq[:1] == bytes([b]):
                self.held = bytes([b])
            else:
                out.append(b)
        return bytes(out), False


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    """Raw mode on ``fd`` while attached (when it is a terminal); restored however it ends."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _size() -> tuple[int, int] | None:
    if not os.isatty(0):
        return None
    size = shutil.get_terminal_size()
    return size.lines, size.columns


@record()
class Outcome:
    """How an attach ended: detached, the run ended (its doc), or the connection was lost."""

    how: str  # detached | ended | lost | dropped
    end: JsonObject | None = None


class _Session:
    """One attach's loop: the keyboard, the socket and SIGWINCH, on one selector."""

    def __init__(self, att: Attached, keys: bytes, read_only: bool) -> None:
        self.att, self.read_only = att, read_only
        self.matcher = DetachMatcher(keys)
        self.frames = wire.FrameReader()
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def run(self) -> Outcome:
        self.sel.register(self.att.sock, selectors.EVENT_READ, self._on_sock)
        self.sel.register(self.wake_r, selectors.EVENT_READ, self._on_winch)
        # a read-only viewer's keys go nowhere, but its detach keys still detach
        self.sel.register(0, selectors.EVENT_READ, self._on_keys)
        old_wake = signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        old_winch = signal.signal(signal.SIGWINCH, lambda *_: None)
        try:
            # frames that came in the same read as the reply line come first
            outcome = self._frames(self.att.early) if self.att.early else None
            while outcome is None:
                for key, _ in self.sel.select():
                    handler: Callable[[], Outcome | None] = key.data
                    outcome = handler()
                    if outcome is not None:
                        break
            return outcome
        finally:
            signal.signal(signal.SIGWINCH, old_winch)
            signal.set_wakeup_fd(old_wake)
            self.sel.close()
            os.close(self.wake_r)
            os.close(self.wake_w)

    def _send(self, kind: bytes, payload: bytes = b"") -> None:
        with contextlib.suppress(OSError):  # a gone supervisor shows as EOF on the read side
            self.att.sock.sendall(wire.frame(kind, payload))

    def _on_sock(self) -> Outcome | None:
        try:
            data = self.att.sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            return Outcome("lost")
        return self._frames(data)

    def _frames(self, data: bytes) -> Outcome | None:
        for kind, payload in self.frames.feed(data):
            if kind == wire.OUTPUT:
                _write_all(1, payload)
            elif kind == wire.END:
                end = json.loads(payload)
                return Outcome("dropped" if end.get("lagging") else "ended", end)
        return None

    def _on_keys(self) -> Outcome | None:
        try:
            data = os.read(0, 4096)
        except OSError:
            data = b""
        if not data:  # our stdin ended (a pipe): keep watching, type nothing more
            self.sel.unregister(0)
            return None
        out, detached = self.matcher.feed(data)
        if out and not self.read_only:
            self._send(wire.INPUT, out)
        if detached:
            self._send(wire.DETACH)
            return Outcome("detached")
        return None

    def _on_winch(self) -> Outcome | None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.wake_r, 512)
        size = _size()
        if size is not None and not self.read_only:
            self._send(wire.WINSIZE, wire.winsize_payload(*size))
        return None


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _say(text: str) -> None:
    sys.stderr.write(f"\r\n[trainctl] {text}\r\n" if os.isatty(2) else f"[trainctl] {text}\n")
    sys.stderr.flush()


def _describe_keys(keys: bytes) -> str:
    return " ".join(f"Ctrl-{chr(b ^ 0x40)}" if b < 0x20 else chr(b) for b in keys)


def run(
    inv: Invocation, name: str, *, read_only: bool = False, detach_keys: str | None = None
) -> int:
    """Attach until the keys detach, the run ends, or the supervisor goes away."""
    keys = parse_detach_keys(detach_keys or DEFAULT_DETACH_KEYS)
    att = attach(inv.home, name, read_only=read_only, size=_size())
    mode = "read-only, " if read_only else ""
    _say(
        f"attached to {name} (run {att.run}, main pid {att.main_pid}); "
        f"{mode}detach: {_describe_keys(keys)}"
    )
    try:
        with raw_terminal(0):
            outcome = _Session(att, keys, read_only).run()
    except KeyboardInterrupt:  # only without a terminal (raw mode turns ^C into a key)
        outcome = Outcome("detached")
    finally:
        att.sock.close()
    return _report(inv.home, name, outcome)


SERVED_ON_S = 0.3  # how long a supervisor must still live after our connection closed


def _served_on(home: Path, name: str) -> bool:
    """The supervisor closed our connection and lives on: it dropped this viewer. A
    SIGKILLed supervisor closes its sockets a moment before its supervisor.lock (both in
    the kernel's exit, socket first), so one look can see a dying one as alive: it must
    stay alive for SERVED_ON_S."""
    gone = poll_until(lambda: None if still_served(home, name) else True, SERVED_ON_S, 0.02)
    return gone is None


def _report(home: Path, name: str, outcome: Outcome) -> int:
    if outcome.how == "detached":
        _say(f"detached from {name}; it keeps running (trainctl attach {name} to come back)")
        return ExitCode.OK
    if outcome.how == "lost" and _served_on(home, name):
        outcome = Outcome("dropped")  # the supervisor closed on us, and lives: we lagged
    if outcome.how == "dropped":
        _say(
            f"detached from {name}: this terminal fell too far behind its output (a burst it "
            f"could not keep up with); {name} keeps running: trainctl attach {name} to come "
            "back, or trainctl logs -f for the whole output"
        )
        return ExitCode.FAILED
    if outcome.how == "lost":
        _say(f"the connection to {name}'s supervisor was lost; `trainctl status {name}`")
        return ExitCode.STATE_UNKNOWN
    end = outcome.end or {}
    _say(f"{name} ended: {end.get('phase')}: {end.get('summary')}")
    stop = last_stop(home, name)
    if stop is not None:
        _say(f"stop: {render.stop_summary(stop)}")
    return ExitCode.OK
