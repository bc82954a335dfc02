"""/proc parsing against this very process and children we create."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.conftest import wait_for
from trainctl.supervisor.linux import procfs


def test_read_stat_of_self() -> None:
    st = procfs.read_stat(os.getpid())
    assert st is not None
    assert st.pid == os.getpid()
    assert st.ppid == os.getppid()
    assert st.pgid == os.getpgid(0)
    assert st.sid == os.getsid(0)
    assert st.state in "RS"
    assert abs(procfs.ticks_to_epoch(st.start_ticks) - time.time()) < 86400 * 365


def test_comm_with_spaces_and_parens(tmp_path: Path) -> None:
    exe = tmp_path / "we ird) (name"
    shutil.copy("/bin/sleep", exe)
    p = subprocess.Popen([str(exe), "30"])
    try:
        st = procfs.read_stat(p.pid)
        assert st is not None
        assert st.comm.startswith("we ird) (")
        assert st.ppid == os.getpid()
        # Popen returns once exec has closed its CLOEXEC pipe, a moment before the kernel
        # has laid out the new argv: /proc/PID/cmdline may still read empty then
        wait_for(lambda: procfs.read_cmdline(p.pid) != "", what="argv after exec")
        assert procfs.read_cmdline(p.pid) == f"{exe} 30"
    finally:
        p.kill()
        p.wait()


def test_missing_pid_is_none() -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    assert procfs.read_stat(p.pid) is None
    assert not procfs.is_alive(p.pid, 1)
    assert procfs.read_cmdline(p.pid) == ""


def test_marker_matches_whole_entries_only() -> None:
    env = {"PATH": os.environ["PATH"], "TRAINCTL_JOB": "abc123"}
    p = subprocess.Popen(["sleep", "30"], env=env)
    try:
        # Popen returns once exec has begun (close-on-exec fired), but the kernel sets up
        # the new environment block a moment later: until then /proc/PID/environ is empty.
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{p.pid}/environ").read_bytes():
            assert time.monotonic() < deadline, "exec never finished"
            time.sleep(0.001)
        assert procfs.has_marker(p.pid, b"TRAINCTL_JOB=abc123")
        assert not procfs.has_marker(p.pid, b"TRAINCTL_JOB=abc")
        assert not procfs.has_marker(p.pid, b"JOB=abc123")
    finally:
        p.kill()
        p.wait()


def test_send_signal_refuses_a_different_start_time() -> None:
    p = subprocess.Popen(["sleep", "30"])
    try:
        st = procfs.read_stat(p.pid)
        assert st is not None
        assert not procfs.send_signal(p.pid, st.start_ticks + 1, signal.SIGKILL)
        time.sleep(0.05)
        assert p.poll() is None  # the wrong identity was not signalled
        assert procfs.send_signal(p.pid, st.start_ticks, signal.SIGKILL)
        assert p.wait(5) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_zombie_exists_but_is_not_alive() -> None:
    p = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while (s := procfs.read_stat(p.pid)) is not None and s.state != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert s is not None
    assert procfs.exists(p.pid, s.start_ticks)
    assert not procfs.is_alive(p.pid, s.start_ticks)
    p.wait()
