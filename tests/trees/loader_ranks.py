"""Ranks that need their loader children alive to finish a step and checkpoint (stdlib).

Usage: loader_ranks.py OUT_DIR [--ranks N] [--launcher] [--finish S]

It models what breaks PyTorch jobs under an everyone-at-once stop:

- each rank forks two *loaders* (like DataLoader workers) that answer requests over a
  pipe and die on SIGTERM (default action);
- a rank catches SIGTERM/SIGINT, then finishes its step: it keeps asking its loaders for
  batches for S seconds (0.3), writes OUT_DIR/rank<R>.ckpt atomically, shuts its loaders
  down itself and exits 0. If a loader died under it, it writes OUT_DIR/rank<R>.crash
  ("loader killed") and exits 1 without a checkpoint, as a real rank would raise;
- ``--launcher``: main is a torchrun-like agent. It starts N ranks, each in its own
  session, catches SIGTERM and forwards it to each rank's process group (which would
  reach the loaders too), then waits for them and exits 0 when every rank did. Without
  it, main itself is the single rank (plain ``python train.py`` with loaders).
"""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import child_flag, ready, wait_files  # noqa: E402

out = sys.argv[1]
opts = sys.argv[2:]
ranks = int(opts[opts.index("--ranks") + 1]) if "--ranks" in opts else 2
finish_s = float(opts[opts.index("--finish") + 1]) if "--finish" in opts else 0.3
stop = False


def on_stop(_sig: int, _frame: object) -> None:
    global stop
    stop = True


def loader(req: int, rep: int) -> None:
    while True:
        msg = os.read(req, 1)
        if not msg or msg == b"q":
            os._exit(0)
        os.write(rep, b"b")


def start_loader() -> tuple[int, int, int]:
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # like a DataLoader worker
        os.close(req_w)
        os.close(rep_r)
        loader(req_r, rep_w)
    os.close(req_r)
    os.close(rep_w)
    return pid, req_w, rep_r


def batch(loaders: list[tuple[int, int, int]]) -> bool:
    """One batch from every loader; False if one of them is dead."""
    for _pid, req_w, rep_r in loaders:
        try:
            os.write(req_w, b"x")
        except BrokenPipeError:
            return False
        if os.read(rep_r, 1) != b"b":
            return False
    return True


def rank(r: int, *, announce: bool = False) -> None:
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    loaders = [start_loader() for _ in range(2)]
    open(child_flag(f"rank{r}"), "w").close()
    if announce:
        ready()
    step = 0
    while not stop:
        if not batch(loaders):
            crash(r, step)
        step += 1
        time.sleep(0.01)
    deadline = time.monotonic() + finish_s  # finish the step: loaders still needed
    while time.monotonic() < deadline:
        if not batch(loaders):
            crash(r, step)
        time.sleep(0.01)
    tmp = os.path.join(out, f"rank{r}.ckpt.tmp")
    with open(tmp, "w") as f:
        f.write(f"step {step}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(out, f"rank{r}.ckpt"))
    for pid, req_w, _ in loaders:
        os.write(req_w, b"q")
        os.waitpid(pid, 0)
    print(f"rank {r}: checkpoint at step {step}", flush=True)
    os._exit(0)


def crash(r: int, step: int) -> None:
    with open(os.path.join(out, f"rank{r}.crash"), "w") as f:
        f.write(f"loader killed at step {step}\n")
    print(f"rank {r}: RuntimeError: loader killed by signal at step {step}", flush=True)
    os._exit(1)


def launcher() -> None:
    pids = []
    for r in range(ranks):
        pid = os.fork()
        if pid == 0:
            os.setsid()
            rank(r)
        pids.append(pid)

    def forward(sig: int, _frame: object) -> None:
        for pid in pids:
            try:
                os.killpg(pid, sig)  # what torchrun's agent does
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    wait_files([child_flag(f"rank{r}") for r in range(ranks)], 30)
    ready()
    codes = []
    for pid in pids:
        while True:
            try:
                codes.append(os.waitpid(pid, 0)[1])
                break
            except InterruptedError:
                continue
    sys.exit(0 if all(c == 0 for c in codes) else 1)


if "--launcher" in opts:
    launcher()
else:
    rank(0, announce=True)
