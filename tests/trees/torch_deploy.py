"""A real (CPU, gloo) DDP trainer for the deploy test, run under ``torchrun
--nproc-per-node 2``: ``torch_deploy.py CKPT_DIR``.

It resumes from ``trainer.resume_from()`` (the checkpoint `trainctl deploy` waited for),
reports each step through ``trainer.report`` (rank 0), and checkpoints when asked
(SIGUSR2) or stopped (SIGTERM): the ranks agree on both through an all-reduce, so no
rank waits in a collective the other never joins. Rank 0 writes CKPT_DIR/ckpt-STEP.pt
atomically. The test edits VERSION and commits it.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from trainctl.launcher import trainer

VERSION = 1


def main() -> None:
    out = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    trainer.install_handlers()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    resume = trainer.resume_from()
    if resume:
        saved = torch.load(resume, weights_only=True)
        model.module.load_state_dict(saved["model"])
        step = int(saved["step"])
    print(f"rank {rank} v{VERSION} resumed={resume} step={step}", flush=True)
    while True:
        loss = model(torch.ones(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if rank == 0:
            trainer.report(step=step, loss=float(loss))
        wants = torch.tensor([float(trainer.checkpoint_requested()), float(trainer.should_stop())])
        dist.all_reduce(wants)
        if wants.sum() > 0 and rank == 0:
            tmp = os.path.join(out, ".ckpt.tmp")
            torch.save({"step": step, "model": model.module.state_dict()}, tmp)
            os.replace(tmp, os.path.join(out, f"ckpt-{step:06d}.pt"))
        if wants[1] > 0:
            break
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
