#!/usr/bin/env python3
"""A realistic stand-in for a multi-GPU training job (no GPU or torch needed).

Shape, as torchrun + DDP + DataLoader(num_workers=2) would have it:

    main (launcher / rank coordinator)
    ├── rank 0   multiprocessing "spawn"   ── 2 dataloader workers (fork)
    └── rank 1   multiprocessing "spawn"   ── 2 dataloader workers (fork)

Prints ``step | loss | samples/s`` lines; appends progress to $TRAINCTL_PROGRESS when set.
On SIGTERM or SIGINT it finishes the current step, then writes a checkpoint *atomically*
(temp file + fsync + rename) and exits 0. It resumes from that checkpoint when restarted.

Usage: demo_trainer.py [--out DIR] [--ranks N] [--workers N] [--steps N] [--ckpt-seconds S]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import queue
import random
import signal
import sys
import time
from multiprocessing.synchronize import Event

try:
    from trainctl.launcher import trainer
except ImportError:  # run without trainctl installed: same flags, no progress file
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "launcher"))
    import trainer  # type: ignore[no-redef]

stop_requested = False


def _request_stop(signum: int, _frame: object) -> None:
    # Handlers only set a flag: the loop acts at a step boundary.
    global stop_requested
    stop_requested = True


def loader_worker(rank: int, wid: int, batches: mp.Queue) -> None:  # type: ignore[type-arg]
    """Produce 'batches' forever (a forked dataloader worker; SIGTERM ends it)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # like torch workers: the rank decides
    rng = random.Random(rank * 100 + wid)
    while True:
        batches.put([rng.random() for _ in range(64)])


def rank_main(rank: int, workers: int, stop: Event, steps: mp.Value) -> None:  # type: ignore[type-arg]
    """One DDP rank: pull batches from its loader workers and 'train'."""
    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGINT, _request_stop)
    fork = mp.get_context("fork")
    batches: mp.Queue = fork.Queue(maxsize=8)  # type: ignore[type-arg]
    procs = [
        fork.Process(target=loader_worker, args=(rank, w, batches), daemon=True)
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    while not stop.is_set() and not stop_requested:
        try:
            batch = batches.get(timeout=0.2)  # never block forever: loaders may be gone
        except queue.Empty:
            continue
        sum(x * x for x in batch)  # the "forward pass"
        time.sleep(0.02)
        if rank == 0:
            with steps.get_lock():
                steps.value += 1
    for p in procs:
        p.terminate()
        p.join(5)


def save_checkpoint(out: str, step: int, loss: float) -> str:
    """Write the checkpoint atomically: a reader sees the old or the new one, never half."""
    os.makedirs(out, exist_ok=True)
    final = os.path.join(out, "checkpoint.json")
    tmp = final + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "loss": loss, "saved_at": time.time()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def load_step(out: str) -> int:
    """Return the step to resume from (0 without a checkpoint)."""
    try:
        with open(os.path.join(out, "checkpoint.json")) as f:
            return int(json.load(f)["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def start_helpers() -> None:
    """The two things `kill -- -PGID` gets wrong: an escaped helper and a stuck one."""
    pid = os.fork()
    if pid == 0:  # "metrics uploader": setsid + double fork, so not in our process group
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            while True:
                time.sleep(1)
        os._exit(0)
    os.waitpid(pid, 0)
    if os.fork() == 0:  # "prefetcher" stuck on a dead NFS mount: ignores SIGTERM
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            time.sleep(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="checkpoints")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0, help="stop after N steps (0 = never)")
    ap.add_argument(
        "--helpers",
        action="store_true",
        help="also start a setsid'd uploader (escapes the tree) and a stuck prefetcher that "
        "ignores SIGTERM (needs SIGKILL): what real jobs leave behind",
    )
    ap.add_argument(
        "--ckpt-seconds",
        type=float,
        default=0.5,
        help="how long writing the checkpoint takes (simulated)",
    )
    args = ap.parse_args()
    # SIGTERM/SIGINT -> stop flag, SIGUSR2 -> checkpoint flag (`trainctl stop --checkpoint`).
    # Only this process catches SIGUSR2: trainctl never sends it to the ranks, whose default
    # action for it would kill them.
    trainer.install_handlers()
    spawn = mp.get_context("spawn")
    stop = spawn.Event()
    steps = spawn.Value("i", 0)
    start_step = load_step(args.out)
    ranks = [
        spawn.Process(target=rank_main, args=(r, args.workers, stop, steps))
        for r in range(args.ranks)
    ]
    for p in ranks:
        p.start()
    if args.helpers:
        start_helpers()
    print(
        f"training: {args.ranks} ranks x {args.workers} loader workers, "
        f"resuming at step {start_step}",
        flush=True,
    )
    last_t, last_step, step, loss = time.monotonic(), 0, start_step, 4.0
    while not trainer.should_stop() and (not args.steps or step - start_step < args.steps):
        time.sleep(0.5)
        done = steps.value
        step = start_step + done
        loss = 4.0 * math.exp(-step / 400) + 0.05 * random.random() + 1.5
        now = time.monotonic()
        rate = (done - last_step) * 64 * args.ranks / (now - last_t)
        last_t, last_step = now, done
        print(f"step {step:6d} | loss {loss:.4f} | {rate:8.0f} samples/s", flush=True)
        trainer.report(step=step, loss=round(loss, 4), samples_per_s=round(rate))
        if trainer.checkpoint_requested():
            path = save_checkpoint(args.out, step, loss)
            print(f"checkpoint on request: {path} (step {step})", flush=True)
    stop.set()
    for p in ranks:
        p.join(10)
        if p.is_alive():  # a wedged rank must not block the checkpoint
            p.kill()
    print(f"stop requested at step {step}: writing checkpoint...", flush=True)
    time.sleep(args.ckpt_seconds)
    path = save_checkpoint(args.out, step, loss)
    print(f"checkpoint saved: {path} (step {step})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
