"""The CLI <-> supervisor protocol over ``jobs/<name>/control.sock``: one JSON line each way.

Requests: ``{"op": "ping"}``, ``{"op": "members"}``, ``{"op": "stop", "grace_s": 5.0,
"order": "tree"}`` (``order`` may be absent: the job's own stop order; ``"main_only": true``
means ``main``).
Replies: ``{"ok": true, ...}`` or ``{"ok": false, "error": "...", "code": "..."}``: the
error in words for people, and its code for programs (issue 55 §4): ``unknown-op`` (a
newer client's request; the reply names the ``protocol`` the supervisor speaks),
``bad-request``, ``no-tty``, ``refused`` (attach), ``none-catches``, ``not-running``
(checkpoint). A supervisor of protocol 1 sent errors without codes. The socket is 0600 in a
0700 directory and the server also checks the peer's uid (SO_PEERCRED).

The stop request and its reply are typed (:class:`StopAsk`, :class:`StopReply`); the dicts
exist only as the JSON on the wire, and a reply is checked field by field when read.
"""

from __future__ import annotations

import _socket  # early.py's connections are of the C type; socket's are a subclass
import contextlib
import json
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from trainctl.supervisor.errors import StateError
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.records import JsonObject, asdict, field, record, replace

from . import layout, wire
from .reports import StopReport
from .schema import build_document

SOCK_NAME = layout.SOCK_NAME
MAX_LINE = 1 << 20
# The protocol's version, in every ping reply. 1: before it was said (a ping without
# ``protocol``). Requests only add within a version: an op or a field a supervisor does
# not know gets ``{"ok": false, "code": "unknown-op", "protocol": N}``, never silence.
PROTOCOL = 2


def unknown(reply: JsonObject) -> bool:
    """The supervisor did not know the request: ``code`` unknown-op, or (protocol 1, before
    codes) its ``unknown op '...'`` error."""
    if reply.get("code") == "unknown-op":
        return True
    error = reply.get("error")
    return reply.get("ok") is False and isinstance(error, str) and error.startswith("unknown op")


def unknown_op(op: object) -> JsonObject:
    """The answer to a request this supervisor does not know (a newer CLI's)."""
    return {"ok": False, "code": "unknown-op", "protocol": PROTOCOL,
            "error": f"unknown op {op!r} (this supervisor speaks protocol {PROTOCOL})"}  # fmt: skip


class ControlUnavailableError(Exception):
    """The supervisor did not answer (gone, or died mid-request)."""


class MuteError(ControlUnavailableError):
    """The supervisor took a request, then stopped answering anything: alive, but mute."""


LOOK_EVERY_S = 5.0  # while a stop's reply is awaited: how often the supervisor is asked if it lives


@record(frozen=True)
class StopAsk:
    """A client's `stop`: each field None means the job's own setting."""

    gpu_timeout_s: float | None = None
    order: str | None = None  # a StopOrder value
    grace_s: float | None = None
    verb: str = "stop"  # the verb that asked (stop, restart, rm, deploy): the run's cause names it

    def to_doc(self) -> JsonObject:
        """The request on the wire."""
        doc: JsonObject = {"op": "stop", "gpu_timeout_s": self.gpu_timeout_s}
        if self.order is not None:
            doc["order"] = self.order
            doc["main_only"] = self.order == "main"  # read by older supervisors
        if self.grace_s is not None:
            doc["grace_s"] = self.grace_s
        if self.verb != "stop":
            doc["verb"] = self.verb
        return doc

    @classmethod
    def from_doc(cls, doc: JsonObject) -> StopAsk:
        """Read a request (``main_only`` is the older spelling of order ``main``)."""
        values = {k: doc.get(k) for k in ("gpu_timeout_s", "order", "grace_s")}
        verb = doc.get("verb", "stop")
        values["verb"] = verb if verb in ("stop", "restart", "rm", "deploy") else "stop"
        if values["order"] is None and doc.get("main_only") is True:
            values["order"] = "main"
        ask = build_document(cls, values, "stop request")
        grace, gpu = ask.grace_s, ask.gpu_timeout_s  # JSON may say 5 for 5.0
        return replace(
            ask,
            grace_s=None if grace is None else float(grace),
            gpu_timeout_s=None if gpu is None else float(gpu),
        )


@record(frozen=True)
class StopReply:
    """The supervisor's answer to a stop: its report, or ``retry`` (a successor owns the
    job now), or an error."""

    ok: bool = False
    report: StopReport = field(default_factory=StopReport)
    exit_code: int | None = None
    joined: bool = False  # another client's stop was already running; this one joined it
    retry: bool = False
    error: str | None = None
    code: str | None = None  # with an error: bad-request

    def to_doc(self) -> JsonObject:
        """The reply on the wire."""
        return asdict(self)


@record(frozen=True)
class AttachAsk:
    """A client's `attach`: to type into the job's terminal, or only watch it, at its size."""

    read_only: bool = False
    rows: int | None = None
    cols: int | None = None

    def to_doc(self) -> JsonObject:
        """The request on the wire (the size only when known)."""
        doc: JsonObject = {"op": "attach", "read_only": self.read_only}
        if self.rows is not None and self.cols is not None:
            doc["rows"], doc["cols"] = self.rows, self.cols
        return doc

    @classmethod
    def from_doc(cls, doc: JsonObject) -> AttachAsk:
        """Read a request (a field of the wrong type is refused: StateError)."""
        values = {k: doc.get(k) for k in ("rows", "cols")}
        return build_document(cls, {**values, "read_only": doc.get("read_only") is True}, "attach")


@record(frozen=True)
class AttachReply:
    """The supervisor's answer to an attach, before the terminal's frames: the run and its
    main, or why not (``no_tty``: the job has no terminal at all)."""

    ok: bool = False
    main_pid: int | None = None
    run: int | None = None
    error: str | None = None
    no_tty: bool = False
    code: str | None = None  # with an error: bad-request | no-tty | refused

    def to_doc(self) -> JsonObject:
        """The reply on the wire."""
        return asdict(self)


@record(frozen=True)
class PingReply:
    """The supervisor's answer to a ping: that it serves, its pid, the run's phase, and
    the protocol it speaks (1 when a reply does not say: a supervisor from before)."""

    ok: bool = True
    pid: int = 0
    phase: str = ""
    protocol: int = 1

    def to_doc(self) -> JsonObject:
        """The reply on the wire."""
        return asdict(self)


@record(frozen=True)
class CheckpointReply:
    """The supervisor's answer to ``{"op": "checkpoint", "signal": "SIGUSR2"}``: the
    processes of its run that catch the signal were sent it (``sent`` of ``checked``), or
    ``error`` says why none was (``code``: ``none-catches``, ``not-running``)."""

    ok: bool = False
    sent: int = 0
    checked: int = 0
    asked_at: float = 0.0
    error: str | None = None
    code: str | None = None

    def to_doc(self) -> JsonObject:
        """The reply on the wire."""
        return asdict(self)


def ask_checkpoint(jdir: Path, signal_name: str, timeout_s: float) -> CheckpointReply:
    """Ask the run's supervisor to send the checkpoint signal to the processes that catch
    it (ControlUnavailableError: none answers; StateError: it speaks an older protocol,
    ``code`` unknown-op, or replied nonsense)."""
    doc = request(jdir, {"op": "checkpoint", "signal": signal_name}, timeout_s)
    if unknown(doc):
        raise StateError(f"its supervisor is older (protocol {doc.get('protocol', 1)})")
    return build_document(CheckpointReply, doc, "checkpoint reply")


def ping(jdir: Path, timeout_s: float) -> PingReply:
    """Ask the job's supervisor who it is (ControlUnavailableError: it did not answer)."""
    doc = request(jdir, {"op": "ping"}, timeout_s)
    try:
        return build_document(PingReply, doc, "ping reply")
    except StateError:
        raise ControlUnavailableError("its supervisor's ping reply is malformed") from None


def attach_reply(doc: JsonObject) -> AttachReply:
    """An attach reply read off the wire, checked field by field."""
    return build_document(AttachReply, doc, "attach reply")


def ask_stop(jdir: Path, ask: StopAsk, timeout_s: float, *, watch: bool = False) -> StopReply:
    """Send a stop to the job's supervisor and return its checked reply (``watch``: see
    :func:`request`)."""
    return stop_reply(request(jdir, ask.to_doc(), timeout_s, watch=watch))


def _peer_cred(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return int(pid), int(uid)


def peer_uid(sock: socket.socket) -> int:
    """Return the uid of the process at the other end of a Unix socket."""
    return _peer_cred(sock)[1]


def peer_pid(sock: socket.socket) -> int:
    """Return the pid of the process at the other end of a Unix socket."""
    return _peer_cred(sock)[0]


def encode(msg: JsonObject) -> bytes:
    """Frame one message."""
    return json.dumps(msg, default=str).encode() + b"\n"


def decode(line: bytes) -> JsonObject:
    """Parse one framed message."""
    msg = json.loads(line)
    if not isinstance(msg, dict):
        raise ValueError("message is not an object")  # noqa: TRY004 (a protocol error)
    return msg


# sun_path holds 108 bytes including the NUL; a long home plus a 64-character job name
# does not fit.
_SUN_PATH_MAX = 107


@contextlib.contextmanager
def _addressable(jdir: Path) -> Iterator[str]:
    """Yield an address for the job's socket that fits sun_path, however long the home is.

    A long path is reached through ``/proc/self/fd/N/``, N being a descriptor of the job
    directory: the kernel resolves it to the very same socket file (same inode, same
    0600 mode, same peer-uid check), so nothing else changes.
    """
    path = str(jdir / SOCK_NAME)
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        yield path
        return
    fd = os.open(jdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{SOCK_NAME}"
    finally:
        os.close(fd)


def bind(jdir: Path) -> socket.socket:
    """Create the listening control socket (0600) before the CLI is told the job started.

    Bound in the handshake phase so a `stop` right after `start` returns always finds it.
    """
    path = jdir / SOCK_NAME
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with _addressable(jdir) as address:
        sock.bind(address)
    os.chmod(path, 0o600)
    sock.listen(64)
    sock.setblocking(False)
    return sock


def connect(jdir: Path, timeout_s: float) -> socket.socket:
    """A connection to the job's supervisor, checked to be served by our own uid."""
    path = jdir / SOCK_NAME
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        with _addressable(jdir) as address:
            s.connect(address)
    except OSError as e:
        s.close()
        raise ControlUnavailableError(f"cannot connect to {path}: {e.strerror}") from None
    if peer_uid(s) != os.geteuid():
        s.close()
        raise StateError(f"{path} is served by another user; refusing to talk to it")
    return s


def request(jdir: Path, msg: JsonObject, timeout_s: float, *, watch: bool = False) -> JsonObject:
    """Send one request (a flat object with its ``op``) to the job's supervisor and return
    its reply. ``watch``: while the reply is awaited (a stop's: minutes), tell whether
    the supervisor still answers anything (:func:`still_answering`)."""
    fields = {k: v for k, v in msg.items() if k != "op"}
    line = wire.request(str(msg["op"]), **fields)  # type: ignore[arg-type]
    s = connect(jdir, timeout_s)
    try:
        try:
            s.sendall(line)
        except OSError as e:  # as a failed read is: the supervisor went away
            raise ControlUnavailableError(f"the connection failed: {e.strerror}") from None
        return read_reply(s, still_answering(jdir, s) if watch else None)
    finally:
        s.close()


def read_reply(
    s: _socket.socket, alive: Callable[[], bool] | None = None, every_s: float = LOOK_EVERY_S
) -> JsonObject:
    """Read the one-line reply to a request sent on ``s`` (its timeout applies).

    A stop's reply comes when the stop is over, the grace and the GPUs' return included:
    minutes. With ``alive``, asked every ``every_s`` while no reply has come, a
    supervisor that took the request and then stopped answering anything (frozen by
    SIGSTOP, blocked on a hung disk) is :class:`MuteError` within seconds, not silence
    until the timeout.
    """
    limit = s.gettimeout()
    end = None if limit is None else time.monotonic() + limit
    buf = b""
    while not buf.endswith(b"\n"):
        left = None if end is None else end - time.monotonic()
        if alive is not None:
            s.settimeout(every_s if left is None else max(0.0, min(every_s, left)))
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            if alive is not None and (end is None or time.monotonic() < end):
                if not alive():
                    raise MuteError("it took the request, then stopped answering") from None
                continue
            raise ControlUnavailableError("the supervisor did not answer in time") from None
        except OSError as e:
            raise ControlUnavailableError(f"the connection failed: {e.strerror}") from None
        if not chunk:
            raise ControlUnavailableError("the supervisor closed the connection")
        buf += chunk
        if len(buf) > MAX_LINE:
            raise ControlUnavailableError("reply too long")
    return decode(buf)


def stop_reply(doc: JsonObject) -> StopReply:
    """A stop reply read off the wire, checked field by field."""
    return build_document(StopReply, doc, "stop reply")


def read_stop_reply(
    s: _socket.socket, timeout_s: float | None, watch: Path | None = None
) -> StopReply:
    """The reply to a stop already sent on ``s`` (launcher/early.py's, or ask_stop's);
    ``s`` is closed. ``watch``: the job's directory, to tell while the reply is awaited
    whether its supervisor still answers anything (:func:`still_answering`)."""
    try:
        s.settimeout(timeout_s)
        return stop_reply(read_reply(s, None if watch is None else still_answering(watch, s)))
    finally:
        s.close()


def still_answering(jdir: Path, s: _socket.socket) -> Callable[[], bool]:
    """Whether the supervisor at the other end of ``s``, which took a request, still
    answers anything: a ping on a connection of its own (its server answers while a stop
    runs, in ~2 ms here).

    Mute: a failed ping from a supervisor that is stopped (SIGSTOP, a debugger), or two
    in a row (a box so loaded that one ping waits 2 s is not reason enough). A socket file
    gone meanwhile is not muteness in a supervisor that runs: it binds again on its tick.
    """
    creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid = int(struct.unpack("3i", creds)[0])  # held by our open connection: not recycled
    failed = 0

    def answering() -> bool:
        nonlocal failed
        try:
            ping(jdir, PING_S)
        except ControlUnavailableError:
            if not (jdir / SOCK_NAME).exists():
                return not _stopped(pid)
            failed += 1
            return failed < 2 and not _stopped(pid)
        failed = 0
        return True

    return answering


def _stopped(pid: int) -> bool:
    st = procfs.read_stat(pid)
    return st is not None and st.state in ("T", "t")


PING_S = 2.0  # a ping's wait, while a stop's reply is awaited
