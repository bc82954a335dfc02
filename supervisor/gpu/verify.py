"""Proof that a stopped job's GPUs were released.

Release is judged by per-GPU *memory* against the baseline recorded at start, never by
NVML's process list alone (inside containers it may be empty or list host pids), plus
the absence of any process of the job among the GPU's holders (NVML list + fd scan).

A check opens NVML once, and walks ``/proc/*/fd`` once per poll for all GPUs: without
persistence mode one ``nvmlInit`` takes seconds. It runs only after the stop's processes
are gone; no failure of the driver turns into anything but a per-GPU "not verified".
"""

from __future__ import annotations

import threading
import time

from trainctl.supervisor.errors import GpuError
from trainctl.supervisor.linux.procfs import read_cmdline
from trainctl.supervisor.model.reports import GpuHolder, GpuRelease
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import GpuLease
from trainctl.supervisor.records import record

from . import GIB, MIB, Gpu, GpuBackend, open_backend
from .holders import classify_pid, find_holders, read_env_var

FdScan = dict[int, set[int]]  # {gpu index: pids with its device node open}


@record(frozen=True)
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
        GpuLease(g.index, g.uuid, g.name, now.get(g.uuid, g.baseline_used_bytes), g.mig)
        for g in leases
    ]


def snapshot(leases: tuple[GpuLease, ...]) -> dict[str, int] | str:
    """Return {uuid: memory used} for the leased GPUs now, or an error text."""
    if not leases:
        return {}
    try:
        backend = open_backend()
    except GpuError as e:
        return str(e)
    try:
        return {g.uuid: g.memory_used_bytes for g in backend.gpus() if g.error is None}
    except GpuError as e:
        return str(e)
    finally:
        backend.close()


class EarlyLook:
    """NVML opened, and the leased GPUs' memory read, in a thread of its own started by
    a stop's first signal: while the job uses its grace, the driver's slow start (seconds
    without persistence mode) is paid, and the memory the job held is known for
    "released N GiB". Never before the signal: the stop waits for nothing here.
    """

    def __init__(self, leases: tuple[GpuLease, ...], backend: GpuBackend | None) -> None:
        self.leases, self.backend = leases, backend
        self.memory: dict[str, int] = {}
        self._owned = backend is None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin the look (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._look, name="gpu-look", daemon=True)
            self._thread.start()

    def _look(self) -> None:
        ours = {g.uuid for g in self.leases}
        try:
            if self.backend is None:
                self.backend = open_backend()
            gpus = self.backend.gpus()
        except GpuError:
            return  # the release check says why, per GPU
        self.memory = {g.uuid: g.memory_used_bytes for g in gpus if g.uuid in ours}

    def finish(self) -> GpuBackend | None:
        """Wait for the look (as long as NVML takes to answer); the open backend, if any."""
        if self._thread is not None:
            self._thread.join()
        return self.backend

    def close(self) -> None:
        """Close the backend this look opened (not one it was lent)."""
        if self._owned and self.backend is not None:
            self.backend.close()


def fd_scan(backend: GpuBackend) -> FdScan:
    """Walk ``/proc/*/fd`` once for every GPU's device node."""
    return find_holders(backend.device_paths())


def holders_of(gpu: Gpu, backend: GpuBackend, fds: FdScan | None = None) -> list[GpuHolder]:
    """Return everyone on ``gpu``: NVML's list joined with the fd scan (``fds``, or a new one)."""
    fd = (fd_scan(backend) if fds is None else fds).get(gpu.index, set())
    procs = backend.processes(gpu)
    if gpu.mig is not None:
        # The parent GPU's node is open in every instance's processes: on a MIG instance
        # the fd scan confirms NVML's pids, it does not add holders of its own.
        fd = fd & {p.pid for p in procs}
    seen: dict[int, str] = {pid: "fd" for pid in fd}
    used: dict[int, int | None] = dict.fromkeys(fd)
    for p in procs:
        how = classify_pid(p.pid, fd)
        kind = "" if p.kind == "compute" else f" {p.kind}"
        seen[p.pid] = f"nvml+fd{kind}" if how == "visible" else f"nvml{kind} ({how})"
        used[p.pid] = p.used_bytes
    out = []
    for pid in sorted(seen):
        h = GpuHolder(pid, used[pid], seen[pid])
        if seen[pid] == "fd" or seen[pid].startswith("nvml+fd"):  # a confirmed local process
            h.marker = read_env_var(pid, "TRAINCTL_JOB")
            h.cmd = read_cmdline(pid)[:160]
        out.append(h)
    return out


def verify_release(
    leases: tuple[GpuLease, ...],
    marker: str,
    pre: dict[str, int] | str,
    policy: GpuPolicy,
    backend: GpuBackend | None = None,
) -> list[GpuRelease]:
    """Wait until every leased GPU is back near its baseline with no job process on it.

    ``pre`` is the memory each GPU had while the job ran, if known ({uuid: bytes}): it
    makes "released N GiB" possible. NVML is opened once for the whole check, or not at
    all when the caller's ``backend`` is open already.
    """
    if not leases:
        return []
    t0 = time.monotonic()
    if backend is not None:
        return _poll(backend, leases, marker, pre, policy, t0)
    try:
        opened = open_backend()
    except GpuError as e:
        return [_unverified(lease, str(e)) for lease in leases]
    try:
        return _poll(opened, leases, marker, pre, policy, t0)
    finally:
        opened.close()


def _poll(
    backend: GpuBackend,
    leases: tuple[GpuLease, ...],
    marker: str,
    pre: dict[str, int] | str,
    policy: GpuPolicy,
    t0: float,
) -> list[GpuRelease]:
    deadline = t0 + policy.timeout_s
    done: dict[str, GpuRelease] = {}
    # the first looks come soon (a driver frees a context's memory within a fraction of a
    # second of its last process's exit), then every poll_s: a healing restart waited a
    # whole 0.5 s poll for memory freed 50 ms after the first look
    pause = min(0.05, policy.poll_s)
    while True:
        try:
            gpus = {g.uuid: g for g in backend.gpus()}
            by_slot = {(g.index, g.mig): g for g in gpus.values()}
            fds = fd_scan(backend)
            checked = []
            for lease in leases:
                if lease.uuid in done:
                    continue
                res = _check(lease, gpus, by_slot, backend, fds, marker, policy)
                checked.append(res)
                if res.ok:
                    res.seconds = round(time.monotonic() - t0, 2)
                    if isinstance(pre, dict) and lease.uuid in pre:
                        res.released_bytes = max(0, pre[lease.uuid] - (res.used_bytes or 0))
                    done[lease.uuid] = res
                elif res.error is not None or time.monotonic() >= deadline:
                    done[lease.uuid] = res
            # what this driver cannot do (no process list: proof by memory alone), asked
            # once a poll, after the process lists that find it out
            note = backend.driver().note
            for res in checked:
                res.note = res.note or note
        except GpuError as e:  # NVML as a whole stopped answering mid-check
            for lease in leases:
                done.setdefault(lease.uuid, _unverified(lease, str(e)))
        if len(done) == len(leases):
            return [done[lease.uuid] for lease in leases]
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, policy.poll_s)


def _unverified(lease: GpuLease, why: str) -> GpuRelease:
    return GpuRelease(lease.index, uuid=lease.uuid, mig=lease.mig, error=why)


def _owner(holder: GpuHolder, marker: str) -> str:
    if holder.cmd is None:
        return "not visible here"
    if holder.marker == marker:
        return "this job"
    return "another trainctl job or orphan" if holder.marker else "foreign"


def _check(
    lease: GpuLease,
    gpus: dict[str, Gpu],
    by_slot: dict[tuple[int, int | None], Gpu],
    backend: GpuBackend,
    fds: FdScan,
    marker: str,
    policy: GpuPolicy,
) -> GpuRelease:
    gpu = gpus.get(lease.uuid)
    if gpu is None:
        slot = by_slot.get((lease.index, lease.mig))
        if slot is not None and slot.error is not None:  # lost: its uuid cannot be read
            return _unverified(lease, slot.error)
        return _unverified(lease, f"GPU {lease.label} ({lease.uuid}) is no longer visible")
    if gpu.error is not None:
        return _unverified(lease, gpu.error)
    try:
        holders = holders_of(gpu, backend, fds)
    except GpuError as e:
        return _unverified(lease, str(e))
    for h in holders:
        h.owner = _owner(h, marker)
    ours = [h for h in holders if h.marker == marker]
    excess = gpu.memory_used_bytes - lease.baseline_used_bytes
    res = GpuRelease(
        lease.index,
        ok=not ours and excess <= policy.tolerance_bytes,
        uuid=lease.uuid,
        mig=lease.mig,
        used_bytes=gpu.memory_used_bytes,
        baseline_bytes=lease.baseline_used_bytes,
        job_holders=ours,
    )
    if not res.ok:
        res.holders = holders
        res.excess_bytes = max(0, excess)
        if ours:
            res.note = "held by the job's own pid(s) " + ", ".join(str(h.pid) for h in ours)
        elif not holders:
            res.note = (
                f"NVML lists no process (container PID namespace?) while "
                f"{excess / GIB:.1f} GiB above the baseline are still in use"
            )
    return res
