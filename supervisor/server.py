"""The supervisor's control server: the job's control socket, its requests, its rebinding.

Each request becomes an event for the lifecycle owner (a stop, a checkpoint ask); the
answer goes back on the same connection once the owner has one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
from anyio.streams.buffered import BufferedByteReceiveStream

from trainctl.supervisor.model.spec import StopOrder
from trainctl.supervisor.records import JsonObject

from .errors import StateError
from .life import lifecycle as lc
from .linux import procfs
from .model import control
from .model.reports import MembersReply
from .tree import terminal
from .tree.proctree import scan_counted
from .tree.terminal import Terminal

if TYPE_CHECKING:  # the run it serves, as a type: the server sits below the run's core
    from .core import RunCore


class ControlServer:
    """Serves control.sock: one task per connection, each answered by the owner."""

    def __init__(self, core: RunCore) -> None:
        self.core = core
        self.terminal: Terminal | None = None  # `--tty`: main's pty, for `attach` (the owner's)
        self._tg: anyio.abc.TaskGroup | None = None
        try:  # the socket this supervisor serves; a different file there is not ours
            self._sock_ino: int | None = os.stat(core.jdir / control.SOCK_NAME).st_ino
        except OSError:
            self._sock_ino = None

    def rebind(self, why: str) -> None:
        """Bind control.sock again if it is gone (a tmp cleaner, a careless rm)."""
        if self.core.life.stage not in (lc.Stage.RUNNING, lc.Stage.STOPPING, lc.Stage.BACKOFF):
            return  # a successor binds it (or the run is over)
        path = self.core.jdir / control.SOCK_NAME
        try:
            if os.stat(path).st_ino == self._sock_ino:
                return
        except FileNotFoundError:
            pass
        except OSError:
            return
        try:
            sock = control.bind(self.core.jdir)
            self._sock_ino = os.stat(path).st_ino
        except (OSError, StateError) as e:
            self.core.log.warning("control_socket_rebind_failed", error=str(e), why=why)
            return
        self.core.log.warning("control_socket_rebound", why=why)
        if self._tg is not None:
            self._tg.start_soon(self._serve_socket, sock)

    async def serve(self, tg: anyio.abc.TaskGroup) -> None:
        """Answer on the bound socket (and on any socket a rebind makes, in ``tg``)."""
        self._tg = tg
        await self._serve_socket(self.core.listener)

    async def _serve_socket(self, sock: socket.socket) -> None:
        listener = await anyio.abc.SocketListener.from_socket(sock)
        async with listener:
            await listener.serve(self._handle)

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        self.core.handlers += 1
        try:
            await self._handle_one(stream)
        finally:
            self.core.handlers -= 1

    async def _handle_one(self, stream: anyio.abc.SocketStream) -> None:
        with contextlib.suppress(
            anyio.EndOfStream,
            anyio.IncompleteRead,
            anyio.BrokenResourceError,
            anyio.DelimiterNotFound,
            ValueError,
        ):
            async with stream:
                raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)  # noqa: S610
                if control.peer_uid(raw) != os.geteuid():
                    await stream.send(control.encode({"ok": False, "error": "permission denied"}))
                    return
                reader = BufferedByteReceiveStream(stream)
                line = await reader.receive_until(b"\n", control.MAX_LINE)
                req = control.decode(line)
                if req.get("op") == "attach":
                    await self._attach(req, stream, reader, control.peer_pid(raw))
                    return
                reply = await self._dispatch(req)
                await stream.send(control.encode(reply))

    async def _attach(
        self,
        req: JsonObject,
        stream: anyio.abc.SocketStream,
        reader: BufferedByteReceiveStream,
        pid: int,
    ) -> None:
        """`trainctl attach`: the reply line, then the job's terminal as frames (terminal.py)."""
        term = self.terminal
        try:
            ask = control.AttachAsk.from_doc(req)
        except StateError as e:
            bad = control.AttachReply(error=str(e), code="bad-request")
            await stream.send(control.encode(bad.to_doc()))
            return
        why = "no terminal" if term is None else term.refusal(ask.read_only)
        if term is None or why is not None:
            no = control.AttachReply(
                error=why, no_tty=term is None, code="no-tty" if term is None else "refused"
            )
            await stream.send(control.encode(no.to_doc()))
            return
        viewer = term.add(pid, ask.read_only)
        if not ask.read_only and ask.rows is not None and ask.cols is not None:
            with contextlib.suppress(OSError):
                terminal.set_winsize(term.master, ask.rows, ask.cols)
        main = self.core.state.main.pid if self.core.state.main else None
        self.core.log.info("attached", viewer_pid=pid, read_only=ask.read_only)
        hello = control.AttachReply(ok=True, main_pid=main, run=self.core.state.run)
        await stream.send(control.encode(hello.to_doc()))
        await term.serve(viewer, stream, reader)
        self.core.log.info("detached", viewer_pid=pid)

    async def _members(self) -> JsonObject:
        """The run's live members as `status` counts them: from the roster (cgroup mode:
        only the processes that joined since its last look are read), else the scan the
        CLI would run (the tree, the marker), in a worker thread either way."""
        roster = self.core.roster()
        found = None if roster is None else await anyio.to_thread.run_sync(roster.refresh)
        if found is None or (roster is not None and roster.taken):
            # no roster, or a stop holds the members now: the same scan as the CLI's
            found = await anyio.to_thread.run_sync(scan_counted, self.core.target())
        live = [m for m in found.values() if m.alive]
        escaped = sum(1 for m in live if m.escaped)
        return MembersReply(members=len(live), escaped=escaped).to_doc()

    async def _dispatch(self, req: JsonObject) -> JsonObject:
        op = req.get("op")
        if op == "ping":
            return control.PingReply(
                True, os.getpid(), str(self.core.state.phase), control.PROTOCOL
            ).to_doc()
        if op == "members":
            return await self._members()
        if op == "stop":
            try:
                ask = control.StopAsk.from_doc(req)
            except StateError as e:
                return control.StopReply(error=str(e), code="bad-request").to_doc()
            token = next(self.core.tokens)
            done = self.core.replies[token] = anyio.Event()
            order = ask.order if ask.order in tuple(StopOrder) else None
            self.core.send(lc.StopRequested(token, ask.grace_s, order, ask.gpu_timeout_s, ask.verb))
            await done.wait()
            del self.core.replies[token]
            return self.core.answers.pop(token)
        if op == "checkpoint":
            return await self._checkpoint(req)
        return control.unknown_op(op)

    async def _checkpoint(self, req: JsonObject) -> JsonObject:
        """`stop --at checkpoint`, `deploy --at checkpoint`: the checkpoint signal to the
        run's processes that catch it, sent by the one process that holds them (each by
        pid and start time), never while a stop holds the run."""
        name = req.get("signal")
        if not isinstance(name, str) or name not in signal.Signals.__members__:
            return control.CheckpointReply(error=f"unknown signal {name!r}").to_doc()
        if self.core.stage is not lc.Stage.RUNNING:
            why = f"run {self.core.state.run} is {self.core.state.phase}, not running"
            return control.CheckpointReply(error=why, code="not-running").to_doc()
        sig = signal.Signals[name]
        found = await anyio.to_thread.run_sync(scan_counted, self.core.target())
        live = [m for m in found.values() if m.alive]
        catch = [m for m in live if procfs.catches(m.stat.pid, sig)]
        if not catch:
            why = f"no process of the run catches {sig.name} ({len(live)} checked)"
            return control.CheckpointReply(checked=len(live), error=why,
                                           code="none-catches").to_doc()  # fmt: skip
        at = time.time()
        sent = sum(procfs.send_signal(m.stat.pid, m.stat.start_ticks, sig) for m in catch)
        self.core.log.info("checkpoint_asked", signal=sig.name, sent=sent, checked=len(live))
        return control.CheckpointReply(ok=sent > 0, sent=sent, checked=len(live),
                                       asked_at=at).to_doc()  # fmt: skip
