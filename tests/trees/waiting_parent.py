"""A parent written for Ctrl-C: on SIGTERM it just waits for its children to exit.

It catches SIGTERM (so it looks like it protects its children) but expects the signal to
reach them through the process group, as Ctrl-C would. Its two children exit on SIGTERM.
Every signal received is appended to $TREE_SIGNALS.
"""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import record_signal, ready  # noqa: E402

kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        while True:
            time.sleep(3600)
    kids.append(pid)
stop = False


def on_term(sig: int, frame: object) -> None:
    global stop
    record_signal(sig, frame)
    stop = True


signal.signal(signal.SIGTERM, on_term)
ready()
while not stop:
    time.sleep(0.05)
for pid in kids:
    os.waitpid(pid, 0)
print("children gone, exiting", flush=True)
