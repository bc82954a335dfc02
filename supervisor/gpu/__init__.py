"""GPU access behind one small protocol: NVML for real, a fake for tests, nothing otherwise.

- :mod:`.nvml` is the only module that imports ``pynvml`` (nvidia-ml-py).
- :mod:`.fake` is a **test double**, used only when ``TRAINCTL_FAKE_GPU`` names its JSON
  description, and refused when a real NVIDIA driver is present.
- :mod:`.holders` finds GPU-holding processes by their open ``/dev/nvidiaN`` fds, because
  NVML's pids cannot be trusted inside containers.
- :mod:`.verify` proves that a stopped job's GPUs were released.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

from trainctl.supervisor.errors import GpuError
from trainctl.supervisor.records import record

FAKE_ENV = "TRAINCTL_FAKE_GPU"
# What `gpus` and `doctor` say of a GPU without persistence mode
PERSISTENCE_OFF = (
    "every NVML start (each trainctl call that looks at GPUs) costs seconds; "
    "`nvidia-smi -pm 1` or nvidia-persistenced fixes it"
)
MIB = 1 << 20
GIB = 1 << 30


class NoDriverError(GpuError):
    """There is no NVIDIA driver (or no NVML library) on this machine."""


class GpuLostError(GpuError):
    """The driver has lost the GPU (NVML's GPU_IS_LOST: fallen off the bus, Xid 79)."""


@record(frozen=True)
class Gpu:
    """One GPU (or one MIG instance of it) as the driver reports it now.

    A GPU that cannot be read (fallen off the bus, a failing call) is still listed, with
    ``error`` saying why, so that one bad GPU never hides the other seven.
    """

    index: int  # nvidia-smi's index of the physical GPU
    uuid: str  # GPU-… or, for a MIG instance, MIG-…
    name: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_pct: int | None
    mig: int | None = None  # a MIG instance: its MIG device index on GPU ``index``
    mig_mode: bool | None = None  # a whole GPU: MIG on (then only its instances are leased)
    persistence: bool | None = None  # persistence mode (off: every NVML start costs seconds)
    ecc_uncorrected: int | None = None  # volatile uncorrected ECC errors since the driver load
    error: str | None = None  # why this GPU could not be read; the numbers above mean nothing
    lost: bool = False  # the driver has lost it (GPU_IS_LOST): gone until a reset or reboot
    # what the driver says this GPU needs now (nvmlGpuRecoveryAction_t; 0 none; gpu/xid.py),
    # None where the driver does not report it
    recovery_action: int | None = None

    @property
    def label(self) -> str:
        """Return how the GPU is named to people: ``3``, or ``3/1`` for MIG device 1 of GPU 3."""
        return f"{self.index}" if self.mig is None else f"{self.index}/{self.mig}"

    @property
    def leasable(self) -> bool:
        """Tell whether a job can be bound to it (a MIG-enabled GPU is bound per instance)."""
        return self.error is None and not self.mig_mode


@record(frozen=True)
class GpuProc:
    """A process the driver lists on a GPU (its pid may not exist here)."""

    pid: int
    used_bytes: int | None  # None: the driver does not say (some containers, MIG)
    kind: str = "compute"  # compute | graphics | mps


@record(frozen=True)
class DriverInfo:
    """The versions of the driver and of the NVML library that answered."""

    driver_version: str | None = None
    nvml_version: str | None = None
    note: str | None = None  # what this driver cannot do (e.g. no process list)


class XidSource(Protocol):
    """Critical Xid events (a GPU's fatal errors), as the driver reports them."""

    def wait(self, timeout_s: float) -> tuple[int, int] | None:
        """Return (GPU index, Xid) of the next event within ``timeout_s``, or None."""
        ...

    def close(self) -> None:
        """Stop watching."""
        ...


class GpuBackend(Protocol):
    """What trainctl needs from a GPU driver."""

    def gpus(self) -> list[Gpu]:
        """Return every GPU, in nvidia-smi index order, each MIG instance after its GPU."""
        ...

    def processes(self, gpu: Gpu) -> list[GpuProc]:
        """Return the processes the driver lists on ``gpu`` (compute, graphics and MPS)."""
        ...

    def driver(self) -> DriverInfo:
        """Return the driver's and the library's versions."""
        ...

    def xid_events(self, indices: list[int], others: Sequence[int] = ()) -> XidSource | None:
        """Return a watch of the critical Xid events on GPUs ``indices`` (None: no events),
        and on ``others`` where the driver lets (the box's GPUs no run of this watch holds)."""
        ...

    def device_paths(self) -> dict[str, int]:
        """Map device node paths (``/dev/nvidia3``) to GPU indices, for the fd scan."""
        ...

    def close(self) -> None:
        """Release the driver handle."""
        ...


def real_driver_present() -> bool:
    """Tell whether an NVIDIA kernel driver is loaded on this machine."""
    return os.path.exists("/proc/driver/nvidia/version")


def open_backend() -> GpuBackend:
    """Return the NVML backend, or the fake one when explicitly selected for tests.

    Raises NoDriverError when there is no driver, GpuError when NVML fails.
    """
    fake = os.environ.get(FAKE_ENV)
    if fake:
        if real_driver_present():
            raise GpuError(
                f"{FAKE_ENV} is set but a real NVIDIA driver is present; "
                "refusing to use the fake GPU backend (unset it)"
            )
        from .fake import FakeBackend  # noqa: PLC0415  (the test double: only when chosen)

        return FakeBackend(fake)
    from .nvml import NvmlBackend  # noqa: PLC0415  (pynvml: only when a GPU is asked about)

    return NvmlBackend()
