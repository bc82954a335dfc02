"""Lifecycle under faults and races: a job is never lost, never relaunched behind a stop,
and always stoppable, even with a dead or mute supervisor, a full or read-only disk.

Races are driven deterministically: a test-only fault hook in the supervisor's start-up
($TRAINCTL_TEST_FAULT), the job lock held by the test itself, or a tree that makes a
window last a second. Every process is real; a tmpfs or read-only bind mount is a real
file system (those tests need root and skip without it).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TRAINCTL, TREES, Harness, alive, marked, wait_for
from tests.helpers import frozen_supervisor, one_line_error, stop_and_check


def _kill_supervisor(h: Harness, name: str, *, may_be_gone: bool = False) -> None:
    """SIGKILL the job's supervisor through a pidfd (ours: it carries the test's marker,
    and pid + start time are checked first). ``may_be_gone``: it may have finished its
    work and exited on its own just before (a race the caller allows)."""
    sup = h.state(name)["supervisor"]
    if not alive(sup["pid"], sup["start_ticks"]):
        assert may_be_gone, "the supervisor is already gone"
        return
    try:
        fd = os.pidfd_open(sup["pid"])
    except ProcessLookupError:
        assert may_be_gone, "the supervisor is already gone"
        return
    # the pidfd holds this pid: a recycled one would be another process, so check again
    if alive(sup["pid"], sup["start_ticks"]):
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    os.close(fd)
    wait_for(lambda: not alive(sup["pid"], sup["start_ticks"]), what="supervisor death")


def _ours_alive(h: Harness) -> list[int]:
    """Live processes this test started (by its marker), bystanders aside."""
    return [pid for pid, (_, bystander) in marked(h.mark).items() if not bystander]


# ---------------------------------------------------------------- atomic start


@pytest.mark.parametrize("fault", ["exit-after-spawn", "enospc-recording-main"])
def test_a_failed_start_leaves_nothing_running(harness: Harness, fault: str) -> None:
    h = harness
    env = {**h.env, "TRAINCTL_TEST_FAULT": fault}
    ready = h.tmp / "ready"
    res = h.tc(
        "start",
        "--name",
        "f",
        "--env",
        f"TREE_READY={ready}",
        "--",
        sys.executable,
        str(TREES / "forker.py"),
        env=env,
    )
    assert res.rc == 1, res
    assert len(res.err.strip().splitlines()) == 1
    time.sleep(0.3)  # anything main could have forked in that moment would show by now
    assert not _ours_alive(h)
    st = h.tc("status", "f", "--json")
    if fault == "exit-after-spawn":  # the run was recorded before main existed: it says so
        assert st.rc == 3, st
        doc = st.json()
        assert isinstance(doc, dict)
        assert doc["state"] == "failed"
        assert "start failed" in (doc["error"] or "")
    else:  # the supervisor killed main itself and put the job directory back
        assert st.rc == 2
        assert "no job named" in st.err


# ---------------------------------------------------------------- stop wins


def test_a_stop_during_the_cleanup_after_main_exited_is_never_undone(harness: Harness) -> None:
    h = harness
    # main fails at once, leaving a child that needs 1.5 s to exit on SIGTERM: the
    # supervisor's cleanup stop lasts that long, and a user's stop arrives within it
    script = (
        "import os, signal, sys, time\n"
        "if os.fork() == 0:\n"
        "    signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.5), os._exit(0)))\n"
        f"    open({str(h.tmp / 'child')!r}, 'w').close()\n"
        "    while True: time.sleep(1)\n"
        f"while not os.path.exists({str(h.tmp / 'child')!r}): time.sleep(0.01)\n"
        "sys.exit(3)\n"
    )
    h.tc(
        "start",
        "--name",
        "r",
        "--set",
        "restart=on-failure",
        "--set",
        "restart_backoff=0.2",
        "--grace",
        "10",
        "--",
        sys.executable,
        "-c",
        script,
        check=True,
    )
    wait_for(lambda: any(e["event"] == "stopping" for e in h.events("r")), 20, "cleanup to start")
    res = h.tc("stop", "r", "--json")
    assert res.rc == 0, res
    time.sleep(1.0)  # well past the backoff: a relaunch would have happened by now
    st = h.state("r")
    assert st["run"] == 1, "the restart policy relaunched the job behind a user's stop"
    assert st["phase"] == "stopped"
    assert not h.job_pids("r")


def test_a_stop_that_waited_for_a_start_goes_through_the_new_supervisor(
    harness: Harness,
) -> None:
    h = harness
    args = ("--set", "restart=on-failure", "--set", "restart_backoff=0.2", "--grace", "5")
    h.tc("start", "--name", "s", *args, "--", "sleep", "600", check=True)
    assert h.tc("stop", "s").rc == 0  # run 1 is over; no supervisor now
    jdir = h.home / "jobs" / "s"
    fd = os.open(jdir / "lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the test plays `start`: it holds the job lock
    stopper = subprocess.Popen(
        [*TRAINCTL, "stop", "s", "--json"], env=h.env, stdout=subprocess.PIPE, text=True
    )
    time.sleep(0.5)  # it found no supervisor and waits for the lock
    assert stopper.poll() is None
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from trainctl.launcher.config import load_config\n"
        "from trainctl.launcher.ops.start import start_locked\n"
        "from trainctl.supervisor.model import state\n"
        "home = Path(sys.argv[1]); jdir = home / 'jobs' / 's'\n"
        "start_locked(home, jdir, state.read_spec(jdir), load_config())\n"
    )
    subprocess.run([sys.executable, "-c", code, str(h.home)], env=h.env, check=True)
    assert h.state("s")["run"] == 2
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    out, _ = stopper.communicate(timeout=60)
    assert stopper.returncode == 0, out
    time.sleep(1.0)  # past the backoff: a supervisor-less stop would have been undone
    st = h.state("s")
    assert (st["run"], st["phase"]) == (2, "stopped")
    assert not h.job_pids("s")


# ---------------------------------------------------------------- what stop trusts


def test_supervisorless_stop_finds_a_scrubbed_escaper_by_the_snapshot(harness: Harness) -> None:
    h = harness
    Path(h.env["TRAINCTL_CONFIG"]).write_text(
        "[start]\ncgroup = false\n[supervisor]\nsnapshot_interval_s = 0.2\n"
    )
    h.start_tree("sc", "scrubbed_env.py", grace=1)
    # wait until the snapshot lists the escaper (its environment holds no marker)
    wait_for(lambda: len(h.state("sc")["members"]) >= 2, 20, "the member snapshot")
    _kill_supervisor(h, "sc")
    doc = stop_and_check(h, "sc")  # fails if the daemon (SIGTERM ignored) survives
    assert doc["report"]["by_net"].get("snapshot", 0) >= 1
    assert doc["report"]["killed"] >= 1


def test_an_escaper_recorded_before_a_supervisor_crash_is_stopped_and_not_called_proof(
    harness: Harness,
) -> None:
    """Signals mode, the default snapshot interval: main's helper escapes at start-up
    (setsid, double fork, scrubbed environment), the supervisor is SIGKILLed, main exits.
    The state file still names the escaper; stop kills it and exits 6 (not 0): without a
    cgroup and a supervisor nothing proves that nothing else escaped."""
    h = harness
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[start]\ncgroup = false\n")
    gate = h.tmp / "main.exit"
    flag = h.tmp / "escaped"
    escaper = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"open({str(flag)!r}, 'w').close()\ntime.sleep(600)\n"
    )
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        keep = {k: v for k, v in os.environ.items() if k.startswith('TCTEST_')}\n"
        f"        os.execve(sys.executable, [sys.executable, '-c', {escaper!r}], keep)\n"
        "    os._exit(0)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
    )
    h.tc("start", "--name", "e", "--grace", "1", "--", sys.executable, "-c", code, check=True)
    wait_for(flag.exists, 20, "the escaper")
    # the supervisor records it within moments of its start (its first ticks come early),
    # not only at its first 3 s snapshot interval
    wait_for(lambda: len(h.state("e")["members"]) >= 2, 2.5, "the escaper on record")
    _kill_supervisor(h, "e")
    gate.touch()  # main exits, with no supervisor to see it
    assert _ours_alive(h), "the escaper runs"
    status = h.tc("status", "e", "--json").json()
    assert isinstance(status, dict)
    assert status["members"] >= 1  # the recorded escaper counts
    stop = h.tc("stop", "e", "--json")
    assert stop.rc == 6, stop
    doc = stop.json()
    assert isinstance(doc, dict)
    assert doc["ok"] is True
    assert "no cgroup and no supervisor" in doc["report"]["unproven"]
    assert doc["report"]["killed"] >= 1  # it ignored SIGTERM
    wait_for(lambda: not _ours_alive(h), 20, "the escaper to be gone")
    human = h.tc("stop", "e")
    assert human.rc == 0  # recorded stopped now: nothing left to prove
    assert "nothing to stop" in human.out


def test_a_state_from_another_boot_is_never_acted_on_by_pid(harness: Harness) -> None:
    h = harness
    by = h.bystander("forker.py")
    start = int(Path(f"/proc/{by.pid}/stat").read_text().rpartition(")")[2].split()[19])
    h.tc("start", "--name", "old", "--", "sleep", "600", check=True)
    assert h.tc("stop", "old").rc == 0
    path = h.home / "jobs" / "old" / "state.json"
    doc = json.loads(path.read_text())
    # as if the machine rebooted and the old main's (pid, start time) now names a stranger
    doc.update(
        phase="running",
        boot_id=str(uuid.uuid4()),
        main={"pid": by.pid, "start_ticks": start},
        pgid=by.pid,
        sid=by.pid,
        marker=uuid.uuid4().hex,
        members=[],
        cgroup=None,
    )
    path.write_text(json.dumps(doc))
    st = h.tc("status", "old", "--json")
    assert st.rc == 4
    assert st.json()["previous_boot"] is True  # type: ignore[index]
    assert "previous boot" in h.tc("status", "old").out
    res = h.tc("stop", "old")
    assert res.rc == 0
    assert "nothing to stop" in res.out
    h.assert_bystanders_alive()


def test_a_mute_supervisor_is_reported_and_stop_force_gets_past_it(harness: Harness) -> None:
    h = harness
    h.start_tree("m", "forker.py", grace=1)
    # Mute: stopped (SIGSTOP, so it cannot bind its socket again) with its socket gone.
    sup = h.state("m")["supervisor"]
    fd = os.pidfd_open(sup["pid"])  # our own test job's supervisor, verified next
    assert alive(sup["pid"], sup["start_ticks"])
    signal.pidfd_send_signal(fd, signal.SIGSTOP)
    os.close(fd)
    (h.home / "jobs" / "m" / "control.sock").unlink()
    res = h.tc("stop", "m", timeout=60)
    assert res.rc == 1
    assert "--force" in res.err
    assert len(res.err.strip().splitlines()) == 1
    assert h.job_pids("m"), "a refused stop changed something"
    doc = stop_and_check(h, "m", "--force")
    assert doc["via"] == "direct"


def test_a_frozen_supervisor_that_takes_the_stop_is_mute_in_seconds(harness: Harness) -> None:
    """Stopped with its socket in place, the supervisor's listen queue still takes the
    connection and the request: `stop` waited its whole budget (grace, kill, GPUs) in
    silence, and `--force` with it. The wait now pings on a connection of its own."""
    h = harness
    h.tc("start", "--name", "f", "--grace", "1", "--", "sleep", "600", check=True)
    with frozen_supervisor(h, "f"):
        t0 = time.monotonic()
        res = h.tc("stop", "f", "--grace", "120", timeout=100)
        took = time.monotonic() - t0
        assert res.rc == 1, res
        assert "alive but not answering" in res.err, res.err
        assert "--force" in res.err
        assert len(res.err.strip().splitlines()) == 1
        assert took < 60, took  # generous: a hang, not a speed target (~7 s here)
        assert h.job_pids("f"), "a refused stop changed something"
        doc = stop_and_check(h, "f", "--force")
        assert doc["via"] == "direct"


def test_a_deleted_supervisor_lock_does_not_make_status_lie(harness: Harness) -> None:
    h = harness
    h.start_tree("l", "forker.py", grace=1)
    (h.home / "jobs" / "l" / "supervisor.lock").unlink()
    st = h.tc("status", "l", "--json")
    assert st.rc == 0
    doc = st.json()
    assert isinstance(doc, dict)
    assert doc["state"] == "running"
    assert stop_and_check(h, "l")["via"] == "supervisor"


PING = (
    "import sys\nfrom pathlib import Path\nfrom trainctl.supervisor.model import control\n"
    "assert control.request(Path(sys.argv[1]), {'op': 'ping'}, timeout_s=20)['ok']\n"
)


def test_the_supervisor_ignores_sighup_and_keeps_the_exit_code(harness: Harness) -> None:
    h = harness
    flag = h.tmp / "go"
    script = (
        f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.02)\n"
        "raise SystemExit(5)\n"
    )
    h.tc("start", "--name", "sig", "--", sys.executable, "-c", script, check=True)
    # its event loop serves the control socket once its signal handlers are in place
    subprocess.run(
        [sys.executable, "-c", PING, str(h.home / "jobs" / "sig")], env=h.env, check=True
    )
    sup = h.state("sig")["supervisor"]
    fd = os.pidfd_open(sup["pid"])  # ours (test marker), verified below
    assert alive(sup["pid"], sup["start_ticks"])
    for _ in range(3):
        signal.pidfd_send_signal(fd, signal.SIGHUP)  # a closing terminal
    os.close(fd)
    time.sleep(0.3)
    assert alive(sup["pid"], sup["start_ticks"])
    flag.touch()
    assert h.tc("wait", "sig", "--timeout", "30").rc == 5
    assert sum(e["event"] == "supervisor_signal_ignored" for e in h.events("sig")) >= 1


def test_rm_force_never_deletes_a_job_that_still_runs(harness: Harness) -> None:
    h = harness
    h.start_tree("c", "setsid_daemon.py", grace=1)
    _kill_supervisor(h, "c")
    path = h.home / "jobs" / "c" / "state.json"
    good = path.read_text()
    path.write_text("{not json")
    res = h.tc("rm", "c", "--force")
    assert res.rc == 1
    assert "still running" in res.err
    assert (h.home / "jobs" / "c").is_dir()
    assert _ours_alive(h)
    path.write_text(good)  # repaired: now it can be stopped, and then removed
    stop_and_check(h, "c")
    assert h.tc("rm", "c").rc == 0


def test_no_empty_cgroup_after_a_supervisorless_stop(mode_harness: Harness) -> None:
    h = mode_harness
    h.start_tree("g", "forker.py", grace=1)
    group = h.state("g")["cgroup"]
    _kill_supervisor(h, "g")
    stop_and_check(h, "g")
    if group is not None:
        assert not Path(group).exists()


# ---------------------------------------------------------------- full and read-only disks


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True, check=False).returncode == 0


@pytest.fixture
def small_home(harness: Harness) -> Iterator[Path]:
    """TRAINCTL_HOME on a 2 MiB tmpfs (root only)."""
    home = harness.home
    home.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not _mount(
        "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(home)
    ):
        pytest.skip("needs root and tmpfs mounts")
    yield home
    subprocess.run(["umount", "-l", str(home)], check=False)


def _fill(path: Path) -> None:
    with open(path / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


@pytest.mark.parametrize("supervisor", ["alive", "dead"])
def test_stop_works_on_a_full_disk(harness: Harness, small_home: Path, supervisor: str) -> None:
    h = harness
    h.start_tree("full", "forker.py", grace=1)
    if supervisor == "dead":
        _kill_supervisor(h, "full")
    _fill(small_home)
    before = h.job_pids("full")
    res = h.tc("stop", "full", "--json", timeout=90)
    assert res.rc == 0, res
    assert not h.job_pids("full")
    assert all(not alive(p, s) for p, s in before.items())
    doc = res.json()
    assert isinstance(doc, dict)
    assert "No space left" in doc["report"].get("persist_error", ""), doc["report"]
    (small_home / "filler").unlink()


def test_stop_works_on_a_read_only_home_with_a_dead_supervisor(harness: Harness) -> None:
    h = harness
    h.start_tree("ro", "forker.py", grace=1)
    _kill_supervisor(h, "ro")
    home = str(h.home)
    if os.geteuid() != 0 or not _mount("--bind", home, home):
        pytest.skip("needs root and bind mounts")
    try:
        if not _mount("-o", "remount,ro,bind", home):
            pytest.skip("cannot remount read-only here")
        before = h.job_pids("ro")
        res = h.tc("stop", "ro")
        assert res.rc == 0, res
        assert "not recorded" in res.err
        assert all(not alive(p, s) for p, s in before.items())
    finally:
        subprocess.run(["umount", "-l", home], check=False)


# ---------------------------------------------------------------- the supervisor killed


def test_a_supervisor_killed_during_the_backoff_never_relaunches(harness: Harness) -> None:
    h = harness
    args = ("--set", "restart=on-failure", "--set", "restart_backoff=2")
    h.tc("start", "--name", "bk", *args, "--", "sh", "-c", "exit 3", check=True)
    wait_for(lambda: h.state("bk").get("restart_at") is not None, what="backoff")
    _kill_supervisor(h, "bk")
    time.sleep(2.5)  # past the backoff: nothing may have relaunched the job
    st = h.state("bk")
    assert st["run"] == 1
    assert not h.job_pids("bk")
    status = h.tc("status", "bk", "--json")
    doc = status.json()
    assert isinstance(doc, dict)
    assert doc["state"] == "lost", doc
    assert doc["members"] == 0
    stop = h.tc("stop", "bk")
    assert stop.rc == 0, stop
    assert h.state("bk")["phase"] == "stopped"
    after = h.tc("status", "bk", "--json").json()
    assert isinstance(after, dict)
    assert after["restart_in_s"] is None  # no restart is coming: not "0.0"
    assert h.state("bk")["restart_at"] is None
    # the name is usable again, and the next run starts from run 2
    h.tc("start", "--name", "bk", "--", "sleep", "600", check=True)
    assert h.state("bk")["run"] == 2
    assert h.tc("stop", "bk").rc == 0


def test_a_supervisor_killed_in_the_middle_of_a_stop_is_finished_by_the_cli(
    harness: Harness,
) -> None:
    h = harness
    # a child that needs 1.5 s to exit on SIGTERM keeps the supervisor's stop busy
    script = (
        "import os, signal, time\n"
        "if os.fork() == 0:\n"
        "    signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.5), os._exit(0)))\n"
        f"    open({str(h.tmp / 'child')!r}, 'w').close()\n"
        "    while True: time.sleep(1)\n"
        "signal.signal(signal.SIGTERM, lambda *a: os._exit(0))\n"
        "while True: time.sleep(1)\n"
    )
    h.tc("start", "--name", "mid", "--", sys.executable, "-c", script, check=True)
    wait_for((h.tmp / "child").exists, what="the child")
    stopper = subprocess.Popen(
        [*TRAINCTL, "stop", "mid", "--grace", "20", "--json"],
        env=h.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: any(e["event"] == "signal_sent" for e in h.events("mid")), what="stop")
    _kill_supervisor(h, "mid")
    out, err = stopper.communicate(timeout=60)
    assert stopper.returncode == 0, (out, err)
    assert not h.job_pids("mid")
    st = h.state("mid")
    assert st["phase"] == "stopped", st
    assert h.tc("status", "mid").rc == 3


# A main and its child that both ignore SIGTERM: the stop lasts its whole grace, then kills.
_DEAF_TREE = (
    "import os, signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "if os.fork() == 0:\n"
    "    while True: time.sleep(1)\n"
    "open(os.environ['READY'], 'w').close()\n"
    "while True: time.sleep(1)\n"
)


@pytest.mark.parametrize("kill_after_s", [0.0, 0.3, 1.0, 2.2, 3.2])
def test_a_stop_survives_its_supervisor_dying_at_any_point(
    harness: Harness, kill_after_s: float
) -> None:
    """Issue 44 §1: the supervisor SIGKILLed right after the request, mid-grace, at the
    grace's end and during the escalation: the running stop takes over, finishes within
    the grace it was given (not a fresh one), exits 0 and says so once."""
    h = harness
    ready = h.tmp / "ready"
    env = {**h.env, "READY": str(ready)}
    h.tc("start", "--name", "deaf", "--", sys.executable, "-c", _DEAF_TREE, env=env, check=True)
    wait_for(ready.exists, what="the job")
    wait_for(lambda: len(h.job_pids("deaf")) == 2, what="both members")
    began = time.monotonic()
    # no config file, as a user has it: the request goes out before the verb loads
    # (launcher/early.py), the path the regression was on
    plain = {k: v for k, v in h.env.items() if k != "TRAINCTL_CONFIG"}
    stopper = subprocess.Popen(
        [*TRAINCTL, "stop", "deaf", "--grace", "3"],
        env=plain,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(kill_after_s)
    _kill_supervisor(h, "deaf", may_be_gone=True)  # at 3.2 s it may have just finished
    out, err = stopper.communicate(timeout=60)
    took = time.monotonic() - began
    assert stopper.returncode == 0, (out, err)
    assert "Traceback" not in err, err
    assert "internal error" not in err, err
    assert not h.job_pids("deaf")
    assert h.state("deaf")["phase"] == "stopped"
    assert h.tc("status", "deaf").rc == 3
    # told once, and only when it did take over
    assert err.count("supervisor died during the stop") <= 1, err
    # the grace was not given twice (3 s asked; generous for a busy machine)
    assert took < 3 + 6, took
    h.tc("start", "--name", "deaf", "--", sys.executable, "-c", _DEAF_TREE, env=env, check=True)
    assert h.tc("stop", "deaf", "--grace", "0").rc == 0


@pytest.mark.parametrize("head_start_s", [0.0, 0.05, 0.3])
def test_restart_racing_stop_always_ends_stopped(harness: Harness, head_start_s: float) -> None:
    """Whichever comes first, a stop that returned 0 leaves nothing running, even a run
    that a racing restart started after the stop had begun."""
    h = harness
    h.start_tree("rs", "forker.py", grace=2)
    restart = subprocess.Popen(
        [*TRAINCTL, "restart", "rs"], env=h.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    time.sleep(head_start_s)
    stop = h.tc("stop", "rs", timeout=90)
    restart.communicate(timeout=90)
    assert stop.rc == 0, stop
    time.sleep(0.3)
    st = h.state("rs")
    assert st["phase"] == "stopped", st
    assert not h.job_pids("rs")
    assert h.tc("status", "rs").rc == 3


def test_queueing_on_a_full_disk_is_one_line_and_queues_nothing(
    harness: Harness, small_home: Path
) -> None:
    h = harness
    h.tc("start", "--name", "a", "--grace", "1", "--", "sleep", "600", check=True)
    (small_home / "queue").mkdir(mode=0o700)
    _fill(small_home)
    res = h.tc("start", "--name", "b", "--after", "a:any", "--", "true")
    one_line_error(res, 1, "nothing queued")
    assert "No space left" in res.err
    assert not (small_home / "queue" / "b.json").exists()
    (small_home / "filler").unlink()
    assert h.tc("stop", "a").rc == 0
