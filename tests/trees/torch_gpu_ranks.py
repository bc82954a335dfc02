"""A torchrun DDP job (CPU, gloo) whose ranks each "use" one GPU the way CUDA does: rank
r keeps the device node of the r-th GPU in CUDA_VISIBLE_DEVICES open. Rank 0 saves every
20 steps and on SIGTERM (the stop's grace), marks each save complete, and a restart
resumes from $TRAINCTL_RESUME_FROM. Each rank writes OUT/run<N>-rank<r>.json.

    torchrun --nproc-per-node=$TRAINCTL_GPU_COUNT torch_gpu_ranks.py CKPT_DIR OUT_DIR
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainctl.launcher import trainer

ck, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
local = int(os.environ["LOCAL_RANK"])
gpu = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[local]
node = os.open(f"{os.environ['FAKE_DEV_DIR']}/nvidia{gpu}", os.O_RDWR)  # the "CUDA context"
trainer.install_handlers()
model = DDP(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
resume = trainer.resume_from()
if resume:
    step = torch.load(resume, weights_only=True)["step"]
run = os.environ["TRAINCTL_RUN"]
with open(os.path.join(out, f"run{run}-rank{rank}.json"), "w") as f:
    json.dump({"world": world, "gpu": gpu, "resume": resume, "first": step + 1}, f)


def save() -> None:
    if rank == 0:
        os.makedirs(ck, exist_ok=True)
        path = os.path.join(ck, f"step_{step:06d}.pt")
        torch.save({"model": model.module.state_dict(), "step": step}, path)
        trainer.mark_complete(path)
    dist.barrier()


while True:
    x = torch.randn(4, 8)
    loss = (model(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if rank == 0:
        trainer.report(step=step)
    stop = torch.tensor([int(trainer.should_stop())])
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    if stop.item() or step % 20 == 0:
        save()
    if stop.item():
        break
    time.sleep(0.02)
dist.destroy_process_group()
