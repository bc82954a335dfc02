"""A job's stop, the same for every caller: the supervisor, the CLI when the supervisor is
gone, and the Slurm node agent.

It runs the stop algorithm (:mod:`.terminate`) with the spec's signal and durations, proves
the run's GPUs released, and removes the emptied cgroup. Nothing here writes the job's
state: callers record the typed :class:`StopReport` afterwards, best effort, because a
stop must never depend on a writable disk.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from trainctl.supervisor.gpu import GpuBackend
from trainctl.supervisor.gpu.verify import EarlyLook, GpuPolicy, gpu_policy_of, verify_release
from trainctl.supervisor.linux import cgroup as cg
from trainctl.supervisor.model import checkpoints
from trainctl.supervisor.model.events import Event
from trainctl.supervisor.model.reports import STARTED_OVER, StopReport
from trainctl.supervisor.model.spec import Spec, StopOrder, StopPolicy
from trainctl.supervisor.model.state import GpuLease
from trainctl.supervisor.records import asdict, replace

from .proctree import Target
from .roster import Roster
from .terminate import BeforeKill, Emit, Grace, stop_tree

SAVE_WAIT_MAX_S = 60.0  # a save under way is waited for at most this long (and the grace)
SAVE_POLL_S = 0.1


def _policy_of(
    spec: Spec, reason: str, grace_s: float | None, order: StopOrder | None
) -> StopPolicy:
    """The spec's stop policy with this stop's grace and order. The checkpoint guard's
    stop sends SIGKILL: the run started over, and any save of it (a handler's on SIGTERM)
    would overwrite the checkpoint it should have resumed from; no save is waited for."""
    policy = replace(
        spec.stop,
        grace_s=spec.stop.grace_s if grace_s is None else grace_s,
        order=spec.stop.order if order is None else str(order),
    )
    return replace(policy, signal="SIGKILL") if reason == STARTED_OVER else policy


def run_stop(
    target: Target,
    spec: Spec,
    *,
    reason: str,
    grace_s: float | None = None,
    order: StopOrder | None = None,
    leases: tuple[GpuLease, ...] = (),
    gpu_timeout_s: float | None = None,
    emit: Emit | None = None,
    grace: Grace | None = None,
    roster: Roster | None = None,
    before_kill: BeforeKill | None = None,
    gpu_memory: Callable[[], dict[str, int]] | None = None,
    gpu_backend: GpuBackend | None = None,
) -> StopReport:
    """Stop every process of the run and nothing else, prove its GPUs free; return the proof.

    The spec's stop policy applies, with this stop's ``grace_s`` and ``order`` if given.
    A supervisor hands over its ``roster`` (see :mod:`.roster`), how to read the GPU memory
    it last saw the run use (``gpu_memory``, {uuid: bytes}, read once the processes are
    gone: a look that was still starting when the stop began has its answer by then) and
    its open NVML (``gpu_backend``: the release check then initialises nothing).
    """
    policy = _policy_of(spec, reason, grace_s, order)
    quick = reason in ("main exited", STARTED_OVER)
    waited = None if quick else await_save(spec, policy.grace_s, emit)
    report = stop_and_verify(
        target,
        policy,
        leases=leases,
        gpu_policy=gpu_policy_of(spec, gpu_timeout_s),
        emit=emit,
        grace=grace,
        roster=roster,
        before_kill=before_kill,
        gpu_memory=gpu_memory,
        gpu_backend=gpu_backend,
    )
    report.reason = reason
    report.save_waited_s = waited
    if target.cgroup is not None:
        remove_cgroup(target.cgroup)
    return report


def await_save(spec: Spec, limit_s: float, emit: Emit | None = None) -> float | None:
    """Before a stop's first signal: while the job is writing its newest checkpoint, wait
    for the save to end (at most ``limit_s``, the grace, and SAVE_WAIT_MAX_S); return how
    long it waited, None when no save was under way.

    A trainer that saves in place with no signal handler (nanoGPT's shape: `torch.save`
    over the same ckpt.pt) dies on SIGTERM mid-save, and the file it leaves has no end
    record: the stop would destroy the run's only resume point, not just the steps since
    it (seen on a real H200 with scripts/gpu_smoke_train.sh). A save counts as under way
    while the newest match is incomplete and was touched within checkpoints.SETTLED_S.
    """
    pattern = spec.watch.checkpoint
    if not pattern or limit_s <= 0:
        return None
    found = _being_written(spec.cwd, pattern)
    if found is None:
        return None
    say = emit or (lambda *_a, **_k: None)
    t0 = time.monotonic()
    say("save_awaited", path=found.path, size=found.size, why=found.why)
    deadline = t0 + min(limit_s, SAVE_WAIT_MAX_S)
    while found is not None and time.monotonic() < deadline:
        time.sleep(SAVE_POLL_S)
        found = _being_written(spec.cwd, pattern)
    waited = round(time.monotonic() - t0, 3)
    say("save_ended" if found is None else "save_wait_over", waited_s=waited)
    return waited


def _being_written(cwd: str, pattern: str) -> checkpoints.Verdict | None:
    """The newest checkpoint matching ``pattern`` if it is being written now."""
    for path in checkpoints.candidates(cwd, pattern)[:1]:
        v = checkpoints.judge(path, look_again=False)
        if v is not None and not v.complete and time.time() - v.mtime < checkpoints.SETTLED_S:
            return v
    return None


def stop_and_verify(
    target: Target,
    policy: StopPolicy,
    *,
    leases: tuple[GpuLease, ...] = (),
    gpu_policy: GpuPolicy | None = None,
    emit: Emit | None = None,
    grace: Grace | None = None,
    roster: Roster | None = None,
    before_kill: BeforeKill | None = None,
    gpu_memory: Callable[[], dict[str, int]] | None = None,
    gpu_backend: GpuBackend | None = None,
) -> StopReport:
    """Stop the tree, then prove its GPUs were released; return the combined report.

    Signal first: nothing touches the GPU driver before the stop's first signal (one
    ``nvmlInit`` without persistence mode takes seconds). The first signals start an
    :class:`EarlyLook` (NVML opened, the memory in use read) beside the grace; the
    release is judged only once every process of the job is proven gone, and whatever
    the driver answers becomes a per-GPU verdict, never a failed stop.
    """
    say = emit or (lambda *_a, **_k: None)
    look = EarlyLook(leases, gpu_backend) if leases else None

    def emit_and_look(event: str | Event, **fields: object) -> None:
        say(event, **fields)
        if look is not None and event == "signal_sent":
            look.start()  # the first signals are out: the driver may be asked now

    report = stop_tree(
        target, policy, emit=emit_and_look, grace=grace, roster=roster, before_kill=before_kill
    )
    if look is not None:
        backend = look.finish()
        try:
            # the most each GPU was seen to hold: the supervisor's last look while the
            # job ran, or this stop's own at its first signal (a job that exits at once
            # has freed its memory by then)
            held = gpu_memory() if gpu_memory is not None else {}
            seen = {u: max(held.get(u, 0), look.memory.get(u, 0)) for u in {*held, *look.memory}}
            report.gpus = verify_release(
                leases, target.marker, seen, gpu_policy or GpuPolicy(), backend
            )
        finally:
            look.close()
        released = all(g.ok for g in report.gpus)
        report.ok = report.ok and released
        say("gpus_verified", ok=released, gpus=[asdict(g) for g in report.gpus])
    return report


def remove_cgroup(group: Path) -> None:
    """Remove the run's emptied cgroup (the kernel may need a moment after the last exit)."""
    if cg.is_ours(group):
        cg.remove_when_empty(group)
