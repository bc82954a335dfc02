"""The D-Bus client against a peer that behaves as systemd 252's sd-bus server does.

That server can read BEGIN and the first message in one read and then not parse the
message until more bytes arrive (found on the systemd bed: 17 of 20 calls hung on a busy
machine). The peer here is a real process on a real unix socket that does the same: it
answers a call only once bytes have arrived after the read that held BEGIN.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainctl.supervisor import dbus

PEER = r"""
import select, socket, struct, sys, time
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sys.argv[1]); srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
buf = b""
while b"\r\n" not in buf:
    buf += conn.recv(4096)
assert buf.startswith(b"\0AUTH EXTERNAL "), buf
conn.sendall(b"OK 0123456789abcdef0123456789abcdef\r\n")
time.sleep(0.5)  # a busy server: BEGIN and the call are both waiting by the time it reads
buf = b""
while b"BEGIN\r\n" not in buf:
    buf += conn.recv(4096)
buf = buf.split(b"BEGIN\r\n", 1)[1]
# The stall: whatever came with BEGIN is left unread until the socket is readable again.
select.select([conn], [], [])
while True:
    while len(buf) < 16:
        buf += conn.recv(4096)
    body_len, serial, fields_len = struct.unpack_from("<III", buf, 4)
    size = 16 + fields_len + (-(16 + fields_len) % 8) + body_len
    while len(buf) < size:
        buf += conn.recv(4096)
    buf = buf[size:]
    if serial != 1:
        continue  # a ping: its answer is not needed to show the nudge worked
    name = b"org.freedesktop.systemd1.NoSuchUnit"
    text = b"Unit no.scope not loaded."
    body = struct.pack("<I", len(text)) + text + b"\0"
    fields = b""
    for code, sig, value in ((4, b"s", name), (5, b"u", serial), (8, b"g", b"s")):
        fields += b"\0" * (-len(fields) % 8) + bytes([code, 1]) + sig + b"\0"
        if sig == b"s":
            fields += b"\0" * (-len(fields) % 4) + struct.pack("<I", len(value)) + value + b"\0"
        elif sig == b"u":
            fields += b"\0" * (-len(fields) % 4) + struct.pack("<I", value)
        else:
            fields += bytes([len(value)]) + value + b"\0"
    head = struct.pack("<cBBBIII", b"l", 3, 0, 1, len(body), 7, len(fields)) + fields
    conn.sendall(head + b"\0" * (-len(head) % 8) + body)
    break
conn.close()
"""


@pytest.fixture
def peer(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "private"
    proc = subprocess.Popen(
        [sys.executable, "-c", PEER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        yield str(path)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()  # type: ignore[union-attr]


def _call(path: str, timeout_s: float) -> str:
    try:
        dbus.call(
            path, None, "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager",
            "AttachProcessesToUnit", "ssau", ("no.scope", "", [os.getpid()]), timeout_s=timeout_s,
        )  # fmt: skip
    except dbus.DBusError as e:
        return f"{e.name}: {e}"
    return "no error"


def test_a_peer_that_sits_on_the_first_message_is_nudged_into_answering(peer: str) -> None:
    t0 = time.monotonic()
    said = _call(peer, timeout_s=20)
    assert said.startswith("org.freedesktop.systemd1.NoSuchUnit"), said
    assert "no.scope not loaded" in said
    assert time.monotonic() - t0 < 10  # a nudge or two, not the whole timeout


def test_without_the_nudge_the_same_peer_never_answers(
    peer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the nudge is for: the call sits until its timeout (here 2 s)."""
    monkeypatch.setattr(dbus, "NUDGE_S", 3600.0)
    said = _call(peer, timeout_s=2)
    assert said.startswith("trainctl."), said
    assert "answer" in said or "timed out" in said, said


def test_the_wire_format_of_a_call_is_what_the_peer_parses() -> None:
    """A method call's fixed header: little-endian, METHOD_CALL, its serial and lengths."""
    msg = dbus._message(5, [(1, "o", "/x")], "", b"")
    assert msg[:4] == b"l\x01\x00\x01"
    body_len, serial, fields_len = struct.unpack_from("<III", msg, 4)
    assert (body_len, serial) == (0, 5)
    assert len(msg) == 16 + fields_len + (-(16 + fields_len) % 8)
