"""Hardening: a SIGTERM to the supervisor, a deleted control socket, leftovers after a
natural exit, and state or spec files that contradict themselves."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from tests.conftest import Harness, alive, wait_for
from tests.helpers import one_line_error


def _signal_supervisor(h: Harness, name: str, sig: signal.Signals) -> dict:  # type: ignore[type-arg]
    sup = h.state(name)["supervisor"]
    fd = os.pidfd_open(sup["pid"])  # our own test job's supervisor, verified next
    try:
        assert alive(sup["pid"], sup["start_ticks"])
        signal.pidfd_send_signal(fd, sig)
    finally:
        os.close(fd)
    return sup  # type: ignore[no-any-return]


def test_sigterm_to_the_supervisor_runs_the_jobs_graceful_stop(harness: Harness) -> None:
    h = harness
    h.start_tree("ck", "checkpointer.py", str(h.tmp), "2", grace=10)
    time.sleep(0.5)  # the supervisor's signal handlers are in place once it serves
    sup = _signal_supervisor(h, "ck", signal.SIGTERM)  # an admin's `kill <pid>`
    wait_for(lambda: not alive(sup["pid"], sup["start_ticks"]), 30, "the supervisor to finish")
    assert (h.tmp / "ckpt.done").exists(), "the job did not get its graceful stop"
    st = h.tc("status", "ck", "--json").json()
    assert isinstance(st, dict)
    assert st["state"] == "stopped"
    assert st["cause"]["by"] == "SIGTERM"
    assert "SIGTERM to its supervisor" in st["cause"]["summary"]
    assert not h.job_pids("ck")
    assert any(e["event"] == "supervisor_signal_stops_job" for e in h.events("ck"))


def test_a_deleted_control_socket_is_bound_again(harness: Harness) -> None:
    h = harness
    h.start_tree("sock", "fanout.py", "2", "1")
    time.sleep(0.5)
    (h.home / "jobs" / "sock" / "control.sock").unlink()  # a tmp cleaner, a careless rm
    doc = h.tc("stop", "sock", "--json", check=True, timeout=30).json()  # no --force needed
    assert isinstance(doc, dict)
    assert doc["via"] == "supervisor"
    assert doc["ok"] is True
    assert any(e["event"] == "control_socket_rebound" for e in h.events("sock"))


def test_leftovers_of_a_natural_exit_are_named(harness: Harness) -> None:
    h = harness
    script = h.tmp / "leaves.py"
    script.write_text(
        "import subprocess, sys\n"
        "for i in range(4):\n"
        "    subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        "print('main done', flush=True)\n"
    )
    h.tc("start", "--name", "lv", "--", sys.executable, str(script), check=True)
    doc = h.tc("wait", "lv", "--json", timeout=60).json()
    assert isinstance(doc, dict)
    assert doc["cause"]["kind"] == "clean"
    assert doc["cause"]["leftovers"] == 4
    assert "4 leftover process(es) stopped" in doc["cause"]["summary"]
    text = h.tc("status", "lv").out
    # (a process already exiting when its command is read shows as [comm])
    assert "leftovers 4 process(es) outlived main, stopped: " in text
    assert "sleep" in text.split("outlived main, stopped: ")[1]
    [ev] = [e for e in h.events("lv") if e["event"] == "leftovers_cleaned"]
    assert ev["count"] == 4
    assert all("sleep" in c for c in ev["cmds"])


def test_a_stop_during_the_backoff_leaves_no_restart_time(harness: Harness) -> None:
    h = harness
    h.tc(
        "start", "--name", "bo", "--set", 'restart="on-failure"', "--set", "restart_backoff=30",
        "--", sys.executable, "-c", "raise SystemExit(3)", check=True,
    )  # fmt: skip
    wait_for(lambda: h.state("bo").get("restart_at") is not None, 30, "the backoff")
    h.tc("stop", "bo", check=True)
    st = h.tc("status", "bo", "--json").json()
    assert isinstance(st, dict)
    assert st["restart_in_s"] is None
    assert st["cause"]["kind"] == "stopped"


def test_a_state_that_started_before_this_boot_is_untrusted(harness: Harness) -> None:
    h = harness
    h.start_tree("old", "fanout.py", "1", "1")
    h.tc("stop", "old", check=True)
    path = h.home / "jobs" / "old" / "state.json"
    doc = json.loads(path.read_text())
    doc["started_at"] = 1_000_000.0  # 1970, yet the boot id says this boot
    path.write_text(json.dumps(doc))
    one_line_error(h.tc("status", "old"), 4, "started before this boot began")


def test_spec_file_errors_name_the_file_and_line(harness: Harness) -> None:
    h = harness
    bad_name = h.tmp / "name.toml"
    bad_name.write_text('argv = ["sleep", "1"]\nname = "../x"\n')
    one_line_error(h.tc("start", "-c", str(bad_name)), 2, f"{bad_name}:2: name: invalid job name")
    bad_cwd = h.tmp / "cwd.toml"
    bad_cwd.write_text('name = "x"\nargv = ["sleep", "1"]\ncwd = "nowhere"\n')
    res = h.tc("start", "-c", str(bad_cwd))
    one_line_error(res, 2, f"{bad_cwd}:3: cwd: directory {h.tmp / 'nowhere'} does not exist")
    assert not (h.home / "jobs" / "x").exists()


def test_status_sees_an_entry_script_edit_at_once(harness: Harness) -> None:
    h = harness
    script = h.tmp / "train.py"
    script.write_text("import time\ntime.sleep(600)\n")
    h.tc("start", "--name", "dr", "--cwd", str(h.tmp), "--", sys.executable, "train.py", check=True)
    wait_for(lambda: h.state("dr").get("drift_checked_at") is not None, 30, "a first check")
    script.write_text("import time\ntime.sleep(601)\n")  # `scp` of new code, just now
    st = h.tc("status", "dr", "--json").json()
    assert isinstance(st, dict)
    assert st["code_changed"] == ["train.py edited"]
    h.tc("stop", "dr", check=True)
