"""A job's terminal (`start --tty`): the pseudo-terminal its main process runs on, the copy
of its output into the run's log, and the viewers that `trainctl attach` connects to it.

Without ``--tty`` the job writes its log itself and the supervisor is not in the data path.
With it, the supervisor holds the pty's master: it copies every byte the job writes into
``logs/run-N.log`` (so `logs`, causes and the stall watchdog work as before, attached or
not) and to each attached viewer, and writes the one writer's keys into the master, where
the line discipline turns Ctrl-C into the job's own SIGINT, as in tmux. The price, said in
docs/attach.md: a supervisor that dies takes the master with it, so the job's terminal
hangs up (SIGHUP).

The wire, after the ``attach`` request's JSON reply line, is frames both ways: one kind
byte, a 4-byte big-endian length, the payload (:func:`frame`, :class:`FrameReader`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import struct
import termios
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from trainctl.supervisor.errors import StateError
from trainctl.supervisor.linux.files import open_in
from trainctl.supervisor.records import JsonObject, field, record

# frame kinds
OUTPUT = b"o"  # supervisor -> viewer: bytes the job wrote
INPUT = b"i"  # viewer -> supervisor: keys for the job (the writer's only)
WINSIZE = b"w"  # viewer -> supervisor: rows, cols (two big-endian u16)
END = b"e"  # supervisor -> viewer: the run ended (JSON: phase, summary)
DETACH = b"d"  # viewer -> supervisor: leaving; the job keeps running

MAX_FRAME = 1 << 20
REPLAY_BYTES = 64 << 10  # what a new viewer is shown first: the screen it missed
VIEWER_QUEUE = 512  # chunks a slow viewer may lag behind before it is dropped
DEFAULT_SIZE = (24, 80)
_HEADER = struct.Struct(">cI")


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    """One frame on the wire."""
    return _HEADER.pack(kind, len(payload)) + payload


def winsize_payload(rows: int, cols: int) -> bytes:
    """A WINSIZE frame's payload."""
    return struct.pack(">HH", max(1, min(rows, 0xFFFF)), max(1, min(cols, 0xFFFF)))


class FrameReader:
    """Frames out of a byte stream fed in pieces (the client's side; it reads a socket)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """Take ``data``; return the frames it completed, in order."""
        self._buf += data
        out: list[tuple[bytes, bytes]] = []
        while len(self._buf) >= _HEADER.size:
            kind, size = _HEADER.unpack_from(self._buf)
            if size > MAX_FRAME:
                raise ValueError(f"frame of {size} bytes")
            end = _HEADER.size + size
            if len(self._buf) < end:
                break
            out.append((kind, bytes(self._buf[_HEADER.size : end])))
            del self._buf[:end]
        return out


def open_pty(rows: int = DEFAULT_SIZE[0], cols: int = DEFAULT_SIZE[1]) -> tuple[int, int]:
    """A new pseudo-terminal (master, slave), both close-on-exec, of rows x cols."""
    master, slave = os.openpty()
    set_winsize(slave, rows, cols)
    return master, slave


def set_winsize(fd: int, rows: int, cols: int) -> None:
    """Set a terminal's size (the job's foreground group gets SIGWINCH)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def log_appender(path: Path) -> tuple[Callable[[bytes], None], str | None]:
    """A --tty run's log: what the job writes to its terminal is appended there (the
    rotation truncates it in place, as for a job that writes its log itself). Never
    raises: a log that cannot be opened or is full costs its lines, never the job's
    output (the error, if it could not be opened, is returned to be recorded)."""
    try:
        fd = open_in(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    except (OSError, StateError) as e:
        return (lambda _data: None), str(e)

    def write(data: bytes) -> None:
        with contextlib.suppress(OSError):
            while data:
                data = data[os.write(fd, data) :]

    return write, None


def take_controlling_tty() -> None:
    """In the child, after setsid: make stdin (the pty's slave) the session's terminal,
    so that the line discipline's ^C, ^Z and ^\\ reach the job's foreground group."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@record(eq=False)
class Viewer:
    """One attached client."""

    pid: int  # the client's, from SO_PEERCRED
    read_only: bool
    tx: Any  # MemoryObjectSendStream[bytes | dict]: output chunks, then the end
    rx: Any


@record(eq=False)
class Terminal:
    """The master side of a job's pty: the log copy, the replay buffer and the viewers."""

    master: int
    log_write: Callable[[bytes], None]  # appends to the run's log (never raises)
    replay: bytearray = field(default_factory=bytearray)
    viewers: list[Viewer] = field(default_factory=list)
    writer: Viewer | None = None
    eof: bool = False
    ended: JsonObject | None = None  # the run's end, once known (sent to viewers)

    @classmethod
    def over(cls, master: int, log_write: Callable[[bytes], None]) -> Terminal:
        """The terminal of pty master ``master``, made non-blocking for the pump."""
        os.set_blocking(master, False)
        return cls(master, log_write)

    async def pump(self) -> None:
        """Copy what the job writes until the last holder of the slave closes it."""
        while not self.eof:
            await anyio.wait_readable(self.master)
            self.read_available()

    def read_available(self) -> None:
        """Copy everything readable now (the event loop's thread only: one reader, so the
        log keeps the job's order)."""
        while not self.eof:
            try:
                data = os.read(self.master, 65536)
            except BlockingIOError:
                return
            except OSError:  # EIO: every slave is closed (the job is gone); any other
                data = b""  # error ends the copy too, never the supervisor
            if not data:
                self.eof = True
                return
            self._take(data)

    def _take(self, data: bytes) -> None:
        self.log_write(data)
        self.replay += data
        if len(self.replay) > REPLAY_BYTES:
            del self.replay[: len(self.replay) - REPLAY_BYTES]
        for v in list(self.viewers):
            try:
                v.tx.send_nowait(data)
            except anyio.WouldBlock:  # a viewer this far behind is dropped, not waited for
                self._drop(v, {"lagging": True})

    def _drop(self, v: Viewer, last: JsonObject) -> None:
        with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError):
            v.tx.send_nowait(last)
        v.tx.close()
        self._forget(v)

    def _forget(self, v: Viewer) -> None:
        if v in self.viewers:
            self.viewers.remove(v)
        if self.writer is v:
            self.writer = None

    def finish(self, end: JsonObject) -> None:
        """The run is over: tell every viewer how it ended, then let them go."""
        self.ended = end
        for v in list(self.viewers):
            self._drop(v, end)

    def refusal(self, read_only: bool) -> str | None:
        """Why an attach is refused now (None: it is not)."""
        if self.ended is not None:
            return "the run has ended"
        if not read_only and self.writer is not None:
            return (
                f"a writer is attached already (pid {self.writer.pid}); "
                "attach with --read-only to watch"
            )
        return None

    def add(self, pid: int, read_only: bool) -> Viewer:
        """Register a viewer; its first chunk is the output it missed."""
        tx, rx = anyio.create_memory_object_stream[Any](VIEWER_QUEUE)
        v = Viewer(pid=pid, read_only=read_only, tx=tx, rx=rx)
        if self.replay:
            tx.send_nowait(bytes(self.replay))
        self.viewers.append(v)
        if not read_only:
            self.writer = v
        return v

    async def serve(
        self, v: Viewer, stream: anyio.abc.ByteStream, reader: BufferedByteReceiveStream
    ) -> None:
        """Carry one viewer's frames both ways until it leaves or the run ends."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._keys, v, reader, tg.cancel_scope)
                try:
                    await self._screen(v, stream)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    # the viewer closed its end (it typed, detached and left): the keys it
                    # sent before are still to be read, so the key reader ends the serve
                    # at its end of stream, not this failed send (it lost them under load)
                    return
                tg.cancel_scope.cancel()
        finally:
            self._forget(v)
            v.tx.close()

    async def _screen(self, v: Viewer, stream: anyio.abc.ByteStream) -> None:
        async for item in v.rx:
            if isinstance(item, dict):
                await stream.send(frame(END, json.dumps(item).encode()))
                return
            await stream.send(frame(OUTPUT, item))

    async def _keys(
        self, v: Viewer, reader: BufferedByteReceiveStream, scope: anyio.CancelScope
    ) -> None:
        with contextlib.suppress(
            anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, ValueError
        ):
            while True:
                kind, size = _HEADER.unpack(await reader.receive_exactly(_HEADER.size))
                if size > MAX_FRAME:
                    raise ValueError("frame too large")
                payload = await reader.receive_exactly(size) if size else b""
                if kind == DETACH:
                    break
                if v.read_only or v is not self.writer:
                    continue
                if kind == INPUT:
                    await self._type(payload)
                elif kind == WINSIZE and len(payload) == 4:
                    rows, cols = struct.unpack(">HH", payload)
                    with contextlib.suppress(OSError):
                        set_winsize(self.master, rows, cols)
        scope.cancel()  # the viewer left: serve() stops its screen and forgets it

    async def _type(self, data: bytes) -> None:
        """Write keys into the master, waiting while the job's input queue is full."""
        while data:
            try:
                n = os.write(self.master, data)
            except BlockingIOError:
                await anyio.wait_writable(self.master)
                continue
            except OSError:
                return  # the job's side is gone: nobody to type to
            data = data[n:]
