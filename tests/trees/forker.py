"""A main that ignores TERM and keeps forking children (which ignore TERM) while stopped."""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import ignore, ready  # noqa: E402

ignore(signal.SIGTERM)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # auto-reap; the point is the forking
n = 0
while True:
    if os.fork() == 0:
        # each child sleeps a while, some fork again
        if n % 3 == 0 and os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        time.sleep(600)
        os._exit(0)
    n += 1
    if n == 10:
        ready()
    time.sleep(0.02)
