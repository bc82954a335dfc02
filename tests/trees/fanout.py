"""A wide + deep tree: WIDTH children of main plus a DEPTH-long chain; all exit on SIGTERM.

Usage: fanout.py WIDTH DEPTH. Used by scripts/bench_stop.py (and a test at small size).
No process catches SIGTERM, so the tree order's first round is one killpg, as the
baseline's is.
"""

import os
import signal
import sys
import time

width, depth = int(sys.argv[1]), int(sys.argv[2])
ready_path = os.environ.get("TREE_READY", "")
r, w = os.pipe()


def child_loop() -> None:
    os.close(r)
    os.write(w, b"x")
    os.close(w)
    signal.pause()
    os._exit(0)


for _ in range(width):
    if os.fork() == 0:
        child_loop()
if os.fork() == 0:  # the chain
    for _ in range(depth - 1):
        if os.fork() != 0:
            child_loop()
    child_loop()
os.close(w)
need = width + depth
got = 0
while got < need:
    chunk = os.read(r, need)
    if not chunk:
        break
    got += len(chunk)
if ready_path:
    with open(ready_path + ".tmp", "w") as f:
        f.write(str(got))
    os.replace(ready_path + ".tmp", ready_path)
signal.signal(signal.SIGCHLD, lambda *_: None)
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    time.sleep(3600)
