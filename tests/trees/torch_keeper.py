"""Real (CPU, gloo) torchrun workers for the run-keeper tests.

Usage (under ``torchrun --standalone --nproc-per-node 2``):
  torch_keeper.py raise OUT_DIR   rank 1 raises after a first all-reduce; rank 0 waits in
                                  the next one. The entry point is wrapped in torchrun's
                                  ``@record``, as its docs ask, so the exception reaches
                                  the launcher's TORCHELASTIC_ERROR_FILE.
  torch_keeper.py plain OUT_DIR   no ``@record`` (most scripts): rank 1 raises a
                                  RuntimeError after a first all-reduce; rank 0 then dies in
                                  the next one of the peer's exit (gloo: connection closed).
  torch_keeper.py watchdog OUT_DIR  no ``@record``: rank 1 prints the lines c10d's NCCL
                                  watchdog prints (each ``[rank1]:``-prefixed), then aborts.
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


WATCHDOG = (
    "[rank1]:[E1202 03:12:09.123456 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=4, "
    "NumelOut=4, Timeout(ms)=600000) ran for 600017 milliseconds before timing out.",
    "[rank1]:[E1202 03:12:09.123999 ProcessGroupNCCL.cpp:1664] [PG 0 Rank 1] Exception "
    "(either an error or timeout) detected by watchdog at work: 5, last enqueued NCCL work: "
    "5, last completed NCCL work: 4.",
    "[rank1]: terminate called after throwing an instance of 'c10::DistBackendError'",
    "[rank1]:   what():  [PG 0 Rank 1] Process group watchdog thread terminated with "
    "exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
    "OpType=ALLREDUCE) ran for 600017 milliseconds before timing out.",
)


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
    if mode == "plain":
        if rank == 1:
            time.sleep(0.5)
            raise RuntimeError("shard 3 unreadable on rank 1")
        dist.all_reduce(t)  # never joined: dies of the peer's exit
    if mode == "watchdog":
        if rank == 1:
            time.sleep(0.5)
            for line in WATCHDOG:
                print(line, file=sys.stderr, flush=True)
            os.abort()
        time.sleep(600)
    if rank == 1:
        rank_one_sleeps()
    rank_zero_waits(t)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    (main if sys.argv[1] in ("plain", "watchdog") else record(main))()
