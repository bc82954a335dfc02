"""One relaunch planner (issue 55 §2): which GPUs the next run gets and which checkpoint
it is handed, or why it cannot go on, as a pure function of the facts.

Every path that starts a job's next run asks it: the supervisor's policy relaunch and a
deploy's rollback (service.py), `restart` and a deploy's new code (launcher/ops/start.py
``restart_gpus``), and the queue's dispatch of a restart. The same facts give the same
GPUs and the same checkpoint, whoever asks; the facts are gathered by each caller (the
files and the driver), the decision is here, and is unit-tested without either.

The rules:

- **GPUs.** The GPUs the run asked for, in order, less those a reset- or reboot-class
  fault made unhealthy and those a stop found still held (never started onto). With no
  ``min_gpus``, any one of them missing refuses (``gpus-lost``); with it, the run goes on
  on what is left, if at least ``min_gpus``; a GPU healthy again is taken back.
- **The checkpoint.** A verb's own choice when it names one (a deploy's checkpoint, a
  rollback to it); else the newest complete one; else the one before it, once, when the
  run that failed was handed the newest and failed before it saved anything newer (a
  checkpoint it cannot resume from); else none (a run with no complete checkpoint starts
  as its command line says, and the checkpoint guard has nothing to hold it to).
"""

from __future__ import annotations

from trainctl.supervisor.records import field, record

GPUS_LOST = "gpus-lost"  # too few healthy GPUs left (min_gpus, or all of them without it)


@record(frozen=True)
class Candidate:
    """A complete checkpoint, newest first in the facts."""

    path: str
    step: float | None = None
    mtime: float = 0.0
    size: int = 0


@record(frozen=True)
class Handed:
    """What the run that ended was handed (its guard's record): to tell whether the newest
    complete checkpoint is the very one it failed on."""

    path: str
    step: float | None = None
    mtime: float = 0.0  # the mark's identity, when ``path`` is the mark itself
    size: int = 0
    mark: str | None = None  # the newest complete one when that run started


@record(frozen=True)
class Facts:
    """Everything the decision depends on."""

    asked: tuple[str, ...] = ()  # the run's GPUs as asked, in order ("3", "3/1", "MIG-…")
    unhealthy: frozenset[str] = frozenset()  # faults on record (gpu/health.py)
    held: frozenset[str] = frozenset()  # still held after the stop (never started onto)
    min_gpus: int | None = None
    named: tuple[tuple[str, str], ...] = ()  # (GPU, what is wrong with it), for the words
    complete: tuple[Candidate, ...] = ()  # complete checkpoints, newest first
    failed: bool = False  # the run ended in a failure (not a user's stop)
    handed: Handed | None = None  # what that run was handed
    tried: frozenset[str] = frozenset()  # checkpoints already handed once after a failure
    tolerance: float | None = None  # steps: "the same checkpoint" within this
    pinned: str | None = None  # a verb's own choice of checkpoint


@record(frozen=True)
class Plan:
    """The next run's GPUs and checkpoint, or why there is no next run."""

    gpus: tuple[str, ...] = ()
    resume: str | None = None
    skipped: str | None = None  # the newest complete checkpoint, passed over once
    refused: str | None = None  # a reason code (GPUS_LOST), None when the run can go on
    why: str | None = None  # ... in words
    left_out: tuple[str, ...] = field(default_factory=tuple)  # asked GPUs it goes on without


def plan(f: Facts) -> Plan:
    """The next run, from the facts (pure)."""
    gpus, left_out, refused = _gpus(f)
    if refused is not None:
        return Plan(refused=GPUS_LOST, why=refused, left_out=left_out)
    resume, skipped = _resume(f)
    return Plan(gpus=gpus, resume=resume, skipped=skipped, left_out=left_out)


def _gpus(f: Facts) -> tuple[tuple[str, ...], tuple[str, ...], str | None]:
    """(the GPUs, those left out, why it cannot go on)."""
    out = f.unhealthy | f.held
    keep = tuple(g for g in f.asked if g not in out)
    left = tuple(g for g in f.asked if g in out)
    if not left:
        return keep, left, None
    if f.min_gpus is None or len(keep) < f.min_gpus:
        floor = f"min_gpus {f.min_gpus}" if f.min_gpus is not None else "min_gpus is not set"
        words = dict(f.named)
        named = ", ".join(
            f"GPU {g} is {words.get(g) or ('unhealthy' if g in f.unhealthy else 'still held')}"
            for g in left
        )
        return (), left, f"{named}: {len(keep)} of {len(f.asked)} GPU(s) left, {floor}"
    return keep, left, None


def _resume(f: Facts) -> tuple[str | None, str | None]:
    """(the checkpoint handed, the newest passed over)."""
    if f.pinned is not None:
        return f.pinned, None
    if not f.complete:
        return None, None
    newest = f.complete[0]
    if f.failed and _failed_on(newest, f.handed, f.tolerance):
        before = f.complete[1] if len(f.complete) > 1 else None
        if before is not None and before.path not in f.tried:
            return before.path, newest.path
    return newest.path, None


def _failed_on(v: Candidate, h: Handed | None, tolerance: float | None) -> bool:
    """``v`` is the checkpoint the failed run was handed: by step where both are known (a
    file rewritten in place keeps its path, so a path says nothing), else by identity."""
    if h is None:
        return False
    if v.step is not None and h.step is not None:
        return v.step <= h.step + (tolerance or 0.0)
    if v.path != h.path:
        return False
    return h.path != h.mark or (v.mtime, v.size) == (h.mtime, h.size)
