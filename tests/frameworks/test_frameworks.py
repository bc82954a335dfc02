"""Real tools inside a job: tmux (a server that escapes and leads its panes' sessions) and
joblib/loky (worker processes plus two resource trackers). Each must stop cleanly with the
default order; stops that used to wait out the grace must not any more.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
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


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux not installed (apt-get install tmux)")
def test_work_handed_to_a_foreign_tmux_server_is_never_called_stopped(
    mode_harness: Harness,
) -> None:
    """A tmux server that ran before the job (ours, on a private socket) gets the job's
    training through `tmux -S SOCK new-session -d`; the job then waits in `tmux wait-for`.
    The training is outside every net: status says so, and stop never claims proof."""
    h = mode_harness
    sock = h.tmp / "foreign.sock"
    env = {**h.env, "TCTEST_BYSTANDER": "1"}  # the server and its panes are bystanders
    subprocess.run(
        ["tmux", "-S", str(sock), "-f", "/dev/null", "new-session", "-d", "-s", "base",
         "sleep 600"], env=env, check=True, timeout=30,
    )  # fmt: skip
    try:
        ready = h.tmp / "training.ready"
        pane = f"touch {ready}; exec sleep 600"
        script = (
            f"tmux -S {sock} new-session -d -s train '{pane}' && exec tmux -S {sock} wait-for never"
        )
        h.tc("start", "--name", "ft", "--grace", "2", "--", "bash", "-c", script, check=True)
        wait_for(ready.exists, 30, "the training in the foreign server")
        wait_for(lambda: "OUTSIDE" in h.tc("status", "ft").out, 20, "status to say so")
        status = h.tc("status", "ft").out
        assert f"socket {sock}" in status
        assert "trainctl adopt NAME --tmux SESSION" in status
        doc = h.tc("status", "ft", "--json").json()
        assert isinstance(doc, dict)
        assert "tmux server outside the job" in doc["handed_off"][0]
        stop = h.tc("stop", "ft", "--json")
        assert stop.rc == 6, stop  # not 0: the handed-off training still runs
        report = stop.json()["report"]  # type: ignore[index]
        assert report["ok"] is True  # what the job itself ran is gone
        assert "tmux server outside the job" in report["unproven"]
        human = h.tc("stop", "ft")
        assert "nothing of the job is alive" not in human.out
        panes = subprocess.run(
            ["tmux", "-S", str(sock), "list-sessions", "-F", "#{session_name}"],
            env=env, capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
        assert "train" in panes.stdout.split()  # the training was not touched
    finally:
        subprocess.run(["tmux", "-S", str(sock), "kill-server"], env=env, timeout=30, check=False)
