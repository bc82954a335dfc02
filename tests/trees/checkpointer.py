"""A trainer that, on SIGTERM/SIGINT, writes a checkpoint taking SECONDS, atomically, then exits.

Usage: checkpointer.py OUT_DIR SECONDS. Every received signal is appended to $TREE_SIGNALS.
Two dataloader-like children exit on SIGTERM by default.
"""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import forever, ready, record_signal  # noqa: E402

out, secs = sys.argv[1], float(sys.argv[2])
stop = False


def on_signal(sig: int, frame: object) -> None:
    global stop
    record_signal(sig, frame)
    stop = True


for _ in range(2):
    if os.fork() == 0:
        forever()
signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
ready()
step = 0
while not stop:
    step += 1
    time.sleep(0.05)
tmp = os.path.join(out, "ckpt.tmp")
with open(tmp, "w") as f:
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:  # "serialising tensors"
        f.write(f"step {step}\n")
        f.flush()
        time.sleep(0.05)
    os.fsync(f.fileno())
os.replace(tmp, os.path.join(out, "ckpt.done"))
print(f"checkpoint written at step {step}", flush=True)
sys.exit(0)
