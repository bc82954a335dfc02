"""Every tree in tests/trees is stopped with zero survivors, and its bystander lives on."""

from __future__ import annotations

import os
import signal

import pytest

from tests.conftest import Harness, alive, wait_for
from tests.helpers import stop_and_check

TREES = [
    # (tree, args, expect killed after grace)
    ("ignore_signals.py", (), True),
    ("setsid_daemon.py", (), True),
    ("setpgid_child.py", (), False),
    ("forker.py", (), True),
    ("zombies.py", (), False),
    ("ddp.py", (), False),
    ("fanout.py", ("20", "10"), False),
    ("scrubbed_env.py", (), True),
    ("stopped_child.py", (), False),
]


@pytest.mark.parametrize(("tree", "args", "killed"), TREES, ids=[t[0] for t in TREES])
def test_tree_fully_stopped(
    mode_harness: Harness, tree: str, args: tuple[str, ...], killed: bool
) -> None:
    h = mode_harness
    h.start_tree("job", tree, *args, grace=1.5)
    h.bystander(tree, *args)
    doc = stop_and_check(h, "job")
    report = doc["report"]
    assert report["found"] >= 2
    assert (report["killed"] > 0) == killed, report
    assert (report["held"] > 0) == (h.settle_s > 0), report  # the path the mode is about
    st = h.tc("status", "job", "--json")
    assert st.rc == 3
    assert st.json()["state"] == "stopped"  # type: ignore[index]


def test_escaped_members_are_reported(harness: Harness) -> None:
    h = harness
    h.start_tree("d", "setsid_daemon.py")
    ps = h.tc("ps", "d", "--json", check=True).json()
    assert isinstance(ps, list)
    escaped = [r for r in ps if r["escaped"]]
    assert len(escaped) == 1
    assert "marker" in escaped[0]["nets"]
    doc = stop_and_check(h, "d")
    assert doc["report"]["escaped"] == 1


def test_graceful_checkpoint_completes_within_grace(harness: Harness) -> None:
    h = harness
    sigs = h.tmp / "signals.txt"
    h.start_tree(
        "ck", "checkpointer.py", str(h.tmp), "2", extra=("--env", f"TREE_SIGNALS={sigs}"), grace=5
    )
    doc = stop_and_check(h, "ck", "--grace", "5")
    assert (h.tmp / "ckpt.done").exists(), "checkpoint not completed"
    assert not (h.tmp / "ckpt.tmp").exists()
    assert doc["report"]["killed"] == 0
    assert doc["exit_code"] == 0
    assert sigs.read_text().count("SIGTERM") == 1


def test_slow_checkpoint_is_killed_after_short_grace(harness: Harness) -> None:
    h = harness
    h.start_tree("slow", "checkpointer.py", str(h.tmp), "60", grace=1)
    doc = stop_and_check(h, "slow")
    assert not (h.tmp / "ckpt.done").exists()
    assert (h.tmp / "ckpt.tmp").exists()  # it had started writing: it did get SIGTERM
    assert doc["report"]["killed"] >= 1
    assert doc["exit_code"] == 128 + signal.SIGKILL


@pytest.mark.parametrize("tree", ["setsid_daemon.py", "ignore_signals.py", "forker.py"])
def test_stop_after_supervisor_was_sigkilled(mode_harness: Harness, tree: str) -> None:
    h = mode_harness
    h.start_tree("orphaned", tree, grace=1)
    h.bystander(tree)
    sup = h.state("orphaned")["supervisor"]
    assert alive(sup["pid"], sup["start_ticks"])
    # We started this supervisor (it carries our test marker); verified by pid + start time.
    fd = os.pidfd_open(sup["pid"])
    signal.pidfd_send_signal(fd, signal.SIGKILL)
    os.close(fd)
    wait_for(lambda: not alive(sup["pid"], sup["start_ticks"]), what="supervisor death")
    st = h.tc("status", "orphaned", "--json")
    assert st.rc == 4
    assert st.json()["state"] == "lost"
    doc = stop_and_check(h, "orphaned")
    assert doc["via"] == "direct"
    again = h.tc("stop", "orphaned")
    assert again.rc == 0  # the run is recorded stopped: nothing is left to prove
    assert "nothing to stop" in again.out


def test_main_exit_cleans_up_leftovers(harness: Harness) -> None:
    h = harness
    # main exits at once, leaving a setsid'd daemon that ignores TERM behind
    script = (
        "import os,signal,time\n"
        "if os.fork()==0:\n"
        "  os.setsid(); signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"  open('{h.tmp}/left','w').close(); time.sleep(600)\n"
        f"while not os.path.exists('{h.tmp}/left'): time.sleep(0.01)\n"
        "raise SystemExit(7)\n"
    )
    h.tc("start", "--name", "ex", "--grace", "0.5", "--", "python3", "-c", script, check=True)
    w = h.tc("wait", "ex", "--timeout", "30")
    assert w.rc == 7
    st = h.state("ex")
    assert st["phase"] == "failed"
    assert st["exit_code"] == 7
    assert st["last_stop"]["killed"] == 1
    assert st["last_stop"]["reason"] == "main exited"
    assert not h.job_pids("ex")
