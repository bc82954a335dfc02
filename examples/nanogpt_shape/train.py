"""A trainer of nanoGPT's shape (karpathy/nanoGPT's train.py, cut to its skeleton): no
signal handler, `ckpt.pt` rewritten in place every `eval_interval` iterations, resume by
its own flag (`--init_from=resume`), a log line per iteration. Nothing here knows about
trainctl: the spec (job.toml) tells trainctl where the checkpoint is and how to read the
step from the log.

    python train.py --out_dir=out --init_from=scratch|resume
"""

import os
import sys
import time

import torch

args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:])
out_dir = args.get("out_dir", "out")
init_from = args.get("init_from", "scratch")
eval_interval = int(args.get("eval_interval", "25"))
max_iters = int(args.get("max_iters", "100000"))
os.makedirs(out_dir, exist_ok=True)
ckpt_path = os.path.join(out_dir, "ckpt.pt")

torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
iter_num = 0
if init_from == "resume":
    ckpt = torch.load(ckpt_path, weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    iter_num = ckpt["iter_num"]
    print(f"resuming from iteration {iter_num}", flush=True)

while iter_num <= max_iters:
    if iter_num % eval_interval == 0 and iter_num > 0:
        torch.save(  # in place, as nanoGPT does: trainctl judges it by its zip end record
            {"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": iter_num},
            ckpt_path,
        )
    x = torch.randn(32, 64)
    loss = (model(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"iter {iter_num}: loss {loss.item():.4f}", flush=True)
    iter_num += 1
    time.sleep(0.02)
