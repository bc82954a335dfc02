"""Every file and folder trainctl makes in its home is private, whatever the umask.

Issue 44 §3: under ``umask 000`` the uncommitted diff a run records (``code/run-N.diff``)
came out 0o666. The sweep below runs a job through most of what writes into the home (a
git snapshot of a dirty tree, progress, a rotated log and its times, hooks, a deploy, a
stop that needs SIGKILL, so stacks are taken, a queued job) with the umask at 000, then
walks the home: nothing may grant the group or others anything. A snapshot's own tree
mirrors the user's files (their modes are the user's); the folder that holds it is ours.
So does a checkpoint a deploy keeps aside (``deploys/ID.kept/``), or a start's guard
(``kept/run-N/``, a hard link may be the user's very file): a rollback puts it back as
the user's file was, mode and all; its folder is ours (0700) and checked.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Harness, wait_for
from tests.keeper.test_deploy import progress, repo, version


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)  # inherited by every process the test starts meanwhile
    try:
        yield
    finally:
        os.umask(old)


def _not_private(home: Path) -> list[str]:
    bad = []
    mirrors = [
        *home.glob("jobs/*/snapshots/run-*"),
        *home.glob("jobs/*/deploys/*.kept"),
        *home.glob("jobs/*/kept/run-*"),
    ]
    inside = {p for tree in mirrors for p in tree.rglob("*")}
    for path in [home, *home.rglob("*")]:
        if path in inside:
            continue
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            continue
        if stat.S_IMODE(mode) & 0o077:
            bad.append(f"{oct(stat.S_IMODE(mode))} {path.relative_to(home)}")
    return bad


@pytest.mark.parametrize("mask", [0o000, 0o002])
def test_every_file_in_the_home_is_private_whatever_the_umask(harness: Harness, mask: int) -> None:
    h = harness
    with umask(mask):
        r = repo(h)
        (r / "train.py").write_text((r / "train.py").read_text() + "# uncommitted\n")
        ck = h.tmp / "ck"
        ck.mkdir()
        hook = f"{sys.executable} -c pass"
        h.tc(
            "start", "--name", "p", "--cwd", str(r), "--grace", "5",
            "--set", "snapshot=git", "--set", f"checkpoint={ck}/ckpt-*.txt",
            "--set", "log_max_size=4KiB", "--set", "log_keep=2",
            "--set", f"on_exit={hook}", "--set", f"on_start={hook}",
            "--", sys.executable, "-u", "train.py", str(ck), "chatty",
            check=True,
        )  # fmt: skip
        wait_for(lambda: progress(h, "p", 1) >= 3, 30, "progress")
        h.tc("logs", "p", "-t", "-n", "1", check=True)
        version(r, 2)
        assert h.tc("deploy", "p", "--health", "30s", timeout=90).rc == 0
        # a job that needs a SIGKILL: its stacks are read first
        deaf = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)"
        h.tc("start", "--name", "deaf", "--", sys.executable, "-c", deaf, check=True)
        h.tc("start", "--name", "later", "--after", "deaf", "--", "true", check=True)
        h.tc("stop", "deaf", "--grace", "0.5", check=True)
        h.tc("stop", "p", check=True)
        h.tc("wait", "later", timeout=30)
    bad = _not_private(h.home)
    assert not bad, "\n".join(bad)
    # the sweep saw what it is about (else it proves nothing)
    jobs = h.home / "jobs"
    for made in [
        "p/code/run-1.diff",
        "p/logs/run-1.progress.jsonl",
        "p/logs/run-1.log.times",
        "p/snapshots/run-1",
        "p/deploys",
        "deaf/stacks/run-1.before-kill.json",
    ]:
        assert (jobs / made).exists(), made
