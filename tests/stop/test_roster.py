"""The supervisor's roster: real processes in a real cgroup v2 directory, no mocks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import _stat, kill_verified, wait_for
from trainctl.supervisor.linux import cgroup, procfs
from trainctl.supervisor.model.state import ProcRef
from trainctl.supervisor.tree.proctree import Target
from trainctl.supervisor.tree.roster import Roster

# main forks A; A forks B. Each writes its pid to DIR/<name>. A exits when DIR/kill-a
# exists; B calls setsid once DIR/go-setsid exists, then writes DIR/setsid-done.
TREE = r"""
import os, sys, time
d = sys.argv[1]
def put(name):
    with open(os.path.join(d, name + ".tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))
def until(name):
    while not os.path.exists(os.path.join(d, name)):
        time.sleep(0.01)
if os.fork() == 0:
    if os.fork() == 0:
        put("b")
        until("go-setsid")
        os.setsid()
        put("setsid-done")
        time.sleep(600)
        os._exit(0)
    put("a")
    until("kill-a")
    os._exit(0)
put("main")
time.sleep(600)
"""


@pytest.fixture
def group() -> Iterator[Path]:
    path = cgroup.create_job_cgroup(f"roster-test-{uuid.uuid4().hex[:8]}")
    if path is None:
        pytest.skip("cgroup v2 is not writable on this machine")
    yield path
    for pid in cgroup.read_pids(path):  # only this test's processes can be in it
        st = _stat(pid)
        if st is not None:
            kill_verified(pid, st[1])
    wait_for(lambda: not cgroup.read_pids(path), 10, "the test cgroup to empty")
    cgroup.remove_when_empty(path)


def _pid(d: Path, name: str) -> int:
    wait_for((d / name).exists, 30, f"{name} to start")
    return int((d / name).read_text())


def _ref(pid: int) -> ProcRef:
    st = procfs.read_stat(pid)
    assert st is not None
    return ProcRef(pid, st.start_ticks)


@pytest.fixture
def tree(group: Path, tmp_path: Path) -> Iterator[Path]:
    """Start TREE in the test cgroup; return its directory (the group fixture ends it)."""
    procs = group / "cgroup.procs"
    p = subprocess.Popen(
        [sys.executable, "-c", TREE, str(tmp_path)],
        preexec_fn=lambda: procs.write_text(str(os.getpid())),  # noqa: PLW1509 (no threads here)
        start_new_session=True,
    )
    try:
        yield tmp_path
    finally:
        p.kill()  # our own child
        p.wait()


def test_refresh_follows_joins_exits_and_new_parents(group: Path, tree: Path) -> None:
    main, a, b = (_pid(tree, n) for n in ("main", "a", "b"))
    roster = Roster(Target(marker="x", main=_ref(main), cgroup=group))
    roster.refresh()
    members = roster.refresh()  # twice: every member is settled, read no more unless...
    assert set(members) == {main, a, b}
    assert members[main].nets == {"cgroup", "main"}
    assert members[b].nets == {"cgroup", "tree"}
    assert members[b].stat.ppid == a
    held_fds = len(roster.by_fd)
    assert held_fds == 3

    (tree / "kill-a").touch()  # ... A exits: B gets a new parent
    wait_for(lambda: not procfs.is_alive(a, members[a].stat.start_ticks), 10, "A to exit")
    members = roster.refresh()
    assert a not in members
    assert members[b].stat.ppid != a  # re-read because its parent exited
    assert "tree" not in members[b].nets  # no longer below main
    assert len(roster.by_fd) == 2  # A's pidfd was closed
    roster.close()


def test_a_member_that_calls_setsid_after_it_was_found_is_read_again(
    group: Path, tree: Path
) -> None:
    main, b = _pid(tree, "main"), _pid(tree, "b")
    roster = Roster(Target(marker="x", main=_ref(main), cgroup=group))
    assert roster.refresh()[b].stat.sid == main  # found before its setsid
    (tree / "go-setsid").touch()
    wait_for((tree / "setsid-done").exists, 10, "B's setsid")
    assert roster.refresh()[b].stat.sid == b  # young members are read once more
    roster.close()


def test_take_hands_every_pidfd_over_once(group: Path, tree: Path) -> None:
    main = _pid(tree, "main")
    _pid(tree, "b")
    roster = Roster(Target(marker="x", main=_ref(main), cgroup=group))
    assert roster.take() is None  # never refreshed: the stop collects for itself
    roster = Roster(Target(marker="x", main=_ref(main), cgroup=group))
    roster.refresh()
    held = roster.take()
    assert held is not None
    assert {h.member.stat.pid for h in held} == set(cgroup.read_pids(group))
    for h in held:
        assert h.fd is not None
        assert os.fstat(h.fd)  # the stop owns them now: still open
        signal.pidfd_send_signal(h.fd, 0)
    assert roster.take() is None
    assert roster.refresh() == {}
    for h in held:
        assert h.fd is not None
        os.close(h.fd)


@pytest.fixture
def old() -> Iterator[int]:
    """A process of this test that starts before the tree (request it before ``tree``)."""
    p = subprocess.Popen(["sleep", "600"])
    time.sleep(0.05)  # a later clock tick (10 ms) for the tree's start time
    try:
        yield p.pid
    finally:
        p.kill()  # our own child
        p.wait()


def test_a_process_older_than_main_is_never_a_member(group: Path, old: int, tree: Path) -> None:
    main = _pid(tree, "main")
    assert _ref(old).start_ticks < _ref(main).start_ticks
    (group / "cgroup.procs").write_text(str(old))  # ours, and older than the job
    roster = Roster(Target(marker="x", main=_ref(main), cgroup=group))
    members = roster.refresh()
    assert old in cgroup.read_pids(group)
    assert old not in members
    assert main in members
    roster.close()
