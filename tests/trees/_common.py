"""Helpers shared by the test process trees (stdlib only; each tree is run as a script)."""

from __future__ import annotations

import os
import signal
import time


def ready(extra: str = "") -> None:
    """Announce that the whole tree is up: create $TREE_READY (atomically)."""
    path = os.environ.get("TREE_READY")
    if path:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(extra or str(os.getpid()))
        os.replace(tmp, path)


def wait_files(paths: list[str], timeout_s: float = 30.0) -> None:
    """Wait until every path exists (children announce themselves this way)."""
    deadline = time.monotonic() + timeout_s
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise SystemExit(f"tree: children never announced: {paths}")
        time.sleep(0.01)


def child_flag(name: str) -> str:
    """Return a per-tree scratch path for a child's readiness flag."""
    base = os.environ.get("TREE_READY", f"/tmp/tree-{os.getpid()}")
    return f"{base}.{name}"


def ignore(*sigs: int) -> None:
    """Ignore the given signals."""
    for s in sigs:
        signal.signal(s, signal.SIG_IGN)


def forever() -> None:
    """Sleep until killed."""
    while True:
        time.sleep(3600)


def record_signal(sig: int, _frame: object) -> None:
    """Append the signal name to $TREE_SIGNALS (tests count deliveries)."""
    path = os.environ.get("TREE_SIGNALS")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {signal.Signals(sig).name}\n")
