"""Plain torchrun DDP with trainctl's helper (standard library only): a step is reported
to $TRAINCTL_PROGRESS, a checkpoint is saved when asked (SIGUSR2: `stop --at checkpoint`)
and on a stop (SIGTERM: finish the step, save, exit), marked complete, and a restart or a
deploy resumes from the checkpoint trainctl hands over ($TRAINCTL_RESUME_FROM).

    torchrun --nproc-per-node 2 train.py OUT_DIR
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainctl.launcher import trainer

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
trainer.install_handlers()  # SIGTERM/SIGINT -> should_stop(); SIGUSR2 -> checkpoint_requested()
torch.manual_seed(rank)
model = DDP(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
resume = trainer.resume_from()
if resume:
    state = torch.load(resume, weights_only=True)
    model.module.load_state_dict(state["model"])
    step = state["step"]
    if rank == 0:
        print(f"resumed from {resume} at step {step}", flush=True)


def save() -> None:
    """Rank 0 writes step_N.pt, then its marker: trainctl never hands a half-written one."""
    if rank == 0:
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"step_{step:06d}.pt")
        torch.save({"model": model.module.state_dict(), "step": step}, path)
        trainer.mark_complete(path)
    dist.barrier()


while True:
    x = torch.randn(16, 32)
    loss = (model(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if rank == 0:
        trainer.report(step=step, loss=loss.item())
    # every rank must agree before acting on a flag: a collective decides it
    flags = torch.tensor([trainer.checkpoint_requested(), trainer.should_stop()], dtype=torch.int)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    if flags[0] or flags[1]:
        save()
    if flags[1]:
        break
    time.sleep(0.02)
dist.destroy_process_group()
