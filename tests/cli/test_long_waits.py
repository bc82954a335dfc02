"""Long waits say how they go (a stop's grace, a checkpoint, a restart's backoff), and the
stop report and `status` say what matters in a few lines."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from tests.cli.test_operator import Pane
from tests.conftest import TRAINCTL, Harness, wait_for

IGNORES_TERM = (
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n"
)


def test_status_during_a_stop_says_since_when_and_the_grace_left(harness: Harness) -> None:
    h = harness
    script = h.tmp / "stubborn.py"
    script.write_text(IGNORES_TERM)
    h.tc("start", "--name", "s", "--grace", "30", "--", sys.executable, str(script), check=True)
    stop = subprocess.Popen(  # ours: the test's own CLI call
        [*TRAINCTL, "stop", "s"], env=h.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: h.tc("status", "s", "--json").json()["state"] == "stopping", 20, "stop")  # type: ignore[index]
        doc = h.tc("status", "s", "--json").json()
        assert isinstance(doc, dict)
        assert doc["stop_by"] == "stop"
        assert 20 < doc["grace_left_s"] <= 30
        assert time.time() - 15 < doc["stop_since"] <= time.time()
        human = h.tc("status", "s").out
        assert "stop since " in human
        assert re.search(r"stop since \d\d:\d\d:\d\d \(stop\): [23]\ds of grace left", human)
    finally:
        h.tc("stop", "s", "--grace", "0", timeout=60)
        stop.wait(60)
    assert h.tc("status", "s", "--json").json()["grace_left_s"] is None  # type: ignore[index]


def test_status_in_a_restart_backoff_names_the_next_run_not_a_dead_pid(harness: Harness) -> None:
    h = harness
    h.tc(
        "start", "--name", "b", "--set", "restart=on-failure", "--set", "restart_backoff=20s",
        "--", "sh", "-c", "sleep 0.3; exit 1", check=True,
    )  # fmt: skip
    wait_for(
        lambda: h.tc("status", "b", "--json").json()["restart_in_s"] is not None, 20, "backoff"
    )  # type: ignore[index]
    human = h.tc("status", "b").out
    head = human.splitlines()[0]
    assert head.startswith("b: waiting to restart (run 2 in "), human
    assert "main pid -   (run 1 ended; its supervisor" in human
    assert "None" not in human
    assert "restart on-failure (max 3, backoff 20s)" in human
    h.tc("stop", "b", check=True)
    assert h.tc("status", "b", "--json").json()["restart_in_s"] is None  # type: ignore[index]


def test_status_shows_cwd_and_how_the_job_stops_and_a_glob_with_no_match(
    harness: Harness,
) -> None:
    h = harness
    h.tc(
        "start", "--name", "c", "--cwd", str(h.tmp), "--grace", "2m", "--stop-signal", "INT",
        "--set", "checkpoint=ckpt/*.pt", "--", "sh", "-c", "sleep 600  # it's", check=True,
    )  # fmt: skip
    human = h.tc("status", "c").out
    cmd = next(ln for ln in human.splitlines() if ln.startswith("  cmd  "))
    assert shlex.split(cmd.removeprefix("  cmd  ")) == ["sh", "-c", "sleep 600  # it's"]
    assert f"  cwd  {h.tmp}" in human
    assert "  stop grace 2m (SIGINT, order tree); restart never" in human
    assert "  ckpt nothing matches ckpt/*.pt yet" in human
    doc = h.tc("status", "c", "--json").json()
    assert isinstance(doc, dict)
    assert doc["settings"] == {
        "grace_s": 120.0,
        "stop_signal": "SIGINT",
        "stop_order": "tree",
        "restart": "never",
        "checkpoint": "ckpt/*.pt",
        "checkpoint_matches": False,
        "tty": False,  # no terminal to attach to (start --tty)
    }
    (h.tmp / "ckpt").mkdir()
    (h.tmp / "ckpt" / "a.pt").write_text("x")
    assert "nothing matches" not in h.tc("status", "c").out
    h.tc("stop", "c", check=True)


def test_the_stop_report_is_short_and_verbose_names_each_killed_pid_once(
    harness: Harness,
) -> None:
    h = harness
    h.tc("start", "--name", "c", "--", "sh", "-c", "sleep 600 & sleep 600 & wait", check=True)
    wait_for(lambda: len(h.job_pids("c")) == 3, 10, "3 processes")
    clean = h.tc("stop", "c", check=True).out.splitlines()
    assert clean[0].startswith("stopped c run 1 via supervisor (")
    assert clean[0].endswith(": 3 process(es)")
    assert len(clean) <= 4, clean  # what was found, signalled, the verdict, the cause
    assert not any("[" in ln or "median" in ln or "SIGKILL" in ln for ln in clean), clean
    script = h.tmp / "stubborn.py"
    script.write_text(IGNORES_TERM)
    # The report keeps 200 characters of a command: with the interpreter's and the script's
    # paths (a clone's venv, a pytest-xdist worker's tmp dir) 80 more went past that.
    long_arg = "y" * 40
    argv = ("--", sys.executable, str(script), long_arg)
    h.tc("start", "--name", "k", "--grace", "0.5", *argv, check=True)
    short = h.tc("stop", "k", env={**h.env, "COLUMNS": "100"}).out
    assert "SIGKILL    1 killed" in short
    assert "…" in short  # the long command cut in the middle on a 100-column screen
    cmds = [ln for ln in short.splitlines() if "yyyy" in ln]
    assert cmds, short
    assert all(len(ln) <= 100 for ln in cmds), short
    h.tc("start", "--name", "k", "--grace", "0.5", *argv, check=True)
    full = h.tc("stop", "k", "-v").out  # piped, no COLUMNS: every character
    assert "found      by " in full
    assert long_arg in full
    assert full.count(long_arg) == 1, full  # the SIGKILLed pid is named once
    assert "SIGKILLed" in full


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux not installed (apt-get install tmux)")
def test_stop_checkpoint_shows_a_live_line_while_it_waits(harness: Harness) -> None:
    h = harness
    script = h.tmp / "slow_ckpt.py"
    script.write_text(
        "import os, signal, time\n"
        "asked = []\n"
        "signal.signal(signal.SIGUSR2, lambda *a: asked.append(1))\n"
        "os.makedirs('ckpt', exist_ok=True)\n"
        "while not asked:\n"
        "    time.sleep(0.05)\n"
        "with open('ckpt/step.pt.tmp', 'w') as f:\n"
        "    for i in range(30):\n"
        "        f.write('x' * 1000); f.flush(); time.sleep(0.1)\n"
        "os.rename('ckpt/step.pt.tmp', 'ckpt/step.pt')\n"
        "time.sleep(600)\n"
    )
    h.tc(
        "start", "--name", "w", "--cwd", str(h.tmp), "--set", "checkpoint=ckpt/*.pt",
        "--", sys.executable, str(script), check=True,
    )  # fmt: skip
    stop = shlex.join([*TRAINCTL, "stop", "w", "--checkpoint"])
    pane = Pane(h, ["sh", "-c", f"{stop}; sleep 30"])
    try:
        wait_for(lambda: "waiting for the checkpoint (SIGUSR2): " in pane.screen(), 20, "the line")
        assert " left" in pane.screen()
        wait_for(lambda: "stopped w run 1" in pane.screen(), 30, "the stop")
        screen = pane.screen()
        assert "checkpoint written: ckpt/step.pt" in screen, screen
    finally:
        pane.close()
    assert not h.job_pids("w")
