"""The trainer of scripts/bench_goodput.py: 2-rank DDP on CPU (gloo), a step every ~0.05 s,
a save every SAVE_EVERY steps (rank 0: torch.save, then trainctl's completion marker),
each step reported with its time. It resumes from $TRAINCTL_RESUME_FROM, else from the
newest checkpoint in its folder (so plain torchrun's restarts resume too: a fair peer).

It saves in place to OUT/ckpt.pt (as nanoGPT does), then writes OUT/ckpt.pt.complete.
Its "code" is the file ``mode`` beside it, read at start: ok..., scratch (ignores every
checkpoint: new code that starts over), importfail (dies before its first step).
SIGTERM finishes the step, saves and exits; it has no SIGUSR2 handler.

    torchrun --nproc-per-node 2 bench_goodput_trainer.py OUT SAVE_EVERY
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

out, save_every = sys.argv[1], int(sys.argv[2])
mode = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mode")).read().strip()  # noqa: SIM115
if mode == "importfail":
    raise ImportError("bench: the new code cannot be imported")
dist.init_process_group("gloo")
rank = dist.get_rank()
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
model = DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
ckpt = os.path.join(out, "ckpt.pt")
resume = os.environ.get("TRAINCTL_RESUME_FROM") or (ckpt if os.path.exists(ckpt) else None)
if resume and mode != "scratch":
    step = int(torch.load(resume, weights_only=True)["step"])


def save() -> None:
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "step": step}, ckpt)  # in place
        with open(ckpt + ".complete", "w"):
            pass
    dist.barrier()


progress = os.environ.get("TRAINCTL_PROGRESS") or os.path.join(out, "progress.jsonl")
while True:
    x = torch.randn(32, 64)
    loss = (model(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    time.sleep(0.04)
    if rank == 0:
        with open(progress, "a") as f:
            f.write(json.dumps({"step": step, "t": time.time()}) + "\n")
    flag = torch.tensor([1 if stop else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if step % save_every == 0 or flag.item():
        save()
    if flag.item():
        break
dist.destroy_process_group()
if os.environ.get("BENCH_FREEZE_AT_EXIT"):  # scripts/bench_exit.py's other arm only
    import gc

    gc.freeze()  # the final collection then walks none of the objects torch made
