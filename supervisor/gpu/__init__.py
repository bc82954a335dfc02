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
from dataclasses import dataclass
from typing import Protocol

from trainctl.supervisor.errors import GpuError

FAKE_ENV = "TRAINCTL_FAKE_GPU"
MIB = 1 << 20
GIB = 1 << 30


class NoDriverError(GpuError):
    """There is no NVIDIA driver (or no NVML library) on this machine."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU as the driver reports it now."""

    index: int
    uuid: str
    name: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_pct: int | None


@dataclass(frozen=True, slots=True)
class GpuProc:
    """A compute process the driver lists on a GPU (its pid may not exist here)."""

    pid: int
    used_bytes: int | None  # None: the driver does not say (some containers, MIG)


class GpuBackend(Protocol):
    """What trainctl needs from a GPU driver."""

    def gpus(self) -> list[Gpu]:
        """Return every GPU, in nvidia-smi index order."""
        ...

    def processes(self, index: int) -> list[GpuProc]:
        """Return the compute processes the driver lists on GPU ``index``."""
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
