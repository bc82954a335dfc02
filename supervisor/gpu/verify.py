"""Proof that a stopped job's GPUs were released.

Release is judged by per-GPU *memory* against the baseline recorded at start, never by
NVML's process list alone (inside containers it may be empty or list host pids), plus
the absence of any process of the job among the GPU's holders (NVML list + fd scan).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from trainctl.supervisor.errors import GpuError
from trainctl.supervisor.procfs import read_cmdline
from trainctl.supervisor.reports import GpuHolder, GpuRelease
from trainctl.supervisor.spec import Spec
from trainctl.supervisor.state import GpuLease

from . import GIB, MIB, Gpu, GpuBackend, open_backend
from .holders import classify_pid, find_holders, read_env_var


@dataclass(frozen=True, slots=True)
class GpuPolicy:
    """Durations and tolerances of the release check."""

    timeout_s: float = 30.0
    poll_s: float = 0.5
    tolerance_bytes: int = 512 * MIB


def gpu_policy_of(spec: Spec, timeout_s: float | None = None) -> GpuPolicy:
    """Return the release policy of a job (``timeout_s`` overrides the spec's)."""
    return GpuPolicy(
        timeout_s=spec.gpu.timeout_s if timeout_s is None else timeout_s,
        tolerance_bytes=spec.gpu.tolerance_mib * MIB,
    )


def fresh_baselines(leases: tuple[GpuLease, ...]) -> list[GpuLease]:
    """Return the same GPUs with their memory use now as the baseline (for a relaunch)."""
    now = snapshot(leases)
    if not isinstance(now, dict):
        return list(leases)
    return [
        GpuLease(g.index, g.uuid, g.name, now.get(g.index, g.baseline_used_bytes)) for g in leases
    ]


def snapshot(leases: tuple[GpuLease, ...]) -> dict[int, int] | str:
    """Return {index: memory used} for the leased GPUs now, or an error text."""
    if not leases:
        return {}
    try:
        backend = open_backend()
    except GpuError as e:
        return str(e)
    try:
        return {g.index: g.memory_used_bytes for g in backend.gpus()}
    except GpuError as e:
        return str(e)
    finally:
        backend.close()


def holders_of(index: int, backend: GpuBackend) -> list[GpuHolder]:
    """Return everyone on GPU ``index``: NVML's list joined with the fd scan."""
    fd = find_holders(backend.device_paths()).get(index, set())
    seen: dict[int, str] = {pid: "fd" for pid in fd}
    used: dict[int, int | None] = dict.fromkeys(fd)
    for p in backend.processes(index):
        how = classify_pid(p.pid, fd)
        seen[p.pid] = "nvml+fd" if how == "visible" else f"nvml ({how})"
        used[p.pid] = p.used_bytes
    out = []
    for pid in sorted(seen):
        h = GpuHolder(pid, used[pid], seen[pid])
        if seen[pid] in ("fd", "nvml+fd"):  # only a confirmed local process is read
            h.marker = read_env_var(pid, "TRAINCTL_JOB")
            h.cmd = read_cmdline(pid)[:160]
        out.append(h)
    return out


def verify_release(
    leases: tuple[GpuLease, ...], marker: str, pre: dict[int, int] | str, policy: GpuPolicy
) -> list[GpuRelease]:
    """Wait until every leased GPU is back near its baseline with no job process on it."""
    if not leases:
        return []
    t0 = time.monotonic()
    deadline = t0 + policy.timeout_s
    done: dict[int, GpuRelease] = {}
    while True:
        try:
            backend = open_backend()
        except GpuError as e:
            return [GpuRelease(lease.index, error=str(e)) for lease in leases]
        try:
            gpus = {g.index: g for g in backend.gpus()}
            for lease in leases:
                if lease.index in done:
                    continue
                res = _check(lease, gpus.get(lease.index), backend, marker, policy)
                if res.ok:
                    res.seconds = round(time.monotonic() - t0, 2)
                    if isinstance(pre, dict) and lease.index in pre:
                        res.released_bytes = max(0, pre[lease.index] - (res.used_bytes or 0))
                    done[lease.index] = res
                elif time.monotonic() >= deadline:
                    done[lease.index] = res
        except GpuError as e:
            for lease in leases:
                done.setdefault(lease.index, GpuRelease(lease.index, error=str(e)))
        finally:
            backend.close()
        if len(done) == len(leases):
            return [done[lease.index] for lease in leases]
        time.sleep(min(policy.poll_s, max(0.0, deadline - time.monotonic())))


def _owner(holder: GpuHolder, marker: str) -> str:
    if holder.cmd is None:
        return "not visible here"
    if holder.marker == marker:
        return "this job"
    return "another trainctl job or orphan" if holder.marker else "foreign"


def _check(
    lease: GpuLease, gpu: Gpu | None, backend: Any, marker: str, policy: GpuPolicy
) -> GpuRelease:
    if gpu is None or gpu.uuid != lease.uuid:
        return GpuRelease(
            lease.index, error=f"GPU {lease.index} ({lease.uuid}) is no longer visible"
        )
    holders = holders_of(lease.index, backend)
    for h in holders:
        h.owner = _owner(h, marker)
    ours = [h for h in holders if h.marker == marker]
    excess = gpu.memory_used_bytes - lease.baseline_used_bytes
    res = GpuRelease(
        lease.index,
        ok=not ours and excess <= policy.tolerance_bytes,
        uuid=lease.uuid,
        used_bytes=gpu.memory_used_bytes,
        baseline_bytes=lease.baseline_used_bytes,
        job_holders=ours,
    )
    if not res.ok:
        res.holders = holders
        res.excess_bytes = max(0, excess)
        if not holders:
            res.note = (
                f"NVML lists no process (container PID namespace?) while "
                f"{excess / GIB:.1f} GiB above the baseline are still in use"
            )
    return res
