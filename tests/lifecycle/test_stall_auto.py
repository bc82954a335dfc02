"""`stall_timeout = "auto"` (issue 46 §8): the deadline is learned from the run's own
steps, so a hung rank is seen in seconds; a save that takes far longer than a step (the
checkpoint being written) is never called a stall."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Harness, wait_for
from tests.keeper.test_goodput import COUNTER  # a step every 0.05 s, each on its line
from trainctl.supervisor.watch.stall import CheckpointWatch, StallLearner

# 0.1 s steps; every 20 steps a 5 s save that writes its file as it goes (as torch.save
# does), then reports the next step. Runs until stopped.
SAVER = """\
import json, os, sys, time
ck = sys.argv[1]
os.makedirs(ck, exist_ok=True)
step = 0
while True:
    step += 1
    time.sleep(0.1)
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
        f.write(json.dumps({"step": step, "t": time.time()}) + "\\n")
    if step % 20 == 0:
        with open(os.path.join(ck, f"step_{step:06d}.pt"), "wb") as f:
            for _ in range(10):  # 5 s of writing
                f.write(b"w" * 4096)
                f.flush()
                time.sleep(0.5)
"""


def test_a_learned_deadline_sees_a_hung_rank_and_never_a_save(harness: Harness) -> None:
    h = harness
    ck = h.tmp / "ck"
    h.tc(
        "start", "--name", "sa", "--set", "stall_timeout=auto",
        "--set", f"checkpoint={ck}/step_*.pt",
        "--", sys.executable, "-c", SAVER, str(ck),
        check=True,
    )  # fmt: skip
    # two saves of 5 s each, with 20 steps around them: never a stall
    wait_for((ck / "step_000040.pt").exists, 60, "two saves")
    wait_for(lambda: h.state("sa")["stall_deadline_s"] is not None, 30, "a learned deadline")
    time.sleep(5.5)  # the second save runs to its end
    assert "stalled" not in [e["event"] for e in h.events("sa")]
    deadline = h.state("sa")["stall_deadline_s"]
    assert deadline < 5, deadline  # learned from the steps, not from the 5 s saves
    assert "stall deadline " in h.tc("status", "sa").out  # status shows the learned one
    # a hung rank: SIGSTOP of main (ours: it carries the test's marker)
    pid = h.state("sa")["main"]["pid"]
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: "stalled" in [e["event"] for e in h.events("sa")], 30, "the stall")
        seen = time.monotonic() - stopped_at
        assert seen < deadline + 3, seen  # the deadline and a look or two, not minutes
        wait_for(lambda: "stacks_written" in [e["event"] for e in h.events("sa")], 30, "the stacks")
    finally:
        os.kill(pid, signal.SIGCONT)
    h.tc("stop", "sa", check=True)


def test_stall_timeout_takes_auto_or_a_duration(harness: Harness) -> None:
    h = harness
    res = h.tc("start", "--name", "x", "--set", "stall_timeout=sometimes", "--", "true")
    assert res.rc == 2
    assert len(res.err.strip().splitlines()) == 1


def test_a_gap_called_a_stall_is_never_learned_as_a_step() -> None:
    """Two SIGSTOPs of 9 s and 30 s in a run stepping every 0.5 s: the deadline stays
    at 4x the step gap (it grew 4.4 s -> 19.8 s -> 1m23s when stalls were learned)."""
    learner = StallLearner()
    t = 1000.0
    for _ in range(10):
        t += 0.5
        learner.observe(t, 0.0)
    before = learner.deadline_s
    assert before == 2.0  # 4 x 0.5 s
    for hung in (9.0, 30.0):
        t += hung
        assert learner.stalled_for(t, 0.0) is not None  # it was called a stall
        learner.observe(t, 0.0)  # the rank came back
        for _ in range(3):
            t += 0.5
            learner.observe(t, 0.0)
    assert learner.deadline_s == before
    assert learner.stalls == 2
    # a gap under the deadline is still a step: a slower phase of training is learned
    t += 1.5
    learner.observe(t, 0.0)
    assert learner.deadline_s == 6.0


def test_a_relaunchs_start_is_not_learned_as_a_step_gap() -> None:
    """issue 56 §2, found by scripts/bench_goodput.py: a run relaunched by the restart
    policy under the same supervisor took 4.5 s from its start to its first step; learned
    as a step gap, it made the deadline 18 s, and the next hang was seen after 18.9 s.
    A start is learned apart; a start that hangs is called against 4x the longest one."""
    learner = StallLearner()
    t = 1000.0
    learner.begin(1, t)
    t += 4.0
    learner.observe(t, 0.0, stepped=False)  # the banner: still starting
    t += 0.5
    learner.observe(t, 0.0, stepped=True)  # its first step, 4.5 s after its start
    for _ in range(10):
        t += 0.5
        learner.observe(t, 0.0)
    assert learner.deadline_s == 2.0
    assert learner.longest_start_s == 4.5
    # the relaunch: its start (4.5 s again, with a write at 1 s) leaves the deadline alone
    learner.begin(2, t)
    assert learner.stalled_for(t + 4.0, 0.0) is None  # a start this long is not a stall
    learner.observe(t + 1.0, 0.0, stepped=False)
    learner.observe(t + 4.5, 0.0, stepped=True)
    t += 4.5
    for _ in range(10):
        t += 0.5
        learner.observe(t, 0.0)
    assert learner.deadline_s == 2.0  # 18 s when the start was learned as a step gap
    assert learner.stalled_for(t + 2.5, 0.0) is not None  # a hang: seen after 2 s, not 19
    # a start that hangs (a rendezvous): called after 4x the longest start, not before
    learner.begin(3, t)
    assert learner.stalled_for(t + 17.0, 0.0) is None
    assert learner.stalled_for(t + 18.5, 0.0) is not None
    # a supervisor's first start is never called: nothing to measure it against
    fresh = StallLearner()
    fresh.begin(1, 0.0)
    assert fresh.stalled_for(600.0, 0.0) is None


SLOW_START = """\
import json, os, sys, time
print("banner: importing", flush=True)  # a write at once, as torchrun's
time.sleep(3.0)  # the start: imports, a rendezvous, a checkpoint's load
step = 0
while True:
    step += 1
    time.sleep(0.1)
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
        f.write(json.dumps({"step": step, "t": time.time()}) + "\\n")
"""


def test_the_deadline_is_learned_from_steps_not_from_a_start(harness: Harness) -> None:
    """issue 56 §2, found by bench_goodput's parts: the supervisor makes each run's
    progress file at its start, so "the file exists" ended the start at once and a 3 s
    start was learned as a step gap (a 12 s deadline; the bench's hang was seen after 15
    s). The start ends at the first progress line, in the first run and in a relaunch."""
    h = harness
    h.tc(
        "start", "--name", "ss", "--set", "stall_timeout=auto", "--set", "restart=on-failure",
        "--set", "restart_backoff=0.2s", "--", sys.executable, "-c", SLOW_START,
        check=True,
    )  # fmt: skip
    wait_for(lambda: h.state("ss")["stall_deadline_s"] is not None, 30, "a learned deadline")
    assert h.state("ss")["stall_deadline_s"] < 3, h.state("ss")["stall_deadline_s"]
    os.kill(h.state("ss")["main"]["pid"], signal.SIGKILL)  # ours: the test's marker
    wait_for(lambda: h.state("ss")["run"] == 2, 30, "the relaunch")
    wait_for(lambda: h.state("ss")["stall_deadline_s"] is not None, 30, "run 2's deadline")
    deadline = h.state("ss")["stall_deadline_s"]
    assert deadline < 3, deadline  # run 2's 3 s start is not a step gap either
    assert "stalled" not in [e["event"] for e in h.events("ss")]  # nor was its start a stall
    pid = h.state("ss")["main"]["pid"]
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: "stalled" in [e["event"] for e in h.events("ss")], 30, "the stall")
        assert time.monotonic() - stopped_at < deadline + 3
    finally:
        os.kill(pid, signal.SIGCONT)
    h.tc("stop", "ss", check=True)


def test_steps_faster_than_the_look_are_learned_from_the_lines_counted() -> None:
    """issue 56 §2: looks every 0.5 s at a run stepping every 0.05 s saw a write per
    look, so the deadline was 4 x the look (2.1 s) whatever the pace. Ten progress lines
    between two looks are ten gaps: the deadline is the floor, and a span without lines
    counted (a log-only run) is still learned as one gap."""
    learner = StallLearner()
    t = 1000.0
    for _ in range(10):
        t += 0.5
        learner.observe(t, 0.0, lines=10)
    assert learner.longest_step_s == 0.05
    assert learner.deadline_s == 1.0  # FLOOR_S: 4 x 0.05 s is under it
    assert learner.stalled_for(t + 0.9, 0.0) is None
    assert learner.stalled_for(t + 1.0, 0.0) is not None
    # a look that came late (the supervisor busy for 1.2 s) while the run wrote on:
    # twelve gaps of 0.1 s, not a stall of 1.2 s
    t += 1.2
    learner.observe(t, 0.0, lines=12)
    assert learner.stalls == 0
    assert learner.deadline_s == 1.0
    slow = StallLearner()  # a log-only run writing every 0.4 s: one gap per span
    for _ in range(10):
        t += 0.4
        slow.observe(t, 0.0)
    assert abs(slow.deadline_s - 1.6) < 1e-9


def test_a_save_holds_the_deadline_off_only_until_the_run_steps_again() -> None:
    """A checkpoint written since the run's last write is a save under way (SAVING_S);
    one written before a later step is a save that is over: a hang right after it is
    seen at the deadline, not SAVING_S after the save."""
    learner = StallLearner()
    t = 1000.0
    for _ in range(10):
        t += 0.1
        learner.observe(t, 0.0)
    assert learner.deadline_s == 1.0
    # the save: the checkpoint written after the last step, the run quiet since
    ck = t + 0.2
    assert learner.stalled_for(t + 1.5, ck) is None  # under way: its file was just written
    assert learner.due_in(t + 1.5, ck) == ck + 2.0 - (t + 1.5)
    assert learner.stalled_for(ck + 2.0, ck) is not None  # quiet for SAVING_S after it
    # a step after the save: the save is over, the deadline alone counts
    t = ck + 0.1
    learner.observe(t, ck)
    assert learner.stalled_for(t + 1.0, ck) is not None
    assert learner.due_in(t + 0.25, ck) == 0.75  # the look is taken when it passes
    assert learner.due_in(t + 1.5, ck) is None  # past: the usual looks follow the stall


def test_a_run_faster_than_the_look_gets_a_deadline_under_the_looks(harness: Harness) -> None:
    """issue 56 §2: a run stepping every 0.05 s (as the goodput bench's) got 4 x the
    0.5 s look as its deadline; the lines counted give it the floor (1 s), and the look
    that sees the hang is taken when the deadline passes."""
    h = harness
    h.tc(
        "start", "--name", "fa", "--set", "stall_timeout=auto",
        "--", sys.executable, "-c", COUNTER,
        check=True,
    )  # fmt: skip
    wait_for(lambda: h.state("fa")["stall_deadline_s"] is not None, 30, "a learned deadline")
    time.sleep(2.0)  # more looks: the deadline stands
    deadline = h.state("fa")["stall_deadline_s"]
    assert deadline < 2.0, deadline  # 2.0-2.1 when the look's span was learned as a gap
    pid = h.state("fa")["main"]["pid"]  # ours: the test's marker
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: "stalled" in [e["event"] for e in h.events("fa")], 30, "the stall")
        assert time.monotonic() - stopped_at < deadline + 3  # a bound that catches a hang
    finally:
        os.kill(pid, signal.SIGCONT)
    h.tc("stop", "fa", check=True)


def test_a_complete_checkpoint_is_a_save_over(tmp_path: Path) -> None:
    """A hang right after a save (rank 0 wrote the checkpoint and its marker, then waits
    in a barrier for the hung rank): the checkpoint was written since the last step, but
    it is complete by its format, so the stall is called at the deadline, not SAVING_S
    after the save (the goodput bench's hang landed there and was seen after 2 s)."""
    learner = StallLearner()
    t = 1000.0
    for _ in range(10):
        t += 0.1
        learner.observe(t, 0.0)
    ck = t + 0.3  # written after the last step: to the learner, a save under way
    assert learner.stalled_for(t + 1.5, ck) is None
    assert learner.stalled_for(t + 1.5, ck, done=True) is not None
    assert learner.due_in(t + 0.5, ck, done=True) == pytest.approx(0.5)
    # the watch that judges it: a marker written after the data; the data written again
    watch = CheckpointWatch(str(tmp_path), "ckpt.pt")
    (tmp_path / "ckpt.pt").write_bytes(b"weights")
    assert watch.newest_mtime() > 0
    assert not watch.newest_complete()  # no marker, no known format, just written
    (tmp_path / "ckpt.pt.complete").write_text("")
    assert watch.newest_complete()
    later = time.time() + 5
    os.utime(tmp_path / "ckpt.pt", (later, later))  # saved again in place, after its marker
    assert watch.newest_mtime() == later
    assert not watch.newest_complete()


FINISHES_ITS_STEP = """\
import json, os, signal, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
step = 0
while not stop:
    step += 1
    time.sleep(0.05)
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:  # the step ends with its line
        f.write(json.dumps({"step": step, "t": time.time()}) + "\\n")
"""


def test_a_hangs_parts_count_the_quiet_as_detection(harness: Harness) -> None:
    """A hung rank set going again by the stall's stop (SIGCONT with the SIGTERM) ends
    the step it was in, so the run's last step comes after trainctl's first move. The
    report's parts took that for "nothing to detect" (detect 0.0 s on the goodput
    bench's hang); the quiet the stall mark saw is the detection."""
    h = harness
    h.tc(
        "start", "--name", "hp", "--set", "stall_timeout=auto", "--set", "stall_action=restart",
        "--set", "restart=on-failure", "--", sys.executable, "-c", FINISHES_ITS_STEP,
        check=True,
    )  # fmt: skip
    wait_for(lambda: h.state("hp")["stall_deadline_s"] is not None, 30, "a learned deadline")
    os.kill(h.state("hp")["main"]["pid"], signal.SIGSTOP)  # ours: the test's marker
    wait_for(lambda: h.state("hp")["run"] == 2, 30, "the stall's relaunch")
    wait_for(lambda: progress_lines(h, "hp", 2) > 0, 30, "run 2's first step")
    h.tc("stop", "hp", check=True)
    (stalled,) = [e for e in h.events("hp") if e["event"] == "stalled"]
    (first, *_) = h.tc("report", "hp", "--json", check=True).json()["interruptions"]
    parts = first["parts"]
    assert abs(parts["detect"] - stalled["idle_s"]) <= 0.1, (parts, stalled)
    run1 = h.home / "jobs" / "hp" / "logs" / "run-1.progress.jsonl"
    last_t = json.loads(run1.read_text().splitlines()[-1])["t"]
    assert last_t > stalled["ts"]  # it did step once more after the mark


def progress_lines(h: Harness, name: str, run: int) -> int:
    path = h.home / "jobs" / name / "logs" / f"run-{run}.progress.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0
