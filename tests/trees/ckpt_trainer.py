"""A trainer using trainctl.launcher.trainer: SIGUSR2 -> checkpoint, SIGTERM -> stop.

Usage: ckpt_trainer.py OUT_DIR [--agent]. With --agent the main process behaves like a
torchrun agent: it does NOT catch SIGUSR2 (its default action would kill it) and two
forked "ranks" do the training and checkpointing. Without it, the main trains and two
forked dataloader workers (default handlers) just wait. Every received signal is logged
to $TREE_SIGNALS.
"""

import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import forever, ready, record_signal  # noqa: E402

from trainctl.launcher import trainer  # noqa: E402

out, agent = sys.argv[1], "--agent" in sys.argv
os.makedirs(out, exist_ok=True)


def train(role: str) -> None:
    trainer.install_handlers()
    for sig in (signal.SIGUSR2, signal.SIGTERM):
        prev = signal.getsignal(sig)

        def chained(s: int, f: object, prev: object = prev) -> None:
            record_signal(s, f)
            prev(s, f)  # type: ignore[operator]

        signal.signal(sig, chained)
    step = 0
    while not trainer.should_stop():
        step += 1
        trainer.report(step=step, loss=round(4.0 / step, 4))
        if trainer.checkpoint_requested():
            tmp = os.path.join(out, f".{role}.tmp")
            with open(tmp, "w") as f:
                json.dump({"step": step, "role": role}, f)
            os.replace(tmp, os.path.join(out, f"ckpt-{role}-{step}.json"))
        time.sleep(0.02)
    sys.exit(0)


kids = []
for i in range(2):
    pid = os.fork()
    if pid == 0:
        if agent:
            train(f"rank{i}")
        forever()  # a dataloader worker: default handlers, never sees SIGUSR2
    kids.append(pid)
ready()
if agent:
    for pid in kids:
        os.waitpid(pid, 0)
    sys.exit(0)
train("main")
