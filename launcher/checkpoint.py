"""Checkpoints on disk: the newest one (a glob from the spec), and waiting for a new one.

Asking a job for a checkpoint is its backend's business (backends/local.py signals the
processes that catch the signal; the Slurm backend asks its node agents); both then wait
here for the file.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path

from trainctl.supervisor.errors import ProcessTreeError
from trainctl.supervisor.linux.poll import poll_until
from trainctl.supervisor.model import checkpoints
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.records import replace
from trainctl.supervisor.watch.runsteps import run_step_lookup

from .results import Checkpoint

CHECKPOINT_POLL_S = 0.5
NEXT_SAVE_POLL_S = 0.1  # --at next-checkpoint: the save is seen within this (a glob + a stat)


def step_lookup(jdir: Path, run: int, regex: str | None = None) -> Callable[[float], float | None]:
    """The run's progress step at a moment (the one rule: supervisor/watch/runsteps.py)."""
    return run_step_lookup(jdir, run, regex)


def _record(v: checkpoints.Verdict, spec: Spec) -> Checkpoint:
    return Checkpoint(
        user_path(spec, v.path), v.mtime, v.size, step=v.step, why=v.why,
        step_estimated=v.step_estimated,
    )  # fmt: skip


def user_path(spec: Spec, path: str) -> str:
    """A checkpoint path as the user knows it: a run in a snapshot reaches its relative
    checkpoint folder through a link to the source's (launcher/snapshot.py), so a
    path under the snapshot that is the source's own file is named by the source's path."""
    if spec.source is None or not path.startswith(spec.cwd.rstrip("/") + "/"):
        return path
    theirs = os.path.join(spec.source, os.path.relpath(path, spec.cwd))
    with contextlib.suppress(OSError):
        if os.path.samefile(theirs, path):
            return theirs
    return path


def checkpoint_view(
    spec: Spec, jdir: Path | None = None, run: int | None = None
) -> tuple[Checkpoint | None, Checkpoint | None]:
    """(the newest complete checkpoint, a newer partial one) of the spec's glob."""
    if not spec.watch.checkpoint:
        return None, None
    at = step_lookup(jdir, run, spec.watch.progress_regex) if jdir is not None and run else None
    found = checkpoints.newest(spec.cwd, spec.watch.checkpoint, at)
    done = _record(found.complete, spec) if found.complete else None
    partial = _record(found.partial, spec) if found.partial else None
    return done, partial


def newest_checkpoint(
    spec: Spec, jdir: Path | None = None, run: int | None = None
) -> Checkpoint | None:
    """The newest *complete* checkpoint of the spec's ``checkpoint`` glob (relative to
    cwd), judged by its format (supervisor/model/checkpoints.py); a partial one never counts."""
    return checkpoint_view(spec, jdir, run)[0]


SAVE_UNDER_WAY_POLL_S = 0.05  # a save in place: its end record is written within ms to seconds


def wait_complete(spec: Spec, timeout_s: float) -> Checkpoint | None:
    """The newest complete checkpoint, waiting up to ``timeout_s`` while there is none (a
    save in place under way: the file the glob names has no end record yet)."""
    return poll_until(lambda: newest_checkpoint(spec), timeout_s, SAVE_UNDER_WAY_POLL_S)


def wait_new_checkpoint(spec: Spec, asked_at: float, timeout_s: float) -> Checkpoint:
    """Wait for a complete checkpoint written after ``asked_at``."""

    def complete() -> Checkpoint | None:
        ck = newest_checkpoint(spec)
        return ck if ck is not None and ck.mtime >= asked_at - 0.01 else None

    ck = poll_until(complete, timeout_s, CHECKPOINT_POLL_S)
    if ck is None:
        raise ProcessTreeError(
            f"no new checkpoint matching {spec.watch.checkpoint!r} within {timeout_s:g} s "
            f"after {spec.watch.checkpoint_signal}; the job was left running"
        )
    return ck


def save_cadence(spec: Spec) -> float | None:
    """The usual time between saves: the median gap of the newest checkpoints' mtimes
    (None with fewer than two: one file rewritten in place shows no cadence)."""
    if not spec.watch.checkpoint:
        return None
    times = []
    for path in checkpoints.candidates(spec.cwd, spec.watch.checkpoint)[:8]:
        with contextlib.suppress(OSError):
            times.append(os.stat(path).st_mtime)
    gaps = sorted(a - b for a, b in itertools.pairwise(sorted(times, reverse=True)) if a > b)
    return gaps[len(gaps) // 2] if gaps else None


def wait_next_save(
    spec: Spec,
    asked_at: float,
    timeout_s: float,
    running: Callable[[], bool],
    cancelled: Callable[[], bool] = lambda: False,
) -> Checkpoint | None:
    """Wait, signalling nothing, for the trainer's own next *complete* checkpoint: one
    written after ``asked_at``. None when the job ended first (nothing left to wait for);
    ProcessTreeError when none came within ``timeout_s`` (the job is left as it was)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ck = newest_checkpoint(spec)
        if ck is not None and ck.mtime > asked_at:
            return ck
        if not running():
            return None
        if cancelled():
            raise ProcessTreeError("cancelled while waiting for the next checkpoint")
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProcessTreeError(
                f"no new complete checkpoint matching {spec.watch.checkpoint!r} within "
                f"{timeout_s:g} s; the job was left running, untouched"
            )
        time.sleep(min(NEXT_SAVE_POLL_S, left))


def with_step(
    ck: Checkpoint | None, jdir: Path, run: int, regex: str | None = None
) -> Checkpoint | None:
    """``ck`` with its step from the run's progress when its name carries none."""
    if ck is None or ck.step is not None:
        return ck
    step = step_lookup(jdir, run, regex)(ck.mtime)
    return replace(ck, step=step, step_estimated=step is not None)
