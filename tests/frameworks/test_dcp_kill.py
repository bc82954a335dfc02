"""Real PyTorch DCP saves, SIGKILLed at random points (issue 46 §1): trainctl's newest
complete checkpoint is always a whole one, a half-written one is named as partial, and a
restart is handed the last complete step, never the partial one."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from tests.conftest import Harness, kill_verified, wait_for
from tests.helpers import NEEDS_TORCH

pytestmark = NEEDS_TORCH
KILLS = 8  # each restart imports torch again (~2 s here): 8 keep the test near 40 s

# One process, DCP (torch.distributed.checkpoint) into out/step_N/ every 5 steps: a big
# enough state that a save takes a while; resumes from $TRAINCTL_RESUME_FROM.
DCP_TRAINER = """\
import json, os, sys, time
import torch
import torch.distributed.checkpoint as dcp
out = sys.argv[1]
state = {"w": torch.zeros(4_000_000), "step": torch.tensor(0)}
resume = os.environ.get("TRAINCTL_RESUME_FROM")
if resume:
    dcp.load(state, checkpoint_id=resume)
print(f"resumed={resume} step={int(state['step'])}", flush=True)
step = int(state["step"])
while True:
    step += 1
    state["w"] += 1
    state["step"] = torch.tensor(step)
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
        f.write(json.dumps({"step": step, "t": time.time()}) + "\\n")
    if step % 5 == 0:
        dcp.save(state, checkpoint_id=os.path.join(out, f"step_{step:06d}"))
    time.sleep(0.02)
"""


def test_dcp_saves_killed_at_random_points_are_never_handed_to_a_run(harness: Harness) -> None:
    h = harness
    out = h.tmp / "out"
    out.mkdir()
    rng = random.Random(46)  # noqa: S311  (kill points, not secrets: fixed for a rerun)
    h.tc(
        "start", "--name", "dcp", "--set", f"checkpoint={out}/step_*",
        "--set", "restart=on-failure", "--set", "max_restarts=30",
        "--set", "restart_backoff=0.1s", "--set", "restart_no_progress=0",
        "--env", "OMP_NUM_THREADS=1", "--", sys.executable, "-c", DCP_TRAINER, str(out),
        check=True,
    )  # fmt: skip
    partial_seen = 0
    for kill in range(KILLS):
        st = h.state("dcp")
        run = st["run"]
        wait_for(lambda r=run: "resumed=" in _log(h, r), 60, f"run {run} to start training")
        time.sleep(rng.uniform(0.3, 1.5))  # somewhere in a step or in a save
        status = h.tc("status", "dcp", "--json").json()
        ck = status.get("checkpoint") or {}  # type: ignore[union-attr]
        if ck.get("partial"):
            partial_seen += 1
            assert ck["partial"] != ck.get("path")
        main = h.state("dcp")["main"]
        kill_verified(main["pid"], main["start_ticks"])  # ours: this test's job's main
        wait_for(lambda r=run: h.state("dcp")["run"] > r, 60, f"restart {kill}")
    wait_for(lambda: "resumed=" in _log(h, h.state("dcp")["run"]), 60, "the last resume")
    h.tc("stop", "dcp", check=True)
    # every run after the first was handed a complete checkpoint, and resumed its step
    runs = h.state("dcp")["run"]
    for n in range(2, runs + 1):
        line = next(x for x in _log(h, n).splitlines() if x.startswith("resumed="))
        handed = line.split()[0].removeprefix("resumed=")
        if handed == "None":
            continue  # killed before its first save ever completed
        step = int(line.split("step=")[1])
        assert Path(handed, ".metadata").exists(), handed
        assert handed.endswith(f"step_{step:06d}"), line
    text = (h.home / "jobs" / "dcp" / "events.jsonl").read_text()
    events = [json.loads(x) for x in text.splitlines()]
    assert sum(e["event"] == "relaunched" for e in events) == KILLS
    print(f"partial checkpoints seen by status: {partial_seen}")


def _log(h: Harness, run: int) -> str:
    path = h.home / "jobs" / "dcp" / "logs" / f"run-{run}.log"
    return path.read_text() if path.exists() else ""
