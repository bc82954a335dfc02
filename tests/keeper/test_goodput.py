"""`trainctl report` (issue 46 §7) on a scripted trainer whose time is known: 2 s of
start-up, 0.1 s steps, a 1 s save every 50 steps, a SIGKILL of itself at step 57 in its
first run, restarted by the policy (at once: it saved at step 50, so it is no crash loop
and its 1 s backoff is not waited), resumed from step 50."""

from __future__ import annotations

import sys

from tests.conftest import Harness, wait_for
from tests.keeper.test_deploy import progress
from trainctl.launcher.ops import goodput

SCRIPTED = """\
import json, os, signal, sys, time
ck = sys.argv[1]
time.sleep(2.0)  # start-up: imports, data, the model
step = int(open(ck).read()) if os.path.exists(ck) else 0
while True:
    step += 1
    time.sleep(0.1)
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
        f.write(json.dumps({"step": step, "t": time.time()}) + "\\n")
    if step % 50 == 0:
        time.sleep(1.0)  # the save
        with open(ck + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(ck + ".tmp", ck)
    if step == 57 and os.environ["TRAINCTL_RUN"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
"""


def near(got: float, want: float, what: str) -> None:
    # 5 % of the script, plus what a busy 2-core machine adds to a process start
    assert abs(got - want) <= 0.05 * want + 0.25, f"{what}: {got:.3f} s, script {want} s"


def test_report_matches_the_scripted_run(harness: Harness) -> None:
    h = harness
    ck = h.tmp / "ckpt.txt"
    h.tc(
        "start", "--name", "gp", "--set", "restart=on-failure", "--set", "restart_backoff=1s",
        "--set", f"checkpoint={ck}", "--", sys.executable, "-c", SCRIPTED, str(ck),
        check=True,
    )  # fmt: skip
    wait_for(lambda: h.state("gp")["run"] == 2 and progress(h, "gp", 2) >= 62, 60, "run 2")
    h.tc("stop", "gp", check=True)
    g = h.tc("report", "gp", "--json", check=True).json()
    print(g)
    assert g["steps_lost"] == 7  # 51..57 were done twice
    lost = g["lost_s"]
    # from each run's start to its first step: the 2 s, and the first step's 0.1 s
    near(lost["startup"], 2.1, "startup")
    near(lost["restore"], 2.1, "restore")
    near(lost["checkpoint_save"], 1.0, "checkpoint save")
    near(lost["steps_redone"], 0.7, "steps redone")
    # down: the relaunch itself, no backoff (it saved since its start): a new
    # supervisor and interpreter, 0.2 s idle here, more on a busy machine
    assert lost["down"] <= 2.0, lost["down"]
    assert lost["stalled"] == lost["deploys"] == lost["queued"] == 0
    assert g["typical_step_s"] is not None
    near(g["typical_step_s"], 0.1, "typical step")
    (first,) = g["interruptions"]
    assert first["run"] == 1
    assert first["steps_lost"] == 7
    assert "SIGKILL" in first["cause"] or "-9" in first["cause"] or "killed" in first["cause"]
    # issue 56 §1: the interruption part by part, from step 57 to run 2's first step
    parts = first["parts"]
    assert parts["detect"] <= 0.5, parts  # it killed itself right after its step 57
    assert parts["stop"] <= 1.5, parts  # the cleanup: nothing of it was left to stop
    assert parts["backoff"] == 0.0, parts  # it saved at step 50: not a loop
    assert parts["down"] <= 2.0, parts  # the relaunch alone
    near(parts["restore"], 2.1, "restore part")
    near(parts["redo"], 0.7, "redo part")
    total = parts["detect"] + parts["stop"] + parts["down"] + parts["restore"] + parts["redo"]
    assert abs(total - first["lost_s"]) <= 0.05, (total, first["lost_s"])  # one timeline
    # productive: the steps that count (62 or so, at 0.1 s), nothing redone
    steps_kept = progress(h, "gp", 2)
    near(g["productive_s"], steps_kept * 0.1, "productive")
    assert 0 < g["goodput"] < 1
    total = g["productive_s"] + sum(lost.values())
    assert abs(total - g["wall_s"]) <= 0.05 * g["wall_s"] + 0.5, (total, g["wall_s"])
    text = h.tc("report", "gp", check=True).out
    assert "goodput 0." in text
    assert "7 steps redone" in text
    assert "restore 2." in text, text
    assert "down " in text, text
    # the web page's reader (a points cache kept across reads) gives the same report
    cache = goodput.PointsCache()
    twice = [goodput.report(h.home, "gp", cache).to_doc() for _ in range(2)]
    assert twice[0] == twice[1] == g, (twice, g)


def test_report_without_progress_and_of_an_unknown_job(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "np", "--", "sleep", "600", check=True)
    h.tc("stop", "np", check=True)
    g = h.tc("report", "np", "--json", check=True).json()
    assert g["goodput"] is None
    assert g["productive_s"] is None
    assert "goodput" in g["needs_progress"]
    assert g["wall_s"] > 0
    text = h.tc("report", "np", check=True).out
    assert "$TRAINCTL_PROGRESS or progress_regex" in text
    res = h.tc("report", "ghost")
    assert res.rc == 2
    assert len(res.err.strip().splitlines()) == 1
    assert "no job named" in res.err


COUNTER = """\
import json, os, time
step = 0  # counts from 1 at every start: it never resumes
while True:
    step += 1
    time.sleep(0.05)
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
        f.write(json.dumps({"step": step, "t": time.time()}) + "\\n")
"""


def test_a_run_that_started_over_did_its_steps_again(harness: Harness) -> None:
    """A run whose first step is 1 after an earlier run reached step S did its steps up
    to S again: they are redone, not productive (the goodput of a deploy whose new code
    ignored the checkpoint, or a start that handed none, once counted them as progress)."""
    h = harness
    h.tc("start", "--name", "so", "--", sys.executable, "-c", COUNTER, check=True)
    wait_for(lambda: progress(h, "so", 1) >= 40, 30, "run 1 at step 40")
    h.tc("restart", "so", "--from-scratch", check=True)
    wait_for(lambda: progress(h, "so", 2) >= 20, 30, "run 2 at step 20")
    h.tc("stop", "so", check=True)
    first = progress(h, "so", 1)
    second = progress(h, "so", 2)
    g = h.tc("report", "so", "--json", check=True).json()
    # run 1's interruption: nothing resumed from it (run 2 started over), so its own
    # steps are not counted there; run 2's are redone up to where run 1 had been
    assert g["steps_lost"] == min(first, second), (g["steps_lost"], first, second)
    new = first + max(0, second - first)  # the steps done once
    assert g["productive_s"] <= new * g["typical_step_s"] * 1.5 + 0.5, g


SAVER = """\
import json, os, sys, time
out = sys.argv[1]
resume = os.environ.get("TRAINCTL_RESUME_FROM")
step = int(open(resume).read()) if resume else 0
while True:
    step += 1
    time.sleep(0.1)
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
        f.write(json.dumps({"step": step, "t": time.time()}) + "\\n")
    if step % 50 == 0:
        with open(f"{out}/.tmp", "w") as f:
            f.write(str(step))
        os.replace(f"{out}/.tmp", f"{out}/ckpt-{step}.txt")
"""


def test_a_run_that_started_over_between_two_that_resumed(harness: Harness) -> None:
    """The rollback's shape: run 2 started over (it ignored the checkpoint) and run 3
    resumed from run 1's checkpoint: run 1's end is measured against run 3, so run 2's
    steps were counted nowhere, and as productive; they are redone (issue 56: a goodput
    anyone could quote)."""
    h = harness
    out = h.tmp / "ck"
    out.mkdir()
    h.tc("start", "--name", "rb", "--set", f"checkpoint={out}/ckpt-*.txt", "--",
         sys.executable, "-c", SAVER, str(out), check=True)  # fmt: skip
    wait_for(lambda: progress(h, "rb", 1) >= 55, 30, "run 1 past its save at step 50")
    h.tc("restart", "rb", "--from-scratch", check=True)
    wait_for(lambda: progress(h, "rb", 2) >= 10, 30, "run 2 at step 10")
    h.tc("restart", "rb", check=True)  # hands the newest complete checkpoint: step 50
    wait_for(lambda: progress(h, "rb", 3) >= 55, 30, "run 3 under way")
    h.tc("stop", "rb", check=True)
    s1, s2 = progress(h, "rb", 1), progress(h, "rb", 2)
    assert s2 < 50, s2  # run 2 saved nothing: run 3 resumed from run 1's step 50
    g = h.tc("report", "rb", "--json", check=True).json()
    # run 2 did steps 1..s2 again; run 3 did 51..s1 again
    assert g["steps_lost"] == s2 + s1 - 50, (g["steps_lost"], s1, s2)
