"""`trainctl report` against the log's own times (issue 54 §7) for a 2-rank torchrun job
of nanoGPT's shape (gloo on CPU): rank 0 saves ``ckpt.pt`` in place every 10 iterations
and prints ``iter N ... at T`` (its own clock, which trainctl never reads), resumes by its
own flag. Rank 1 is SIGKILLed mid-run; the restart policy relaunches it; then a stop.

The truth, as in tests/keeper/test_report_truth.py: the steps kept (the checkpoint's) at
the trainer's own time per step, over the job's time. The report had the rank kill's
start-up at 0.9 s against 5.7 s measured, and its restore at 0.9 s against 3.0 s."""

from __future__ import annotations

import itertools
import json
import re
import statistics
import sys
from pathlib import Path

import torch

from tests.conftest import Harness, kill_verified, wait_for
from tests.helpers import NEEDS_TORCH

pytestmark = NEEDS_TORCH
BIN = str(Path(sys.executable).parent)
TRAINER = """\
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
with open(f"rank{rank}.run{os.environ['TRAINCTL_RUN']}.pid", "w") as f:
    f.write(str(os.getpid()))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
os.makedirs("out", exist_ok=True)
it = 0
if "--init_from=resume" in sys.argv and os.path.exists("out/ckpt.pt"):
    it = torch.load("out/ckpt.pt", weights_only=True)["iter_num"]
dist.barrier()  # every rank has loaded before rank 0 saves again (at once, as nanoGPT does)
while True:
    if it % 10 == 0 and it > 0 and rank == 0:  # in place, on its own schedule, no handler
        torch.save({"model": model.module.state_dict(), "iter_num": it}, "out/ckpt.pt")
    time.sleep(0.05)
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0:
        print(f"iter {it}: loss {loss.item():.4f} at {time.time():.3f}", flush=True)
    it += 1
"""
LINE = re.compile(r"^(?:\[rank0\]:\s?)?iter (\d+): loss [\d.]+ at ([\d.]+)$", re.M)


def lines_of(h: Harness, run: int) -> list[tuple[float, int]]:
    p = h.home / "jobs" / "ddp" / "logs" / f"run-{run}.log"
    return [(float(t), int(n)) for n, t in LINE.findall(p.read_text())] if p.exists() else []


def test_report_agrees_with_the_logs_own_times_over_a_rank_kill(harness: Harness) -> None:
    h = harness
    d = h.tmp / "ddp"
    d.mkdir()
    (d / "train.py").write_text(TRAINER)
    h.tc(
        "start", "--name", "ddp", "--cwd", str(d), "--grace", "10",
        "--set", "checkpoint=out/ckpt.pt",
        "--set", r"progress_regex=iter (?P<step>\d+): loss (?P<loss>[\d.]+)",
        "--set", "restart=on-failure", "--set", "restart_backoff=0.5s",
        "--env", "OMP_NUM_THREADS=1",
        "--", f"{BIN}/torchrun", "--standalone", "--nproc-per-node", "2", "train.py",
        "--init_from=resume",
        timeout=60, check=True,
    )  # fmt: skip
    wait_for(lambda: len(lines_of(h, 1)) >= 85, 90, "run 1 to train past a save")
    rank1 = int((d / "rank1.run1.pid").read_text())
    mine = h.job_pids("ddp")
    assert rank1 in mine  # the job's own rank, found by its marker
    kill_verified(rank1, mine[rank1])
    wait_for(lambda: len(lines_of(h, 2)) >= 85, 120, "run 2 to resume and train")
    h.tc("stop", "ddp", timeout=60, check=True)
    g = h.tc("report", "ddp", "--json", check=True).json()

    starts, ends = {}, {}
    for raw in (h.home / "jobs" / "ddp" / "events.jsonl").read_text().splitlines():
        ev = json.loads(raw)
        if ev["event"] == "started":
            starts[ev["run"]] = ev["ts"]
        elif ev["event"] == "ended":
            ends[ev["run"]] = ev["ts"]
    one, two = lines_of(h, 1), lines_of(h, 2)
    step_s = statistics.median(
        b[0] - a[0] for pts in (one, two) for a, b in itertools.pairwise(pts)
    )
    kept = torch.load(d / "out" / "ckpt.pt", weights_only=True)["iter_num"]
    truth = kept * step_s / (ends[2] - starts[1])
    assert g["goodput"] is not None, g
    assert abs(g["goodput"] - truth) <= 0.03, (g["goodput"], truth, g)
    assert g["stopped_s"] == 0.0  # a failure and a relaunch: nobody stopped it
    # start-up and restore: each run's start to its first line (torchrun, gloo, torch)
    assert abs(g["lost_s"]["startup"] - (one[0][0] - starts[1])) <= 0.6, g["lost_s"]
    assert abs(g["lost_s"]["restore"] - (two[0][0] - starts[2])) <= 0.6, g["lost_s"]
    [cut] = [i for i in g["interruptions"] if i["run"] == 1]
    # torchrun names the rank it saw fail first: rank 1's SIGKILL, or (now and then)
    # rank 0's SIGABRT from gloo once its peer was gone
    assert re.search(r"rank (\d) killed by SIG(KILL|ABRT)", cut["cause"]), cut
    rank = re.search(r"rank (\d)", cut["cause"])
    assert rank is not None
    assert cut["cause"].count(f"rank {rank[1]}") == 1, cut  # named once
    assert abs(cut["steps_lost"] - (one[-1][1] - (two[0][1] - 1))) <= 1, (cut, one[-1], two[0])
