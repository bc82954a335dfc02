"""The breaker on progress (issue 46 §6): restarts that never advance the newest complete
checkpoint end the job with a cause that says so, and a run that fails right after
resuming from checkpoint N is retried once from the one before it. Restarts hand the
newest complete checkpoint in $TRAINCTL_RESUME_FROM (never a partial one)."""

from __future__ import annotations

import json
import os
import sys
import time

from tests.conftest import Harness, wait_for

# Saves step_000010.txt, step_000020.txt, then crashes at step 25 (first run). A resumed
# run (any $TRAINCTL_RESUME_FROM) crashes 0.3 s after it starts, before any save.
FRAGILE = """\
import json, os, sys, time
ck = sys.argv[1]
resume = os.environ.get("TRAINCTL_RESUME_FROM")
print(f"run {os.environ['TRAINCTL_RUN']} resume={resume}", flush=True)
if resume:
    time.sleep(0.3)
    sys.exit("cannot load the optimizer state")
os.makedirs(ck, exist_ok=True)
for step in range(1, 26):
    time.sleep(0.03)
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
        f.write(json.dumps({"step": step, "t": time.time()}) + "\\n")
    if step % 10 == 0:
        with open(os.path.join(ck, f"step_{step:06d}.txt"), "w") as f:
            f.write(str(step))
sys.exit("diverged at step 25")
"""


def test_restarts_from_one_checkpoint_end_with_a_progress_cause(harness: Harness) -> None:
    h = harness
    ck = h.tmp / "ck"
    # a half-written newer one: a temporary name, never handed to a run
    ck.mkdir()
    partial = ck / "step_000090.txt.tmp"
    partial.write_text("9")
    os.utime(partial, (time.time() + 1000, time.time() + 1000))  # the newest by far
    h.tc(
        "start", "--name", "fr", "--set", "restart=on-failure", "--set", "max_restarts=10",
        "--set", "restart_backoff=0.2s", "--set", f"checkpoint={ck}/step_*",
        "--", sys.executable, "-c", FRAGILE, str(ck),
        check=True,
    )  # fmt: skip
    wait_for(lambda: h.state("fr")["phase"] == "failed", 60, "the breaker")
    st = h.state("fr")
    assert st["cause"]["kind"] == "no-progress", st["cause"]
    assert st["cause"]["summary"].startswith("no progress: 3 restarts, all from step 20")
    assert st["run"] == 4  # run 1, then 3 restarts (runs 2-4) that all failed on step 20
    logs = h.home / "jobs" / "fr" / "logs"
    handed = [
        (logs / f"run-{n}.log").read_text().split("resume=")[1].split()[0] for n in range(2, 5)
    ]
    # run 2 resumed from the newest (20); it failed at once: run 3 from the one before (10),
    # once; then the newest again
    assert handed[0].endswith("step_000020.txt")
    assert handed[1].endswith("step_000010.txt")
    assert all(x.endswith("step_000020.txt") for x in handed[2:])
    assert not any(".tmp" in x for x in handed)  # the partial one is never handed
    events = [
        json.loads(x) for x in (h.home / "jobs" / "fr" / "events.jsonl").read_text().splitlines()
    ]
    skipped = [e for e in events if e["event"] == "resume_skipped"]
    assert len(skipped) == 1
    assert skipped[0]["skipped"].endswith("step_000020.txt")
    status = h.tc("status", "fr").out
    assert "no progress: 3 restarts, all from step 20" in status
