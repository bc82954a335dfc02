"""Checkpoints: the newest one (a glob from the spec), and `stop --checkpoint`.

The checkpoint signal (SIGUSR2 by default) goes only to job processes that *catch* it, as
read from the SigCgt mask in /proc/<pid>/status: a process whose default action for it is
to terminate (a torchrun agent, for one) must never receive it. If no process catches it,
the request is refused before anything is signalled.
"""

from __future__ import annotations

import glob
import os
import signal
import time
from dataclasses import dataclass

from trainctl.supervisor import procfs
from trainctl.supervisor.errors import JobConflictError, ProcessTreeError
from trainctl.supervisor.spec import Spec
from trainctl.supervisor.state import JobState

from .jobs import live_members


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint file (or directory marker) on disk."""

    path: str
    mtime: float
    size: int

    @property
    def age_s(self) -> float:
        """Seconds since it was written."""
        return max(0.0, time.time() - self.mtime)


def newest_checkpoint(spec: Spec) -> Checkpoint | None:
    """Return the newest file matching the spec's ``checkpoint`` glob (relative to cwd)."""
    if not spec.watch.checkpoint:
        return None
    pattern = os.path.join(spec.cwd, spec.watch.checkpoint)
    best: Checkpoint | None = None
    for path in glob.glob(pattern, recursive=True):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if best is None or st.st_mtime > best.mtime:
            best = Checkpoint(path, st.st_mtime, st.st_size)
    return best


def request_checkpoint(st: JobState, spec: Spec, timeout_s: float) -> Checkpoint:
    """Signal the catching processes and wait for a new, complete checkpoint."""
    if not spec.watch.checkpoint:
        raise JobConflictError(
            f"job {st.name} has no `checkpoint` glob in its spec; "
            "cannot tell when a checkpoint is written"
        )
    sig = signal.Signals[spec.watch.checkpoint_signal]
    members = live_members(st)
    targets = [m for m in members.values() if procfs.catches(m.stat.pid, sig)]
    if not targets:
        raise JobConflictError(
            f"no process of job {st.name} catches {sig.name} ({len(members)} checked); "
            "refusing: nothing was signalled"
        )
    asked_at = time.time()
    sent = sum(procfs.send_signal(m.stat.pid, m.stat.start_ticks, sig) for m in targets)
    if not sent:
        raise ProcessTreeError(f"the {sig.name} catchers of job {st.name} are gone")
    return wait_new_checkpoint(spec, asked_at, timeout_s)


def wait_new_checkpoint(spec: Spec, asked_at: float, timeout_s: float) -> Checkpoint:
    """Wait for a checkpoint newer than ``asked_at`` whose size held for one poll."""
    deadline = time.monotonic() + timeout_s
    last_size = -1
    while time.monotonic() < deadline:
        ck = newest_checkpoint(spec)
        if ck is not None and ck.mtime >= asked_at - 0.01:
            if ck.size == last_size:  # unchanged for one poll interval: complete
                return ck
            last_size = ck.size
        else:
            last_size = -1
        time.sleep(0.5)
    raise ProcessTreeError(
        f"no new checkpoint matching {spec.watch.checkpoint!r} within {timeout_s:g} s after "
        f"{spec.watch.checkpoint_signal}; the job was left running"
    )


def describe(ck: Checkpoint | None, spec: Spec) -> str:
    """One human line about the newest checkpoint."""
    if not spec.watch.checkpoint:
        return ""
    if ck is None:
        return f"no checkpoint yet (matching {spec.watch.checkpoint!r})"
    rel = os.path.relpath(ck.path, spec.cwd)
    mins = ck.age_s / 60
    age = (
        f"{ck.age_s:.0f} s"
        if mins < 1
        else f"{mins:.0f} min"
        if mins < 120
        else f"{mins / 60:.1f} h"
    )
    return f"newest checkpoint: {rel} ({age} old)"
