"""`stop --dry-run`: what a stop would do to a job now, changing nothing.

The same planner the supervisor's stop runs (supervisor/tree/forest.py) names, for each live
member, whether it is signalled at once, once its parent has exited, or (a launcher such
as torchrun) once its workers are gone. Nothing is signalled and nothing is written.
"""

from __future__ import annotations

import signal
from pathlib import Path

from trainctl.launcher.checkpoint import newest_checkpoint
from trainctl.launcher.gpus import gpu_memory_by_pid
from trainctl.launcher.results import PlannedProc, StopPlan
from trainctl.supervisor.errors import TrainctlError
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model import state
from trainctl.supervisor.model.spec import Spec, StopOrder
from trainctl.supervisor.tree.forest import stop_roles
from trainctl.supervisor.tree.proctree import Member, scan, target_of

from . import queue
from .jobs import current_phase, existing_job


def at_options(spec: Spec | None, live: list[Member]) -> tuple[list[str], dict[str, str]]:
    """Which of --at now|checkpoint|next-checkpoint this job can do now, and why not.

    ``checkpoint`` needs a glob and a live process that catches the checkpoint signal (a
    plan never promises a signal nobody catches); ``next-checkpoint`` needs a glob."""
    can, cannot = ["now"], {}
    if spec is None or not spec.watch.checkpoint:
        why = "the spec names no `checkpoint` glob"
        return can, {"checkpoint": why, "next-checkpoint": why}
    sig = signal.Signals[spec.watch.checkpoint_signal]
    if any(procfs.catches(m.ref.pid, sig) for m in live):
        can.append("checkpoint")
    else:
        cannot["checkpoint"] = f"no process of the job catches {sig.name}"
    can.append("next-checkpoint")
    return can, cannot


def plan_stop(home: Path, name: str) -> StopPlan:
    """The members and the order a stop would take now, the newest checkpoint, the GPUs."""
    queued = queue.read_entry(home, name) is not None
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    phase = current_phase(jdir, st)
    try:
        spec: Spec | None = state.read_spec(jdir)
    except TrainctlError:
        spec = None  # the stop itself works without it; so does its plan
    order = StopOrder(spec.stop.order) if spec else StopOrder.TREE
    sig = spec.stop.signal if spec else "SIGTERM"
    live = [m for m in scan(target_of(st)).values() if m.alive]
    roles = stop_roles(live, order, signal.Signals[sig], st.main)
    holders = set(gpu_memory_by_pid()) if live else set()  # who has a GPU open
    members = [
        PlannedProc(
            pid=m.ref.pid,
            ppid=m.stat.ppid,
            cmd=(procfs.read_cmdline(m.ref.pid) or f"[{m.stat.comm}]")[:300],
            role=roles.get(m.ref, "first"),
            gpu=m.ref.pid in holders,
        )
        for m in sorted(live, key=lambda m: m.ref.pid)
    ]
    ck = newest_checkpoint(spec, jdir, st.run) if spec and spec.watch.checkpoint else None
    can, cannot = at_options(spec, live)
    return StopPlan(
        can_at=can,
        cannot_at=cannot,
        checkpoint_step=ck.step if ck else None,
        dooms=queue.doomed_by_stop(home, name),
        name=name,
        run=st.run,
        state=str(phase),
        order=str(order),
        signal=sig,
        grace_s=spec.stop.grace_s if spec else 0.0,
        kill_wait_s=spec.stop.kill_wait_s if spec else 0.0,
        members=members,
        first=[p.pid for p in members if p.role == "first"],
        launchers=[p.pid for p in members if p.role.startswith("launcher")],
        gpus=[g.index for g in st.gpus],
        checkpoint_glob=spec.watch.checkpoint if spec else None,
        checkpoint=ck.path if ck else None,
        checkpoint_age_s=round(ck.age_s, 1) if ck else None,
        queued=queued,
    )
