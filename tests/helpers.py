"""Assertions and helpers shared by the test areas (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import Harness, alive

# The PyTorch tests: slow, and skipped with the reason where no CPU build is installed.
NEEDS_TORCH = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None,
        reason="PyTorch is not installed (scripts/test.sh installs the CPU build, "
        "torch==2.13.0, when its wheel is at hand)",
    ),
]


def one_line_error(res: Any, rc: int, needle: str) -> None:
    """The command failed with ``rc`` and said why in one stderr line holding ``needle``."""
    assert res.rc == rc, (res.rc, res.out, res.err)
    lines = res.err.strip().splitlines()
    assert len(lines) == 1, res.err
    assert needle in lines[0], lines[0]


def one_line(res: Any) -> None:
    """stderr is one line and no traceback (whatever the exit code)."""
    assert len(res.err.strip().splitlines()) == 1, res.err
    assert "Traceback" not in res.err


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_and_check(h: Harness, name: str, *args: str) -> dict[str, Any]:
    """Stop job ``name``; assert ok, no member left, every bystander alive, and exit 0, or
    6 (nothing proves it found all) for a stop without its supervisor and without a cgroup."""
    before = h.job_pids(name)
    assert before, "the job has no live process before stop"
    st = h.state(name)
    sup = st["supervisor"]
    unprovable = st["cgroup"] is None and not (sup and alive(sup["pid"], sup["start_ticks"]))
    res = h.tc("stop", name, "--json", *args, timeout=90)
    assert res.rc == (6 if unprovable else 0), res.out + res.err
    doc = res.json()
    assert isinstance(doc, dict)
    assert doc["ok"] is True
    assert bool(doc["report"]["unproven"]) is unprovable, doc["report"]["unproven"]
    assert not h.job_pids(name), "job processes survived the stop"
    for pid, start in before.items():
        assert not alive(pid, start)
    h.assert_bystanders_alive()
    return doc


class Pane:
    """A command on a real terminal: a private tmux server's pane (send-keys, capture)."""

    def __init__(self, h: Harness, argv: list[str], width: int = 120, height: int = 30) -> None:
        self.tmux = [
            "tmux",
            "-S",
            str(h.tmp / f"pane-{uuid.uuid4().hex[:6]}.sock"),
            "-f",
            "/dev/null",
        ]
        # a new tmux server passes its own environment (the test's) on to the pane
        cmd = [*self.tmux, "new-session", "-d", "-x", str(width), "-y", str(height)]
        subprocess.run([*cmd, shlex.join(argv)], env=h.env, check=True)

    def screen(self) -> str:
        return subprocess.run(
            [*self.tmux, "capture-pane", "-p"], capture_output=True, text=True, check=False
        ).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", *keys], check=True)

    def ended(self) -> bool:
        done = subprocess.run([*self.tmux, "has-session"], capture_output=True, check=False)
        return done.returncode != 0

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True, check=False)


@contextlib.contextmanager
def frozen_supervisor(h: Harness, name: str) -> Iterator[None]:
    """Our own test job's supervisor stopped (SIGSTOP through a pidfd, its start time
    checked first), and let go on leaving if it still lives (a --force may have ended it)."""
    sup = h.state(name)["supervisor"]
    fd = os.pidfd_open(sup["pid"])
    try:
        assert alive(sup["pid"], sup["start_ticks"])
        signal.pidfd_send_signal(fd, signal.SIGSTOP)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGCONT)
        os.close(fd)
