"""The D-Bus client (supervisor/linux/dbus.py) against a real peer process on a unix socket.

The peer plays the parts a systemd manager's private socket can: it authenticates (or
refuses to), answers in either byte order, sends a signal before the reply, answers with
an ERROR, or hangs up. One part is systemd 252's own: its sd-bus server can read BEGIN
and the first call in one read and then not parse the call until more bytes arrive
(found on the systemd bed, 17 of 20 calls hung on a busy machine).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainctl.supervisor.linux import dbus

PEER = r"""
import select, socket, struct, sys, time
path, part = sys.argv[1], sys.argv[2]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path); srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
buf = b""
while b"\r\n" not in buf:
    buf += conn.recv(4096)
assert buf.startswith(b"\0AUTH EXTERNAL "), buf
if part == "reject":
    conn.sendall(b"REJECTED EXTERNAL\r\n")
    sys.exit(0)
conn.sendall(b"OK 0123456789abcdef0123456789abcdef\r\n")
if part == "stall":
    time.sleep(0.5)  # a busy server: BEGIN and the call are both waiting when it reads
buf = b""
while b"BEGIN\r\n" not in buf:
    buf += conn.recv(4096)
buf = buf.split(b"BEGIN\r\n", 1)[1]
if part == "stall":  # what came with BEGIN is left unread until more bytes arrive
    select.select([conn], [], [])
while len(buf) < 16:
    buf += conn.recv(4096)
body_len, serial, fields_len = struct.unpack_from("<III", buf, 4)
assert serial == 1, serial
if part == "hangup":
    conn.close()
    sys.exit(0)

def message(order, kind, serial, fields, sig, body):
    e = "<" if order == b"l" else ">"
    head = b""
    for code, t, value in fields + ([(8, b"g", sig)] if sig else []):
        head += b"\0" * (-len(head) % 8) + bytes([code, 1]) + t + b"\0"
        if t in (b"s", b"o"):
            head += b"\0" * (-len(head) % 4) + struct.pack(e + "I", len(value)) + value + b"\0"
        elif t == b"u":
            head += b"\0" * (-len(head) % 4) + struct.pack(e + "I", value)
        else:
            head += bytes([len(value)]) + value + b"\0"
    fixed = order + bytes([kind, 0, 1]) + struct.pack(e + "III", len(body), serial, len(head))
    out = fixed + head
    return out + b"\0" * (-len(out) % 8) + body

def string(order, text):
    return struct.pack(("<" if order == b"l" else ">") + "I", len(text)) + text + b"\0"

order = b"B" if part == "big-endian" else b"l"
out = b""
if part == "signal-first":  # a signal the peer emits meanwhile: not the answer
    out += message(order, 4, 40, [(1, b"o", b"/org/freedesktop/systemd1"),
        (2, b"s", b"org.freedesktop.systemd1.Manager"), (3, b"s", b"UnitNew")], b"", b"")
if part in ("signal-first", "return"):
    out += message(order, 2, 41, [(5, b"u", 1)], b"s", string(order, b"done"))
else:
    text = b"Unit no.scope not loaded."
    out += message(order, 3, 42, [(4, b"s", b"org.freedesktop.systemd1.NoSuchUnit"),
        (5, b"u", 1)], b"s", string(order, text))
conn.sendall(out)
time.sleep(5)
"""


@pytest.fixture
def peer(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    path = tmp_path / "private"
    proc = subprocess.Popen(
        [sys.executable, "-c", PEER, str(path), request.param], stdout=subprocess.PIPE, text=True
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
        body = dbus.call(
            path, None, "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager",
            "AttachProcessesToUnit", "ssau", ("no.scope", "", [os.getpid()]), timeout_s=timeout_s,
        )  # fmt: skip
    except dbus.DBusError as e:
        return str(e)  # "name: message"
    return f"returned {body!r}"


@pytest.mark.parametrize("peer", ["error", "big-endian"], indirect=True)
def test_an_error_reply_comes_back_in_the_peers_own_words_in_either_byte_order(
    peer: str,
) -> None:
    said = _call(peer, timeout_s=10)
    assert said.startswith("org.freedesktop.systemd1.NoSuchUnit: "), said
    assert said.endswith("Unit no.scope not loaded."), said


@pytest.mark.parametrize("peer", ["signal-first"], indirect=True)
def test_a_signal_before_the_reply_is_skipped(peer: str) -> None:
    said = _call(peer, timeout_s=10)
    assert said == "returned " + repr(struct.pack("<I", 4) + b"done\0"), said


@pytest.mark.parametrize("peer", ["reject"], indirect=True)
def test_a_refused_auth_says_what_the_peer_said(peer: str) -> None:
    assert _call(peer, timeout_s=10) == "trainctl.Auth: REJECTED EXTERNAL"


@pytest.mark.parametrize("peer", ["hangup"], indirect=True)
def test_a_peer_that_hangs_up_is_an_error_not_a_hang(peer: str) -> None:
    t0 = time.monotonic()
    said = _call(peer, timeout_s=20)
    assert said.startswith("trainctl.Disconnected"), said
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("peer", ["stall"], indirect=True)
def test_a_peer_that_sits_on_the_first_call_is_nudged_into_answering(peer: str) -> None:
    t0 = time.monotonic()
    said = _call(peer, timeout_s=20)
    assert said.startswith("org.freedesktop.systemd1.NoSuchUnit"), said
    assert time.monotonic() - t0 < 10  # a nudge or two, not the whole timeout


@pytest.mark.parametrize("peer", ["stall"], indirect=True)
def test_without_the_nudge_the_same_peer_never_answers(
    peer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the nudge is for: the call sits until its timeout (here 2 s)."""
    monkeypatch.setattr(dbus, "NUDGE_S", 3600.0)
    said = _call(peer, timeout_s=2)
    assert said.startswith("trainctl."), said
    assert "answer" in said or "timed out" in said, said


def test_a_socket_nobody_listens_on_is_a_connect_error(tmp_path: Path) -> None:
    assert _call(str(tmp_path / "none"), timeout_s=2).startswith("trainctl.Connect: ")
