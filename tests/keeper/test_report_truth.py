"""`trainctl report` against the log's own times (issue 54 §7), on a trainer of nanoGPT's
shape as people write it: progress only in its log (``iter N: loss L``, read through
``progress_regex``; no $TRAINCTL_PROGRESS), ``ckpt.pt`` saved in place every 10
iterations, resumed by its own flag. It prints its own clock on each line, which trainctl
never reads: the test's truth.

Goodput's truth: the steps kept at the end (the checkpoint's), at the trainer's own time
per step, over the time the job was meant to run (its first start to its last end, less
the time it was stopped by the user between two runs). The report used to get none of it
from a regex trainer under 30 s ("no progress reported"), and a start-up of 0.9 s
against 5.7 s measured: it sampled the log's step every 15 s.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import sys
import time
import zipfile
from pathlib import Path

from tests.conftest import Harness, wait_for

TRAINER = """\
import json, os, sys, time, zipfile
init_from = sys.argv[1]
time.sleep(1.0)  # start-up: imports, data, the model
os.makedirs("out", exist_ok=True)
it = 0
if init_from == "--init_from=resume" and os.path.exists("out/ckpt.pt"):
    it = json.loads(zipfile.ZipFile("out/ckpt.pt").read("archive/data.pkl"))["iter_num"]
while True:
    if it % 10 == 0 and it > 0:
        with zipfile.ZipFile("out/ckpt.pt", "w") as z:  # in place, no handler
            z.writestr("archive/data.pkl", json.dumps({"iter_num": it}))
    time.sleep(0.05)
    print(f"iter {it}: loss {1.0 / (it + 1):.4f} at {time.time():.3f}", flush=True)
    it += 1
"""
LINE = re.compile(r"^iter (\d+): loss [\d.]+ at ([\d.]+)$", re.M)


def lines_of(h: Harness, run: int) -> list[tuple[float, int]]:
    text = (h.home / "jobs" / "gpt" / "logs" / f"run-{run}.log").read_text()
    return [(float(t), int(n)) for n, t in LINE.findall(text)]


def started_and_ended(h: Harness) -> tuple[dict[int, float], dict[int, float]]:
    starts, ends = {}, {}
    for raw in (h.home / "jobs" / "gpt" / "events.jsonl").read_text().splitlines():
        ev = json.loads(raw)
        if ev["event"] == "started":
            starts[ev["run"]] = ev["ts"]
        elif ev["event"] == "ended":
            ends[ev["run"]] = ev["ts"]
    return starts, ends


def test_report_agrees_with_the_logs_own_times_over_a_stop_and_a_start(
    harness: Harness,
) -> None:
    h = harness
    d = h.tmp / "gpt"
    d.mkdir()
    (d / "train.py").write_text(TRAINER)
    start = [
        "start", "--name", "gpt", "--cwd", str(d), "--grace", "5",
        "--set", "checkpoint=out/ckpt.pt",
        "--set", r"progress_regex=iter (?P<step>\d+): loss (?P<loss>[\d.]+)",
        "--", sys.executable, "train.py", "--init_from=resume",
    ]  # fmt: skip
    h.tc(*start, check=True)
    wait_for(lambda: len(lines_of(h, 1)) >= 85, 30, "run 1 to train past a save")
    h.tc("stop", "gpt", check=True)  # a plain stop: the steps since its last save are lost
    time.sleep(2.0)  # stopped by you: not lost, not in the denominator
    h.tc(*start, check=True)
    wait_for(lambda: len(lines_of(h, 2)) >= 85, 30, "run 2 to train past a save")
    h.tc("stop", "gpt", check=True)
    g = h.tc("report", "gpt", "--json", check=True).json()

    starts, ends = started_and_ended(h)
    one, two = lines_of(h, 1), lines_of(h, 2)
    step_s = statistics.median(
        b[0] - a[0] for pts in (one, two) for a, b in itertools.pairwise(pts)
    )
    kept = json.loads(zipfile.ZipFile(d / "out" / "ckpt.pt").read("archive/data.pkl"))["iter_num"]
    stopped = starts[2] - ends[1]
    meant = ends[2] - starts[1] - stopped
    truth = kept * step_s / meant
    assert g["goodput"] is not None, g
    assert abs(g["goodput"] - truth) <= 0.03, (g["goodput"], truth, g)
    assert abs(g["stopped_s"] - stopped) <= 0.2, (g["stopped_s"], stopped)
    assert abs(g["typical_step_s"] - step_s) <= 0.01, (g["typical_step_s"], step_s)
    # start-up and restore: from each run's start to its first line
    startup = one[0][0] - starts[1]
    restore = two[0][0] - starts[2]
    assert abs(g["lost_s"]["startup"] - startup) <= 0.6, (g["lost_s"], startup)
    assert abs(g["lost_s"]["restore"] - restore) <= 0.6, (g["lost_s"], restore)
    # the steps each stop threw away are counted: run 1's since its last save
    redone = one[-1][1] - (two[0][1] - 1)
    assert redone > 0
    assert abs(g["steps_lost"] - redone - (two[-1][1] - kept)) <= 2, g
    shown = h.tc("report", "gpt", check=True).out
    assert "stopped   by you" in shown, shown
    assert Path(d / "out" / "ckpt.pt").exists()


UNTIMED = """\
import json, os, time
step = 0
while True:
    step += 1
    time.sleep(0.05)
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:  # as the README says: no "t"
        f.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n")
"""


def test_progress_lines_without_a_time_are_timed_as_they_are_written(harness: Harness) -> None:
    """$TRAINCTL_PROGRESS lines without `t` (as people write them) gave `report` "no
    progress reported" while `status` showed the steps; the supervisor now times them."""
    h = harness
    h.tc("start", "--name", "nt", "--", sys.executable, "-c", UNTIMED, check=True)
    progress = h.home / "jobs" / "nt" / "logs" / "run-1.progress.jsonl"
    wait_for(lambda: progress.exists() and len(progress.read_text().splitlines()) >= 40, 30)
    h.tc("stop", "nt", check=True)
    g = h.tc("report", "nt", "--json", check=True).json()
    assert g["goodput"] is not None, g
    assert g["needs_progress"] == []
    assert abs(g["typical_step_s"] - 0.05) <= 0.01, g
    stamped = (h.home / "jobs" / "nt" / "logs" / "run-1.steps.jsonl").read_text().splitlines()
    assert len(stamped) >= 4  # timed as they came (by mtime, a look every 0.5 s), not sampled
