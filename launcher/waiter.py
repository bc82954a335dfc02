"""A queued job's waiter: ``python -m trainctl.launcher.waiter HOME NAME TOKEN``.

Started, detached, by `trainctl start` when it queues a job (launcher/ops/queue/entries.py
says how the queue works). Until it becomes the home's dispatcher it imports nothing of
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


Identity = tuple[int, int]  # (inode, ctime ns) of an entry file


def _identity(st: os.stat_result) -> Identity:
    # The inode alone is not enough: a name dequeued and queued again at once gets a new
    # file that often reuses the old one's inode number.
    return st.st_ino, st.st_ctime_ns


def _mine(entry: Path, token: str) -> Identity | None:
    """The entry's identity when it is the one this waiter was started for, else None."""
    try:
        with open(entry, "rb") as f:
            doc = json.loads(f.read())
            return _identity(os.fstat(f.fileno())) if doc.get("token") == token else None
    except (OSError, ValueError, AttributeError):
        return None


def _same(entry: Path, identity: Identity) -> bool:
    """Still queued, by the same entry: one stat (an entry is only ever replaced)."""
    try:
        return _identity(os.stat(entry)) == identity
    except OSError:
        return False


def _take_own(fd: int) -> bool:
    """Take the per-name lock. A waiter of the name's previous entry (dequeued, then the
    name queued again within a second) still holds it until its next look: wait for that
    look, then give up (the holder waits for this very entry: a second waiter)."""
    for _ in range(int(3 * LOOK_S / 0.05)):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            threading.Event().wait(0.05)
            continue
        return True
    return False


def main(argv: list[str]) -> int:
    """Wait for the dispatcher's lock; then dispatch until our own job has started."""
    home, name, token = Path(argv[0]), argv[1], argv[2]
    qdir = home / "queue"
    entry = qdir / f"{name}.json"
    own = os.open(qdir / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    if not _take_own(own):
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
    from trainctl.launcher.ops.queue.dispatch import dispatch_loop  # noqa: PLC0415  (light until it dispatches)

    return dispatch_loop(home, name, token)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
