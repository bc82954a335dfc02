"""The checkpoint guard: no start of a job lets its checkpoint go back.

Real trainers resume by their own flag or folder scan far more often than by
``$TRAINCTL_RESUME_FROM``, and a run that starts over anyway (nanoGPT's
``--init_from=scratch`` left in its command line, a plain start that handed nothing)
rewrites ``ckpt.pt`` in place at its first save: iteration 1050 became 100 under a deploy,
a rollback and a restart, and HF's ``save_total_limit`` rotation deleted the newest
checkpoints of a run that started at step 0. So every start of a job whose ``checkpoint``
glob has a complete checkpoint, whichever verb or policy started it (``start``,
``restart``, ``deploy`` and its rollback, a policy restart, a GPU heal), goes through
:func:`plan` in the new run's supervisor before main exists:

1. the newest complete checkpoint is the job's high-water mark (its step, path and
   identity; recorded in the run's state as ``guard``); unless the run is ``--from-scratch``
   it is handed in ``$TRAINCTL_RESUME_FROM`` when the verb named none;
2. it is kept aside (:func:`keep_aside`): a reflink where the file system has one, a hard
   link where each save has a new name, else a copy up to ``checkpoint_keep_max``;
3. the run's first reported step ($TRAINCTL_PROGRESS, or ``progress_regex`` in its log) is
   watched (:class:`FirstStep`); one below the floor, less ``resume_tolerance``, stops the
   run at once with SIGKILL (a trainer that saves on SIGTERM would save its started-over
   state, and a save under way is not waited for), the kept copy goes back if the file was
   changed, the run's own checkpoints behind the floor are moved aside, and the job ends
   failed: ``started over at step 0; its checkpoint is at step 1050 (its command line says
   --init_from=scratch)``. No restart follows: it would start over again.

The floor is the handed checkpoint's step (a policy restart may hand the one before the
newest, once, when the run failed right after resuming from the newest), else the mark's.
A step the timed log estimates is a lower bound (the newest step logged before the file's
mtime), which can only loosen the guard, never stop a run that resumed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from pathlib import Path

from trainctl.supervisor.model import checkpoints, keepsafe
from trainctl.supervisor.model.reports import Guard
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.records import replace

from .runsteps import step_before
from .steplines import StepReader

KEPT_DIR = "kept"  # <job>/kept/run-N/: the copy the guard of run N kept aside
# the longest a start copies its checkpoint aside (a reflink or a link is instant): the
# CLI waits for the supervisor's answer (ready_timeout, 15 s), and ext4 copies ~0.3-0.5
# GiB/s here; the guard still stops a run that starts over, with or without the copy
KEEP_COPY_S = 5.0
FIRST_STEP_READ = 64 << 10  # the head of a file read per look for the first step
# a command line that starts over on purpose: the likely reason the guard names
_SCRATCH = (
    r"(?i)(?:^|[-_ /=])(?:from[-_]?scratch|init[-_]?from[= ]scratch|no[-_]?resume|fresh[-_]?start)"
    r"|resume(?:_from_checkpoint)?[= ](?:false|0|no|none|off)\b"
)


def _with_step(
    v: checkpoints.Verdict, jdir: Path, run: int, spec: Spec, started: float | None
) -> Guard:
    step, estimated = v.step, False
    if step is None:
        step, estimated = step_before(jdir, run, spec, v.mtime, started), True
    return Guard(v.path, v.mtime, v.size, step, estimated and step is not None)


def plan(
    jdir: Path, spec: Spec, run: int, handed: str | None, last_started: float | None = None
) -> Guard | None:
    """The guard of run ``run`` (nothing of the job runs now): the newest complete
    checkpoint and its step, the checkpoint handed (``handed``, else that one) and the
    step the run's first report must reach. ``last_started``: when run ``run - 1`` began
    (see :func:`step_before`). None when the job has no glob or no complete checkpoint."""
    pattern = spec.watch.checkpoint
    if not pattern:
        return None
    ones = checkpoints.complete_ones(spec.cwd, pattern, want=1, quiet=True)
    if not ones:
        return None
    mark = _with_step(ones[0], jdir, run - 1, spec, last_started)
    floor_of = mark
    if handed is not None and os.path.realpath(handed) != os.path.realpath(mark.path):
        v = checkpoints.judge(handed, look_again=False, quiet=True)
        good = v is not None and v.complete
        floor_of = _with_step(v, jdir, run - 1, spec, last_started) if v and good else mark
    tol = spec.watch.resume_tolerance
    floor = None if floor_of.step is None or tol is None else max(0.0, floor_of.step - tol)
    return replace(mark, handed=handed or mark.path, handed_step=floor_of.step, floor=floor)


def keep_aside(jdir: Path, run: int, spec: Spec, g: Guard) -> Guard:
    """Keep the mark's checkpoint aside under ``<job>/kept/run-N/`` (reflink, a hard link
    where each save has a new name, else a copy up to checkpoint_keep_max); the copies of
    earlier runs go once this one is kept. Never raises: the guard says why none was kept."""
    where = jdir / KEPT_DIR / f"run-{run}"
    dst = where / os.path.basename(g.path.rstrip("/"))
    try:
        for d in (where.parent, where):  # ours: 0700 whatever the umask
            d.mkdir(mode=0o700, exist_ok=True)
            os.chmod(d, 0o700)
        how = _keep(g, str(dst), spec)
    except TimeoutError:  # an OSError too: first
        how = None
        why = f"copying {g.size >> 20} MiB took over {KEEP_COPY_S:g} s (a start waits no longer)"
    except OSError as e:
        with contextlib.suppress(OSError):
            shutil.rmtree(where)
        return replace(g, not_kept=f"cannot keep {g.path} aside: {e.strerror or e}")
    else:
        cap = spec.watch.checkpoint_keep_max
        why = f"{g.size >> 20} MiB is over checkpoint_keep_max ({cap >> 20} MiB)"
    if how is None:
        with contextlib.suppress(OSError):
            shutil.rmtree(where)
        return replace(g, not_kept=f"{why}, and this file system has no reflinks")
    _drop_older(jdir, run)
    return replace(g, kept=str(dst), kept_how=how)


def would_keep(g: Guard, spec: Spec) -> str:
    """How :func:`keep_aside` would keep ``g`` (for a plan: nothing is touched)."""
    if not keepsafe.rewritten_in_place(spec.watch.checkpoint):
        return "hard link (a new name per save)"
    cap = spec.watch.checkpoint_keep_max
    if g.size > cap:
        return (f"a reflink if the file system has them; else not kept ({g.size >> 20} MiB "
                f"is over checkpoint_keep_max, {cap >> 20} MiB)")  # fmt: skip
    return f"a reflink, else a copy ({g.size >> 20} MiB)"


def scratch_flag(argv: tuple[str, ...] | list[str]) -> str | None:
    """The argument of a command line that says it starts over, if one does."""
    return next((a for a in argv if re.search(_SCRATCH, a)), None)


def _keep(g: Guard, dst: str, spec: Spec) -> str | None:
    """How ``g`` was kept at ``dst`` (None: it is too big to copy; TimeoutError: the
    copy took over KEEP_COPY_S)."""
    if not os.path.isdir(g.path):  # a reflink first: free, and safe from in-place writes
        with contextlib.suppress(OSError):
            if keepsafe.reflink(g.path, dst):
                return "reflink"
    if not keepsafe.rewritten_in_place(spec.watch.checkpoint):
        with contextlib.suppress(OSError):
            keepsafe.link_tree(g.path, dst)
            return "link"
    if g.size > spec.watch.checkpoint_keep_max:
        return None
    return keepsafe.clone(g.path, dst, time.monotonic() + KEEP_COPY_S)


def _drop_older(jdir: Path, run: int) -> None:
    """Remove the copies earlier runs kept: one kept checkpoint per job at a time."""
    with contextlib.suppress(OSError):
        for d in (jdir / KEPT_DIR).iterdir():
            if d.name != f"run-{run}":
                shutil.rmtree(d, ignore_errors=True)


def likely_reason(argv: tuple[str, ...] | list[str], handed: str | None) -> str:
    """Why a run probably started over, from its command line."""
    flag = scratch_flag(argv)
    if flag is not None:
        return f"its command line says {flag}"
    if handed:
        return f"it did not resume from $TRAINCTL_RESUME_FROM={handed}"
    return "it did not resume"


def tripped_line(g: Guard, first: float, argv: tuple[str, ...] | list[str]) -> str:
    """The cause of a run the guard stopped."""
    why = likely_reason(argv, g.handed)
    return f"started over at step {first:g}; its checkpoint is at {g.step_text()} ({why})"


def passed(g: Guard, first: float) -> Guard:
    """The run resumed (its first step ``first`` reached the floor): a copy it made is
    dropped (a reflink or a link costs nothing; a copy is disk); the guard's record."""
    if g.kept is None or g.kept_how in ("reflink", "link"):
        return replace(g, first_step=first)
    with contextlib.suppress(OSError):
        shutil.rmtree(Path(g.kept).parent)
    return replace(g, first_step=first, kept=None, not_kept=f"dropped: it resumed ({g.kept})")


def below_floor(g: Guard | None, first: float) -> bool:
    """The run's first step is below the guard's floor: it started over."""
    return g is not None and g.floor is not None and first < g.floor


def put_back(g: Guard, spec: Spec, since: float, tag: str) -> list[str]:
    """After a run the guard stopped: move aside its own complete checkpoints behind the
    mark (written since ``since``), and put the kept copy back if the mark's file was
    changed or removed. Returns what was done, a line each."""
    done = []
    pattern = spec.watch.checkpoint
    if pattern and g.step is not None:
        moved = keepsafe.reject_behind(spec.cwd, pattern, since, g.step, tag)
        if moved:
            done.append(f"moved aside its checkpoints behind {g.step_text()}: {', '.join(moved)}")
    if g.kept is not None and keepsafe.changed_since(g):
        keepsafe.restore(g.kept, g)
        done.append(f"put back {g.path} ({g.step_text()}) from the copy kept in {g.kept}")
    return done


class FirstStep:
    """The first step a run reports (steplines.py), looked for in the head of its
    $TRAINCTL_PROGRESS and, with a ``progress_regex``, its log."""

    def __init__(self, jdir: Path, run: int, regex: str | None) -> None:
        self._reader = StepReader(jdir, run, regex)

    def look(self) -> float | None:
        """The run's first reported step, once it has reported one."""
        steps = self._reader.look(FIRST_STEP_READ)
        return steps[0][1] if steps else None
