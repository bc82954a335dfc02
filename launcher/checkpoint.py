"""Checkpoints on disk: the newest one (a glob from the spec), and waiting for a new one.

Asking a job for a checkpoint is its backend's business (backends/local.py signals the
processes that catch the signal; the Slurm backend asks its node agents); both then wait
here for the file.
"""

from __future__ import annotations

import glob
import os

from trainctl.supervisor.errors import ProcessTreeError
from trainctl.supervisor.poll import poll_until
from trainctl.supervisor.spec import Spec

from .results import Checkpoint

CHECKPOINT_POLL_S = 0.5  # a checkpoint is complete once its size held for one poll


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


def wait_new_checkpoint(spec: Spec, asked_at: float, timeout_s: float) -> Checkpoint:
    """Wait for a checkpoint newer than ``asked_at`` whose size held for one poll."""
    last_size = [-1]

    def complete() -> Checkpoint | None:
        ck = newest_checkpoint(spec)
        if ck is None or ck.mtime < asked_at - 0.01:
            last_size[0] = -1
            return None
        if ck.size == last_size[0]:  # unchanged for one poll interval: complete
            return ck
        last_size[0] = ck.size
        return None

    ck = poll_until(complete, timeout_s, CHECKPOINT_POLL_S)
    if ck is None:
        raise ProcessTreeError(
            f"no new checkpoint matching {spec.watch.checkpoint!r} within {timeout_s:g} s "
            f"after {spec.watch.checkpoint_signal}; the job was left running"
        )
    return ck
