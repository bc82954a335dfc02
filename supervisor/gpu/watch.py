"""The supervisor's look at its run's GPUs: one NVML handle for the run's life.

It is opened in a worker thread after the run has started (never on the stop path), and
it *looks*: the memory each leased GPU uses (the stop's "released N GiB"), Xid events
and the volatile uncorrected ECC count, and the driver's recovery action (what it says a
GPU needs now; it overrides the Xid table, gpu/xid.py). Xid events and recovery actions
are watched on every whole GPU of the box, not only the run's: a fault on a GPU no run
holds is still seen and recorded (the supervisor routes a fault by its GPU). Each fault
is returned; the supervisor records it. A driver that cannot be read costs the run
nothing: the watch says so.
"""

from __future__ import annotations

import time

from trainctl.supervisor.errors import GpuError
from trainctl.supervisor.model.state import GpuLease
from trainctl.supervisor.records import field, record

from . import Gpu, GpuBackend, XidSource, open_backend, xid
from .xid import Fault


@record()
class GpuWatch:
    """An open backend plus an Xid event set for one run's leases."""

    leases: tuple[GpuLease, ...]
    backend: GpuBackend
    xids: XidSource | None
    memory: dict[str, int] = field(default_factory=dict)  # {uuid: bytes}, last look
    utilization: dict[str, int] = field(default_factory=dict)  # {uuid: %}, last look
    ecc: dict[int, int] = field(default_factory=dict)  # {index: count} at the first look
    recovery: dict[int, int] = field(default_factory=dict)  # {index: action}, last look
    sampled_at: float = 0.0

    @classmethod
    def open(cls, leases: tuple[GpuLease, ...]) -> GpuWatch:
        """Open NVML once for the run (slow without persistence mode: call from a thread)."""
        backend = open_backend()
        try:
            indices = sorted({g.index for g in leases})
            others = [
                g.index
                for g in backend.gpus()
                if g.mig is None and g.error is None and g.index not in indices
            ]
            try:
                xids = backend.xid_events(indices, others)
            except GpuError:
                xids = None  # events not supported (some vGPUs): memory and ECC still work
            watch = cls(leases, backend, xids)
            watch.sample()
        except GpuError:
            backend.close()
            raise
        return watch

    def wait_xid(self, timeout_s: float) -> list[Fault]:
        """Wait up to ``timeout_s`` for an Xid on a GPU of the box; the faults seen, classed
        by NVIDIA's action table (xid.py), or by the driver's recovery action for that GPU
        where it reports one (read right after the event: it knows this very fault)."""
        if self.xids is None:
            time.sleep(timeout_s)
            return []
        got = self.xids.wait(timeout_s)
        if got is None or got[0] < 0:
            return []
        index, code = got
        fault = xid.classify(index, code)
        action = self._recovery_of(index)
        if action:
            self.recovery[index] = action
            fault = xid.from_recovery(index, action, fault) or fault
        return [fault]

    def _recovery_of(self, index: int) -> int | None:
        """The driver's recovery action for whole GPU ``index`` now (None: not reported)."""
        try:
            gpus = self.backend.gpus()
        except GpuError:
            return None
        return next((g.recovery_action for g in gpus if g.index == index and g.mig is None), None)

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
            if gpu.mig is None:
                faults.extend(self._recovery_changed(gpu))
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
                    f"GPU {gpu.index}: {count - first} uncorrected ECC error(s) at {hhmmss()}"
                )
        return faults

    def _recovery_changed(self, gpu: Gpu) -> list[Fault]:
        """A recovery action the driver newly asks for on ``gpu`` (said once per change)."""
        action = gpu.recovery_action or 0
        if self.recovery.get(gpu.index, 0) == action:
            return []
        self.recovery[gpu.index] = action
        fault = xid.from_recovery(gpu.index, action)
        return [fault] if fault is not None else []

    def close(self) -> None:
        """Release the event set and NVML."""
        if self.xids is not None:
            self.xids.close()
        self.backend.close()


def hhmmss() -> str:
    """The time of day as a GPU fault's line says it (``03:12:09``)."""
    return time.strftime("%H:%M:%S")
