"""The NVML backend: the only module that imports ``pynvml`` (package nvidia-ml-py).

Every NVML error is translated here, at the boundary, into NoDriverError or GpuError.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from trainctl.supervisor.errors import GpuError

from . import Gpu, GpuProc, NoDriverError

try:
    import pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
    pynvml = None

T = TypeVar("T")
_NO_DRIVER = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded", "NVMLError_NoPermission")


def _call(fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    except pynvml.NVMLError as e:
        if type(e).__name__ in _NO_DRIVER:
            raise NoDriverError(f"no NVIDIA driver found ({e})") from None
        raise GpuError(f"NVML: {e}") from None


class NvmlBackend:
    """GPUs through NVML."""

    def __init__(self) -> None:
        if pynvml is None:
            raise NoDriverError("no NVIDIA driver found (nvidia-ml-py is not installed)")
        _call(pynvml.nvmlInit)
        self._handles = [
            _call(pynvml.nvmlDeviceGetHandleByIndex, i)
            for i in range(_call(pynvml.nvmlDeviceGetCount))
        ]

    def gpus(self) -> list[Gpu]:
        """Return every GPU with its memory and utilisation."""
        out = []
        for i, h in enumerate(self._handles):
            mem = _call(pynvml.nvmlDeviceGetMemoryInfo, h)
            try:
                util: int | None = int(_call(pynvml.nvmlDeviceGetUtilizationRates, h).gpu)
            except GpuError:  # not supported on some MIG/vGPU setups
                util = None
            out.append(
                Gpu(
                    index=i,
                    uuid=str(_call(pynvml.nvmlDeviceGetUUID, h)),
                    name=str(_call(pynvml.nvmlDeviceGetName, h)),
                    memory_used_bytes=int(mem.used),
                    memory_total_bytes=int(mem.total),
                    utilization_pct=util,
                )
            )
        return out

    def processes(self, index: int) -> list[GpuProc]:
        """Return NVML's compute processes on GPU ``index``."""
        procs = _call(pynvml.nvmlDeviceGetComputeRunningProcesses, self._handles[index])
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            # NVML reports "not available" as None or as a huge sentinel value
            known = used if isinstance(used, int) and 0 <= used < (1 << 60) else None
            out.append(GpuProc(pid=int(p.pid), used_bytes=known))
        return out

    def device_paths(self) -> dict[str, int]:
        """Map /dev/nvidiaN (N = the device minor number) to the GPU index."""
        out = {}
        for i, h in enumerate(self._handles):
            try:
                out[f"/dev/nvidia{_call(pynvml.nvmlDeviceGetMinorNumber, h)}"] = i
            except GpuError:
                continue
        return out

    def close(self) -> None:
        """Shut NVML down; errors at shutdown are irrelevant."""
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
