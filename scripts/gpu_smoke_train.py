#!/usr/bin/env python3
"""The real 1-GPU job of scripts/gpu_smoke_train.sh: a training loop on cuda:0 that
saves its checkpoint in place on its own schedule (nanoGPT's shape: no signal handler),
logs one line per step, and resumes by its own flag. Nothing here knows about trainctl.

    python gpu_smoke_train.py OUT_DIR [--resume]
"""

import os
import sys
import time

import torch

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
ckpt = os.path.join(out, "ckpt.pt")
dev = torch.device("cuda", 0)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096)
).to(dev, torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
step = 0
if "--resume" in sys.argv and os.path.exists(ckpt):
    state = torch.load(ckpt, map_location=dev, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    step = state["step"]
    print(f"resumed from step {step}", flush=True)
while True:
    x = torch.randn(256, 4096, device=dev, dtype=torch.bfloat16)
    loss = (model(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if step % 50 == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
    print(f"step {step} loss {loss.item():.4f}", flush=True)
    time.sleep(0.01)
