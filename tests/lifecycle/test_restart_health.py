"""`restart` watches the new run: broken code that dies at once is a failed restart."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import TRAINCTL, Harness


def test_a_restart_into_broken_code_exits_1_with_the_cause(harness: Harness) -> None:
    h = harness
    script = h.tmp / "train.py"
    script.write_text("import time\nprint('training', flush=True)\ntime.sleep(600)\n")
    h.tc("start", "--name", "dep", "--cwd", str(h.tmp), "--", sys.executable, "train.py",
         check=True)  # fmt: skip
    script.write_text("def broken(:\n    pass\n")  # the deploy that introduced a SyntaxError
    pid = h.state("dep")["main"]["pid"]
    refused = h.tc("restart", "dep", timeout=60)  # the look at the code: nothing stopped
    assert refused.rc == 1, refused
    assert refused.err.splitlines() == [
        f"trainctl: error: job dep: the new code would not start: train.py:1: SyntaxError: "
        f"invalid syntax; nothing was stopped (looked at by {sys.executable}; --no-check "
        "restarts anyway)"
    ]
    assert (h.state("dep")["run"], h.state("dep")["main"]["pid"]) == (1, pid)
    assert h.tc("restart", "dep", "--dry-run").rc == 1
    res = h.tc("restart", "dep", "--no-check", timeout=60)  # the health window's turn
    assert res.rc == 1, (res.out, res.err)
    assert "started dep run 2" in res.out
    first = res.err.splitlines()[0]
    assert first.startswith("trainctl: dep run 2 died within the 3 s health window: exit code 1")
    assert "SyntaxError" in first
    assert "  | " in res.err  # its last log lines
    st = h.tc("status", "dep", "--json").json()
    assert isinstance(st, dict)
    assert st["state"] == "failed"
    assert st["cause"]["reason"].startswith("SyntaxError")


def test_a_healthy_restart_says_so_and_json_carries_the_window(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "ok", "--", "sleep", "600", check=True)
    doc = h.tc("restart", "ok", "--health", "0.5", "--json", check=True, timeout=60).json()
    assert isinstance(doc, dict)
    assert doc["health"]["ok"] is True
    assert doc["health"]["died"] is False
    assert doc["health"]["window_s"] == 0.5
    assert h.tc("restart", "ok", "--health", "0", check=True).out.count("health window") == 0
    h.tc("stop", "ok", check=True)


def test_restart_follow_streams_the_new_run(harness: Harness) -> None:
    h = harness
    script = h.tmp / "once.py"
    script.write_text("import os\nprint('hello from run', os.environ['TRAINCTL_RUN'])\n")
    h.tc("start", "--name", "fo", "--", sys.executable, str(script), check=True)
    h.tc("wait", "fo", "--timeout", "30")
    res = h.tc("restart", "fo", "--health", "0", "--follow", timeout=60)
    assert res.rc == 0, res.err
    assert "hello from run 2" in res.out


def test_spec_edits_show_in_status_and_restart_reload_takes_them(harness: Harness) -> None:
    h = harness
    spec = h.tmp / "job.toml"
    argv = f'["{sys.executable}", "-c", "import time; time.sleep(600)"]'
    spec.write_text(f'name = "sp"\nargv = {argv}\ngrace = "30s"\n')
    h.tc("start", "-c", str(spec), "--set", "total_steps=10", check=True)
    spec.write_text(f'name = "sp"\nargv = {argv}\ngrace = "45s"\n')
    st = h.tc("status", "sp", "--json").json()
    assert isinstance(st, dict)
    assert st["spec_changed"] == ["grace"]
    assert "SPEC CHANGED (job.toml edited: grace)" in h.tc("status", "sp").out
    kept = h.tc("restart", "sp", "--health", "0", check=True, timeout=90)
    assert "changed since the start (grace); this restart keeps the recorded spec" in kept.err
    recorded = json.loads((h.home / "jobs" / "sp" / "spec.json").read_text())
    assert recorded["stop"]["grace_s"] == 30.0
    assert h.tc("status", "sp", "--json").json()["spec_changed"] == ["grace"]  # type: ignore[index]
    h.tc("restart", "sp", "--reload", "--health", "0", check=True, timeout=90)
    recorded = json.loads((h.home / "jobs" / "sp" / "spec.json").read_text())
    assert recorded["stop"]["grace_s"] == 45.0
    assert recorded["watch"]["total_steps"] == 10  # the start's --set is kept
    assert h.tc("status", "sp", "--json").json()["spec_changed"] == []  # type: ignore[index]
    h.tc("stop", "sp", check=True)


def test_restart_reload_of_a_broken_file_stops_nothing(harness: Harness) -> None:
    h = harness
    spec = h.tmp / "job.toml"
    spec.write_text(
        f'name = "br"\nargv = ["{sys.executable}", "-c", "import time; time.sleep(600)"]\n'
    )
    h.tc("start", "-c", str(spec), check=True)
    pids = h.job_pids("br")
    spec.write_text('name = "br"\ngrace = "soon"\n')
    res = h.tc("restart", "br", "--reload")
    assert res.rc == 2
    assert "grace: 'soon' is not a duration" in res.err
    assert h.job_pids("br") == pids
    h.tc("stop", "br", check=True)


def test_two_restarts_at_once_both_succeed_and_name_the_run_that_replaced(
    harness: Harness,
) -> None:
    """The first restart's new run is replaced by the second's within its health window:
    that is not a failure of the first restart (it said "died ... stopped by restart")."""
    h = harness
    h.tc("start", "--name", "r", "--", "sleep", "600", check=True)
    procs = [
        subprocess.Popen(
            [*TRAINCTL, "restart", "r", "--health", "3"],
            env=h.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert h.state("r")["run"] == 3
    said = "".join(out + err for out, err in outs)
    # seen stopped by the second restart, or already replaced by its run 3
    assert "run 2 was stopped by another restart" in said or (
        "run 2 was replaced by run 3 (another restart)" in said
    ), said
    assert "died within" not in said
    h.tc("stop", "r", check=True)
