"""A real (CPU) PyTorch DDP trainer with DataLoader workers, for the stop-order tests.

Usage:
  torchrun --nproc-per-node 2 torch_train.py OUT_DIR        (ranks from torchrun's env)
  python torch_train.py OUT_DIR --plain                     (one process with loaders)
  python torch_train.py OUT_DIR --spawn 2                   (torch.multiprocessing.spawn;
                                                             main does not catch SIGTERM)
  ... --shielded-workers     DataLoader(worker_init_fn=trainer.loader_worker_init)

Each rank: gloo process group (for 2+ ranks), DDP over a small model, and
``DataLoader(num_workers=2, persistent_workers=True)``. On SIGTERM or SIGINT it finishes
its step (the ranks agree on stopping through an all-reduce, so no rank waits in a
collective the other never joins), then writes OUT_DIR/rank<R>.pt atomically. A worker
killed under a rank raises "DataLoader worker (pid N) is killed by signal" and the rank
dies without a checkpoint, which is what the `all` stop order causes.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from trainctl.launcher import trainer


class Numbers(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.001)  # a little I/O, so the workers are busy as real ones are
        return torch.full((8,), float(i % 7))


def run(rank: int, world: int, out: str, port: str, shielded: bool = False) -> None:
    trainer.install_handlers()  # SIGTERM/SIGINT only set a flag: the step finishes
    torch.set_num_threads(1)
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    model: torch.nn.Module = torch.nn.Linear(8, 1)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(
        Numbers(),
        batch_size=4,
        num_workers=2,
        persistent_workers=True,
        worker_init_fn=trainer.loader_worker_init if shielded else None,
    )
    step = 0
    for batch in loader:
        loss = model(batch).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step == 3:  # training for real, with its loaders up: the test may stop it now
            with open(os.path.join(out, f"rank{rank}.ready"), "w"):
                pass
        stop = torch.tensor([1.0 if trainer.should_stop() else 0.0])
        if world > 1:
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if stop.item():
            break
    time.sleep(0.5)  # "serialising a big model": the loaders are still alive meanwhile
    tmp = os.path.join(out, f"rank{rank}.pt.tmp")
    torch.save({"step": step, "model": model.state_dict()}, tmp)
    os.replace(tmp, os.path.join(out, f"rank{rank}.pt"))
    print(f"rank {rank}: checkpoint at step {step}", flush=True)
    if world > 1:
        dist.destroy_process_group()


def spawned(rank: int, world: int, out: str, port: str) -> None:
    run(rank, world, out, port)


def main() -> None:
    out, opts = sys.argv[1], sys.argv[2:]
    port = os.environ.get("TORCH_TEST_PORT", "29511")
    if "--spawn" in opts:
        import torch.multiprocessing as tmp  # noqa: PLC0415

        world = int(opts[opts.index("--spawn") + 1])
        tmp.spawn(spawned, args=(world, out, port), nprocs=world)
    elif "--plain" in opts:
        run(0, 1, out, port, shielded="--shielded-workers" in opts)
    else:
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), out, port)


if __name__ == "__main__":
    main()
