"""The restart policy: relaunch after a crash with backoff, until exhausted; stop cancels."""

from __future__ import annotations

import time

from tests.conftest import Harness, wait_for


def test_on_failure_restarts_then_gives_up(harness: Harness) -> None:
    h = harness
    res = h.tc(
        "start",
        "--name",
        "crash",
        "--set",
        "restart=on-failure",
        "--set",
        "max_restarts=2",
        "--set",
        "restart_backoff=0.2",
        "--",
        "sh",
        "-c",
        "echo run $TRAINCTL_RUN; sleep 0.2; exit 3",
    )
    assert res.rc == 0, res.err
    w = h.tc("wait", "crash", "--timeout", "60")
    assert w.rc == 3
    st = h.state("crash")
    assert st["run"] == 3
    assert st["restarts"] == 2
    assert st["phase"] == "failed"
    assert "restarts exhausted (2 of 2)" in st["error"]
    assert st["last_failure"]["run"] == 3  # the run it gave up on (issue 44 §5), not run 2
    for run in (1, 2, 3):  # each run has its own log, and knows its number
        assert h.tc("logs", "crash", "--run", str(run)).out == f"run {run}\n"
    events = (h.home / "jobs/crash/events.jsonl").read_text()
    assert events.count('"restart_scheduled"') == 2
    assert events.count('"relaunched"') == 2
    s = h.tc("status", "crash")
    assert "restarts 2" in s.out


def test_only_listed_exit_codes_restart(harness: Harness) -> None:
    h = harness
    h.tc(
        "start",
        "--name",
        "codes",
        "--set",
        "restart=on-failure",
        "--set",
        "restart_exit_codes=[5]",
        "--set",
        "restart_backoff=0.1",
        "--",
        "sh",
        "-c",
        "exit 3",
        check=True,
    )
    assert h.tc("wait", "codes", "--timeout", "30").rc == 3
    st = h.state("codes")
    assert st["run"] == 1
    assert "not in restart_exit_codes [5]" in st["error"]


def test_stop_during_backoff_cancels_the_restart(harness: Harness) -> None:
    h = harness
    h.tc(
        "start",
        "--name",
        "bo",
        "--set",
        "restart=on-failure",
        "--set",
        "restart_backoff=30",
        "--",
        "sh",
        "-c",
        "exit 1",
        check=True,
    )
    wait_for(lambda: h.state("bo").get("restart_at") is not None, what="backoff")
    st = h.tc("status", "bo", "--json").json()
    assert isinstance(st, dict)
    assert st["state"] == "starting"
    assert st["restart_in_s"] > 20
    stop = h.tc("stop", "bo")
    assert stop.rc == 0, stop.err
    assert "restart cancelled" in stop.out
    time.sleep(0.3)
    final = h.state("bo")
    assert final["phase"] == "stopped"
    assert final["run"] == 1
    assert final["restart_at"] is None


def test_clean_exit_and_user_stop_never_restart(harness: Harness) -> None:
    h = harness
    h.tc(
        "start",
        "--name",
        "ok",
        "--set",
        "restart=on-failure",
        "--set",
        "restart_backoff=0.1",
        "--",
        "true",
        check=True,
    )
    assert h.tc("wait", "ok", "--timeout", "30").rc == 0
    assert h.state("ok")["run"] == 1
    h.tc(
        "start",
        "--name",
        "st",
        "--set",
        "restart=on-failure",
        "--set",
        "restart_backoff=0.1",
        "--",
        "sleep",
        "600",
        check=True,
    )
    assert h.tc("stop", "st").rc == 0
    time.sleep(0.5)
    assert h.state("st")["run"] == 1
    assert h.state("st")["phase"] == "stopped"
