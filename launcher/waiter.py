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


def _mine(entry: Path, token: str) -> bool:
    try:
        return bool(json.loads(entry.read_bytes()).get("token") == token)
    except (OSError, ValueError, AttributeError):
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
    if not _mine(entry, token):
        return 0
    got = threading.Event()
    lock = os.open(qdir / "dispatch.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def take() -> None:
        fcntl.flock(lock, fcntl.LOCK_EX)
        got.set()

    threading.Thread(target=take, daemon=True).start()
    while not got.wait(LOOK_S):
        if not _mine(entry, token):
            return 0
    from trainctl.launcher.ops.dispatch import dispatch_loop  # noqa: PLC0415  (light until it dispatches)

    return dispatch_loop(home, name, token)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
