"""The supervisor's look at its run's GPUs: one NVML handle for the run's life.

It is opened in a worker thread after the run has started (never on the stop path), and
it *looks*: the memory each leased GPU uses (the stop's "released N GiB"), Xid events
and the volatile uncorrected ECC count. Each fault is returned as a line; the supervisor
records it. A driver that cannot be read costs the run nothing: the watch says so once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from trainctl.supervisor.errors import GpuError
from trainctl.supervisor.model.state import GpuLease

from . import GpuBackend, XidSource, open_backend, xid
from .xid import Fault


@dataclass(slots=True)
class GpuWatch:
    """An open backend plus an Xid event set for one run's leases."""

    leases: tuple[GpuLease, ...]
    backend: GpuBackend
    xids: XidSource | None
    memory: dict[str, int] = field(default_factory=dict)  # {uuid: bytes}, last look
    utilization: dict[str, int] = field(default_factory=dict)  # {uuid: %}, last look
    ecc: dict[int, int] = field(default_factory=dict)  # {index: count} at the first look
    sampled_at: float = 0.0

    @classmethod
    def open(cls, leases: tuple[GpuLease, ...]) -> GpuWatch:
        """Open NVML once for the run (slow without persistence mode: call from a thread)."""
        backend = open_backend()
        try:
            indices = sorted({g.index for g in leases})
            try:
                xids = backend.xid_events(indices)
            except GpuError:
                xids = None  # events not supported (some vGPUs): memory and ECC still work
            watch = cls(leases, backend, xids)
            watch.sample()
        except GpuError:
            backend.close()
            raise
        return watch

    def wait_xid(self, timeout_s: float) -> list[Fault]:
        """Wait up to ``timeout_s`` for an Xid on a leased GPU; the faults seen, classed by
        NVIDIA's action table (xid.py)."""
        if self.xids is None:
            time.sleep(timeout_s)
            return []
        got = self.xids.wait(timeout_s)
        if got is None:
            return []
        index, code = got
        if index not in {g.index for g in self.leases}:
            return []
        return [xid.classify(index, code)]

    def sample(self) -> list[str | Fault]:
        """Read the leased GPUs' memory and ECC counts; new faults (a GPU the driver cannot
        reach is lost: a reboot-class fault)."""
        faults: list[str | Fault] = []
        self.sampled_at = time.time()
        ours = {g.uuid for g in self.leases}
        indices = {g.index for g in self.leases}
        for gpu in self.backend.gpus():
            if gpu.uuid in ours and gpu.error is None:
                self.memory[gpu.uuid] = gpu.memory_used_bytes
                if gpu.utilization_pct is not None:
                    self.utilization[gpu.uuid] = gpu.utilization_pct
            if gpu.index not in indices or gpu.mig is not None:
                continue
            if gpu.error is not None and gpu.index not in self.ecc:
                self.ecc[gpu.index] = -1  # said once
                faults.append(xid.lost(gpu.index, gpu.error))
            count = gpu.ecc_uncorrected
            if count is None:
                continue
            first = self.ecc.setdefault(gpu.index, count)
            if first >= 0 and count > first:
                self.ecc[gpu.index] = count
                faults.append(
                    f"GPU {gpu.index}: {count - first} uncorrected ECC error(s) at {_hhmm()}"
                )
        return faults

    def close(self) -> None:
        """Release the event set and NVML."""
        if self.xids is not None:
            self.xids.close()
        self.backend.close()


def _hhmm() -> str:
    return time.strftime("%H:%M:%S")
