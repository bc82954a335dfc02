#!/usr/bin/env python3
"""The job of scripts/gpu_smoke.sh: three processes that each allocate GIB GiB on the GPU.

A plain forked child and a setsid-escaped child are forked *before* CUDA is initialised
(CUDA does not survive fork); then each process, main included, allocates its share and
creates $SMOKE_DIR/<role>.ready. Runs until stopped.
"""

import os
import sys
import time

gib = float(os.environ.get("SMOKE_GIB", "2"))
out = os.environ["SMOKE_DIR"]


def allocate_and_wait(role: str) -> None:
    device = os.environ.get("SMOKE_DEVICE")
    if device:  # gpu_smoke.sh --double: the double counts an open device node as a context
        block = os.open(device, os.O_RDWR)
    else:
        import torch  # noqa: PLC0415  (after the forks: CUDA does not survive fork)

        block = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
        block.fill_(1)
        torch.cuda.synchronize()
    with open(os.path.join(out, f"{role}.ready"), "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(1)


if os.fork() == 0:
    allocate_and_wait("child")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        allocate_and_wait("escaped")
    os._exit(0)
allocate_and_wait("main")
sys.exit(0)
