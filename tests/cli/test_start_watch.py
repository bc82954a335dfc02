"""`start` watches a new run for its first moments (issue 44 §6): `trainctl start --
python3 nosuch.py` printed `started`, exit 0. Now a run that ends within the watch is
reported with its cause and last lines, and start exits 1; --no-wait returns at exec."""

from __future__ import annotations

import sys
import time

import pytest

from tests.conftest import Harness


@pytest.fixture
def watching(harness: Harness) -> Harness:
    """The harness with start's default watch (the suite turns it off for speed)."""
    harness.env.pop("TRAINCTL_START_WATCH", None)
    return harness


def test_a_run_that_dies_at_once_is_reported_with_its_cause(watching: Harness) -> None:
    h = watching
    res = h.tc("start", "--name", "ns", "--", sys.executable, "nosuch.py")
    assert res.rc == 1, res
    assert "started ns run 1" in res.out
    assert "ns run 1 ended at once: exit code 2" in res.err
    assert "nosuch.py': [Errno 2] No such file or directory" in res.err  # its last line
    doc = h.tc("start", "--name", "ns2", "--json", "--", sys.executable, "nosuch.py").json()
    assert (doc["state"], doc["exit_code"]) == ("failed", 2)
    crash = "import sys; sys.exit('cannot load the model')"
    res = h.tc("start", "--name", "ns3", "--", sys.executable, "-c", crash)
    assert res.rc == 1
    assert "cannot load the model" in res.err


def test_a_run_that_lives_or_ends_cleanly_is_not_a_failure(watching: Harness) -> None:
    h = watching
    t0 = time.monotonic()
    res = h.tc("start", "--name", "long", "--", "sleep", "600", check=True)
    took = time.monotonic() - t0
    assert "ended" not in res.out + res.err
    assert 1.4 < took < 15  # the watch, and no more than a hang-catching bound
    res = h.tc("start", "--name", "quick", "--", "true", check=True)
    assert "quick run 1 already ended: clean exit (code 0)" in res.out
    h.tc("stop", "long", check=True)


def test_no_wait_and_the_watch_setting(watching: Harness) -> None:
    h = watching
    t0 = time.monotonic()
    res = h.tc("start", "--name", "nw", "--no-wait", "--", sys.executable, "nosuch.py")
    assert res.rc == 0  # returned at exec, as scripts that start many jobs want
    assert "ended" not in res.err
    assert time.monotonic() - t0 < 1.4 + 5
    env = {**h.env, "TRAINCTL_START_WATCH": "soon"}
    res = h.tc("start", "--name", "bad", "--", "true", env=env)
    assert res.rc == 2
    assert "TRAINCTL_START_WATCH" in res.err
    assert not (h.home / "jobs" / "bad").exists()  # refused before anything started


def test_a_restart_policy_that_restarts_it_is_said_but_not_a_failure(watching: Harness) -> None:
    h = watching
    res = h.tc(
        "start", "--name", "rs", "--set", "restart=on-failure", "--set", "max_restarts=1",
        "--set", "restart_backoff=30s", "--", sys.executable, "-c", "raise SystemExit(4)",
    )  # fmt: skip
    assert res.rc == 0, res
    assert "the restart policy starts it again" in res.err
    h.tc("stop", "rs", check=True)
