"""Just enough D-Bus to ask a systemd manager one thing, without a D-Bus library.

trainctl calls one method on one peer: ``AttachProcessesToUnit`` on the user's own
systemd manager, over the manager's private socket (``$XDG_RUNTIME_DIR/systemd/private``,
which every user manager listens on, with or without a session bus). That is a
peer-to-peer connection: no bus daemon, no ``Hello``. ``busctl`` cannot be pointed at it
(it says "Invalid request descriptor").

Why not jeepney (MIT, pure Python, no dependencies): it would do, for the wire format. It
was weighed in issue 34 and not taken because the one thing this call needed that the
wire format does not give is control of the conversation: systemd 252's sd-bus server can
sit on a call that arrives with BEGIN (see NUDGE_S), and a library's send-and-wait hangs
there exactly as a hand-written one did. What is left to write for one method is small:
the types that call needs (``s o g u b`` and arrays of ``u``), little-endian out, either
byte order in, no unix fds, SASL EXTERNAL with the caller's uid. It is tested against a
real peer process (tests/systemd/test_dbus_client.py) and against systemd on the bed.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections.abc import Sequence

METHOD_CALL, METHOD_RETURN, ERROR = 1, 2, 3
_PATH, _INTERFACE, _MEMBER, _ERROR_NAME, _REPLY_SERIAL, _DESTINATION, _SIGNATURE = (
    1, 2, 3, 4, 5, 6, 8,
)  # fmt: skip
_ALIGN = {"y": 1, "b": 4, "u": 4, "s": 4, "o": 4, "g": 1, "a": 4, "(": 8, "v": 1}


class DBusError(Exception):
    """The peer answered with an error, or could not be reached or understood."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}" if message else name)
        self.name = name


class _Writer:
    def __init__(self) -> None:
        self.buf = bytearray()

    def pad(self, n: int) -> None:
        self.buf += b"\0" * (-len(self.buf) % n)

    def put(self, code: str, value: object) -> None:
        self.pad(_ALIGN[code[0]])
        if code == "y":
            self.buf += struct.pack("<B", value)
        elif code in ("u", "b"):
            self.buf += struct.pack("<I", int(value))  # type: ignore[call-overload]
        elif code in ("s", "o"):
            raw = str(value).encode()
            self.buf += struct.pack("<I", len(raw)) + raw + b"\0"
        elif code == "g":
            raw = str(value).encode()
            self.buf += struct.pack("<B", len(raw)) + raw + b"\0"
        elif code == "au":
            items = list(value)  # type: ignore[call-overload]
            self.buf += struct.pack("<I", 4 * len(items))
            for item in items:
                self.buf += struct.pack("<I", int(item))
        else:  # pragma: no cover - a programming error, not input
            raise ValueError(f"type {code!r} is not supported")


def _split(signature: str) -> list[str]:
    """``"ssau"`` -> ``["s", "s", "au"]`` (only the shapes this module writes or reads)."""
    out, i = [], 0
    while i < len(signature):
        j = i
        while signature[j] == "a":
            j += 1
        out.append(signature[i : j + 1])
        i = j + 1
    return out


def _message(serial: int, fields: list[tuple[int, str, object]], sig: str, body: bytes) -> bytes:
    w = _Writer()
    w.buf += struct.pack("<cBBBII", b"l", METHOD_CALL, 0, 1, len(body), serial)
    head = _Writer()
    for code, kind, value in fields:
        head.pad(8)
        head.put("y", code)
        head.put("g", kind)
        head.put(kind, value)
    # The fields array: its byte length, then (aligned to 8, as its elements are) the fields.
    w.put("u", len(head.buf))
    w.pad(8)
    # head was built from offset 0, and here it starts at offset 16: both multiples of 8.
    w.buf += head.buf
    w.pad(8)
    return bytes(w.buf) + body


class _Reader:
    def __init__(self, data: bytes, pos: int = 0, order: str = "<") -> None:
        self.data, self.pos, self.order = data, pos, order  # order: "<" or ">" (struct's)

    def align(self, n: int) -> None:
        self.pos += -self.pos % n

    def get(self, code: str) -> object:
        self.align(_ALIGN[code[0]])
        d = self.data
        if code == "y":
            self.pos += 1
            return d[self.pos - 1]
        if code in ("u", "b"):
            (v,) = struct.unpack_from(self.order + "I", d, self.pos)
            self.pos += 4
            return bool(v) if code == "b" else v
        if code in ("s", "o"):
            (n,) = struct.unpack_from(self.order + "I", d, self.pos)
            self.pos += 4 + n + 1
            return d[self.pos - n - 1 : self.pos - 1].decode(errors="replace")
        if code == "g":
            n = d[self.pos]
            self.pos += 1 + n + 1
            return d[self.pos - n - 1 : self.pos - 1].decode(errors="replace")
        raise DBusError("trainctl.UnsupportedType", f"cannot read type {code!r}")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise DBusError("trainctl.Disconnected", "the peer closed the connection")
        out += chunk
    return bytes(out)


def _read_message(sock: socket.socket) -> tuple[int, dict[int, object], _Reader]:
    """One message: (type, header fields by code, a reader at the start of its body)."""
    fixed = _recv_exact(sock, 16)
    order = {b"l": "<", b"B": ">"}.get(fixed[:1])  # a peer may answer in its own byte order
    if order is None:
        raise DBusError("trainctl.Protocol", f"not a D-Bus message (it starts {fixed[:1]!r})")
    kind = fixed[1]
    body_len, _serial, fields_len = struct.unpack_from(order + "III", fixed, 4)
    rest = _recv_exact(sock, fields_len + (-(16 + fields_len) % 8) + body_len)
    data = fixed + rest
    r = _Reader(data, 16, order)
    fields: dict[int, object] = {}
    while r.pos < 16 + fields_len:
        r.align(8)
        code = int(r.get("y"))  # type: ignore[call-overload]
        sig = str(r.get("g"))
        fields[code] = r.get(sig) if sig in ("s", "o", "g", "u", "b", "y") else None
        if sig not in ("s", "o", "g", "u", "b", "y"):
            break  # a field this module does not need; what follows cannot be found
    start = 16 + fields_len + (-(16 + fields_len) % 8)
    return kind, fields, _Reader(data[start : start + body_len], 0, order)


# Nudge: how long the answer may take before the peer is sent a Peer.Ping. systemd's
# sd-bus server (seen with 252) can read BEGIN and the first message in one go and then
# not look at that message until more bytes arrive: the call waits for ever (17 of 20
# calls on a busy bed, none of 40 once something followed). A ping is more bytes, and
# its answer (another serial) is skipped like any message that is not the answer; once
# anything has come back, the peer is reading, and a slow answer is only waited for.
NUDGE_S = 0.25
_PING: list[tuple[int, str, object]] = [
    (_PATH, "o", "/org/freedesktop/systemd1"),
    (_INTERFACE, "s", "org.freedesktop.DBus.Peer"),
    (_MEMBER, "s", "Ping"),
]


def _readable(sock: socket.socket, timeout_s: float) -> bool:
    ready, _, _ = select.select([sock], [], [], timeout_s)
    return bool(ready)


def _connect(path: str, timeout_s: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout_s)
    try:
        sock.connect(path)
        _auth(sock)
    except BaseException:
        sock.close()
        raise
    return sock


def _auth(sock: socket.socket) -> None:
    """SASL EXTERNAL: the kernel tells the peer our uid; we only name it."""
    sock.sendall(b"\0AUTH EXTERNAL " + str(os.geteuid()).encode().hex().encode() + b"\r\n")
    line = b""
    while not line.endswith(b"\r\n"):
        chunk = sock.recv(512)
        if not chunk:
            raise DBusError("trainctl.Auth", "the peer closed the connection during auth")
        line += chunk
    if not line.startswith(b"OK "):
        raise DBusError("trainctl.Auth", line.decode(errors="replace").strip())
    sock.sendall(b"BEGIN\r\n")


def call(
    address: str,
    destination: str | None,
    path: str,
    interface: str,
    member: str,
    signature: str,
    args: Sequence[object],
    timeout_s: float = 5.0,
) -> bytes:
    """Call one method and return the reply's raw body; DBusError for an error reply.

    ``address`` is a unix socket path. ``destination`` may be None on a peer-to-peer
    connection (a manager's private socket).
    """
    body = _Writer()
    for code, value in zip(_split(signature), args, strict=True):
        body.put(code, value)
    fields: list[tuple[int, str, object]] = [
        (_PATH, "o", path),
        (_INTERFACE, "s", interface),
        (_MEMBER, "s", member),
        *([(_DESTINATION, "s", destination)] if destination else []),
        *([(_SIGNATURE, "g", signature)] if signature else []),
    ]
    try:
        sock = _connect(address, timeout_s)
    except OSError as e:
        raise DBusError("trainctl.Connect", f"{address}: {e.strerror or e}") from None
    try:
        sock.sendall(_message(1, fields, signature, bytes(body.buf)))
        return _answer(sock, address, timeout_s)
    except (OSError, struct.error, IndexError) as e:
        raise DBusError("trainctl.Protocol", f"{address}: {e}") from None
    finally:
        sock.close()


def _answer(sock: socket.socket, address: str, timeout_s: float) -> bytes:
    """Read up to the reply to message 1: its body, or its error as a DBusError. While
    the peer has said nothing, nudge it with a Ping (see NUDGE_S)."""
    deadline = time.monotonic() + timeout_s
    serial, heard = 1, False
    while (left := deadline - time.monotonic()) > 0:
        if not heard and not _readable(sock, min(left, NUDGE_S)):
            serial += 1  # nothing yet: the peer may not have looked (see NUDGE_S)
            sock.sendall(_message(serial, _PING, "", b""))
            continue
        kind, got, reply = _read_message(sock)
        heard = True  # the peer reads what it is sent: the answer only takes its time
        if got.get(_REPLY_SERIAL) != 1:
            continue  # a signal or another peer's message: not the answer
        if kind == ERROR:
            name = str(got.get(_ERROR_NAME, "org.freedesktop.DBus.Error.Failed"))
            sig = str(got.get(_SIGNATURE, ""))
            text = str(reply.get("s")) if sig.startswith("s") else ""
            raise DBusError(name, text)
        if kind == METHOD_RETURN:
            return reply.data
    raise DBusError("trainctl.Timeout", f"no answer from {address} in {timeout_s:g} s")
