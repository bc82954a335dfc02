"""Real tools inside a job: tmux (a server that escapes and leads its panes' sessions) and
joblib/loky (worker processes plus two resource trackers). Each must stop cleanly with the
default order; stops that used to wait out the grace must not any more.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import TREES, Harness, wait_for
from tests.helpers import stop_and_check

pytestmark = pytest.mark.slow


def _tmux_job(h: Harness, out: Path) -> None:
    sock = h.tmp / "tmux.sock"
    pane = f"{sys.executable} {TREES / 'checkpointer.py'} {out} 0.5"
    script = (
        f"tmux -S {sock} -f /dev/null new-session -d -s t '{pane}' && "
        f"exec tmux -S {sock} wait-for never"
    )
    env = {**h.env, "TREE_READY": str(h.tmp / "pane.ready")}
    h.tc("start", "--name", "tm", "--grace", "20", "--", "bash", "-c", script, env=env, check=True)
    wait_for((h.tmp / "pane.ready").exists, 30, "the tmux pane to start")


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux not installed (apt-get install tmux)")
def test_tmux_pane_checkpoints_before_the_server_winds_down(harness: Harness) -> None:
    h = harness
    out = h.tmp / "out"
    out.mkdir()
    _tmux_job(h, out)
    doc = stop_and_check(h, "tm")
    report = doc["report"]
    # the server (an escaper that leads its panes' sessions) is a launcher: its pane got
    # SIGTERM and checkpointed; the server, signalled first, would have SIGHUPed it
    assert any("tmux" in lau["cmd"] for lau in report["launchers"]), report
    assert (out / "ckpt.done").exists()
    assert report["killed"] == 0


needs_joblib = pytest.mark.skipif(
    importlib.util.find_spec("joblib") is None, reason="joblib not installed (test extra)"
)

JOBLIB = """
import os, sys, time
from joblib import Parallel, delayed

def work(ready, i):
    open(f"{ready}.{os.getpid()}", "w").close()  # a worker is running a task
    time.sleep(3600)

Parallel(n_jobs=2, backend="loky")(delayed(work)(sys.argv[1], i) for i in range(4))
"""


@needs_joblib
@pytest.mark.parametrize("order", ["tree", "main"])
def test_joblib_loky_stops_without_the_grace_or_leaks(harness: Harness, order: str) -> None:
    h = harness
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    ready = h.tmp / "jl.ready"
    h.tc(
        "start",
        "--name",
        "jl",
        "--grace",
        "60",
        "--",
        sys.executable,
        "-c",
        JOBLIB,
        str(ready),
        check=True,
    )
    # Both workers are inside a task: the pool, its semaphores and their registration with
    # the resource trackers are all set up. (Killed while joblib is still creating them,
    # any program leaks them; that is not what this test is about.)
    wait_for(lambda: len(list(h.tmp.glob("jl.ready.*"))) >= 2, 60, "two running tasks")
    doc = stop_and_check(h, "jl", "--order", order)
    report = doc["report"]
    assert report["killed"] == 0, report["killed_procs"]
    assert report["total_s"] < 30  # not the 60 s grace
    if os.path.isdir("/dev/shm"):
        assert set(os.listdir("/dev/shm")) <= shm, "semaphores leaked in /dev/shm"
