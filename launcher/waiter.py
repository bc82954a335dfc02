"""A queued job's waiter: ``python -m trainctl.launcher.waiter HOME NAME TOKEN``.

Started, detached, by `trainctl start` when it queues a job (launcher/ops/queue.py says
how the queue works). Until it becomes the home's dispatcher it imports nothing of
trainctl and does nothing but sleep: one thread blocks in ``flock`` on the home's
``dispatch.lock``; the main thread looks once a second whether its entry is still queued
(a `stop` dequeues it; the dispatcher may have started it) and exits when it is not.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
from pathlib import Path

LOOK_S = 1.0


def _mine(entry: Path, token: str) -> int | None:
    """The entry's inode when it is the one this waiter was started for, else None."""
    try:
        with open(entry, "rb") as f:
            doc = json.loads(f.read())
            return os.fstat(f.fileno()).st_ino if doc.get("token") == token else None
    except (OSError, ValueError, AttributeError):
        return None


def _same(entry: Path, inode: int) -> bool:
    """Still queued, by the same entry: one stat (an entry is only ever replaced)."""
    try:
        return os.stat(entry).st_ino == inode
    except OSError:
        return False


def main(argv: list[str]) -> int:
    """Wait for the dispatcher's lock; then dispatch until our own job has started."""
    home, name, token = Path(argv[0]), argv[1], argv[2]
    qdir = home / "queue"
    entry = qdir / f"{name}.json"
    own = os.open(qdir / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(own, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # this entry has a waiter already
    inode = _mine(entry, token)
    if inode is None:
        return 0
    got = threading.Event()
    lock = os.open(qdir / "dispatch.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def take() -> None:
        fcntl.flock(lock, fcntl.LOCK_EX)
        got.set()

    threading.Thread(target=take, daemon=True).start()
    while not got.wait(LOOK_S):
        if not _same(entry, inode):
            return 0
    from trainctl.launcher.ops.dispatch import dispatch_loop  # noqa: PLC0415  (light until it dispatches)

    return dispatch_loop(home, name, token)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
