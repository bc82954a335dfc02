"""Real (CPU, gloo) torchrun workers for the run-keeper tests.

Usage (under ``torchrun --standalone --nproc-per-node 2``):
  torch_keeper.py raise OUT_DIR   rank 1 raises after a first all-reduce; rank 0 waits in
                                  the next one. The entry point is wrapped in torchrun's
                                  ``@record``, as its docs ask, so the exception reaches
                                  the launcher's TORCHELASTIC_ERROR_FILE.
  torch_keeper.py stall OUT_DIR   rank 1 sleeps (in ``rank_one_sleeps``) before joining an
                                  all-reduce that rank 0 is already waiting in; both ignore
                                  SIGTERM, so a stop's grace runs out with both alive.
Each rank writes OUT_DIR/rank<R>.ready once its process group is up.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def rank_one_sleeps() -> None:
    time.sleep(600)


def rank_zero_waits(t: torch.Tensor) -> None:
    dist.all_reduce(t)


@record
def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=900))
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    if mode == "stall":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (out / f"rank{rank}.ready").touch()
    print(f"rank {rank} ready", flush=True)
    if mode == "raise":
        if rank == 1:
            time.sleep(0.5)
            raise ValueError("bad batch at step 7 on rank 1")
        time.sleep(600)
    if rank == 1:
        rank_one_sleeps()
    rank_zero_waits(t)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
