"""`ps`: a job's live process tree, with CPU, memory, GPU use and what a stop would do."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psutil  # only `ps` pays for it: this module is loaded by the ps verb alone

from trainctl.launcher import backends
from trainctl.launcher.gpus import gpu_memory_by_pid
from trainctl.launcher.results import PsRow
from trainctl.supervisor.errors import JobNotFoundError, StateError, TrainctlError
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model import state
from trainctl.supervisor.model.spec import StopOrder
from trainctl.supervisor.tree.forest import stop_roles
from trainctl.supervisor.tree.proctree import scan, target_of

from .jobs import existing_job


def job_ps(home: Path, name: str, sample_s: float = 0.2) -> list[PsRow]:
    """Return the job's live process tree, parents before children (escapees at top level)."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    elsewhere = backends.of(st).seen(jdir, st).processes
    if elsewhere is not None:  # on the nodes that run them, as their agents published them
        return elsewhere
    members = {pid: m for pid, m in scan(target_of(st)).items() if m.alive}
    roles = _stop_roles(jdir, st, list(members.values()))
    procs: dict[int, psutil.Process] = {}
    for pid in members:
        try:
            procs[pid] = psutil.Process(pid)
            procs[pid].cpu_percent(None)
        except psutil.NoSuchProcess:
            continue
    gpu_mem = gpu_memory_by_pid() if procs else {}  # doubles as part of the CPU sample
    time.sleep(sample_s if procs else 0)
    rows: list[PsRow] = []
    for pid, depth in _tree_order(members):
        m = members[pid]
        try:
            cpu = procs[pid].cpu_percent(None) if pid in procs else 0.0
            rss = procs[pid].memory_info().rss if pid in procs else 0
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            cpu, rss = 0.0, 0
        rows.append(
            PsRow(
                pid=pid,
                ppid=m.stat.ppid,
                pgid=m.stat.pgid,
                sid=m.stat.sid,
                state=m.stat.state,
                cpu_percent=round(cpu, 1),
                rss_bytes=rss,
                escaped=m.escaped and "main" not in m.nets,
                nets=sorted(m.nets),
                cmd=procfs.read_cmdline(pid) or f"[{m.stat.comm}]",
                depth=depth,
                gpu_holder=pid in gpu_mem,
                gpu_bytes=gpu_mem.get(pid),
                stop_role=roles.get(m.ref, ""),
                unit=st.unit,
            )
        )
    return rows


def job_cwd(home: Path, name: str) -> str | None:
    """The job's working directory, when its spec is readable (for shorter commands)."""
    try:
        return state.read_spec(existing_job(home, name)).cwd
    except (StateError, JobNotFoundError):
        return None


def job_unit(home: Path, name: str) -> str | None:
    """The systemd scope of the job's current run, if it has one."""
    return state.read_state(existing_job(home, name)).unit


def _stop_roles(jdir: Path, st: state.JobState, live: list[Any]) -> dict[Any, str]:
    """What `stop` would do to each member now, under the job's own order and signal."""
    try:
        spec = state.read_spec(jdir)
    except TrainctlError:
        return {}  # ps still shows the tree; only the stop column stays empty
    order = StopOrder(spec.stop.order)
    return stop_roles(live, order, signal.Signals[spec.stop.signal], st.main)


def _tree_order(members: dict[int, Any]) -> list[tuple[int, int]]:
    kids: dict[int, list[int]] = {}
    roots = []
    for pid, m in sorted(members.items()):
        if m.stat.ppid in members:
            kids.setdefault(m.stat.ppid, []).append(pid)
        else:
            roots.append(pid)
    out: list[tuple[int, int]] = []
    stack = [(pid, 0) for pid in reversed(roots)]
    while stack:
        pid, depth = stack.pop()
        out.append((pid, depth))
        stack.extend((c, depth + 1) for c in reversed(kids.get(pid, [])))
    return out
