"""The NVML backend: the only module that imports ``pynvml`` (package nvidia-ml-py).

Every failure nvidia-ml-py can raise is translated here, at the boundary: into
NoDriverError (no driver here), GpuError (NVML as a whole cannot answer, with the cause
and the fix), or, for one GPU, into that GPU's ``error`` so that the others keep working.

Covered pitfalls of real boxes (each reproduced by tests/gpu/nvml_double.c):

- a driver older than the library: the unversioned process list raises
  ``NVMLLibraryMismatchError`` (12.575+, not an ``NVMLError``) or ``FunctionNotFound``
  (12.535); the ``_v2`` call is used instead, and where there is none the release is
  proven by memory alone, said once (``DriverInfo.note``);
- a GPU fallen off the bus (``GPU_IS_LOST``, Xid 79): that GPU only;
- a driver/library version mismatch (after a driver update, or a container whose
  libnvidia-ml is not the host driver's): one line with the cause and the fix;
- MIG: the instances of a MIG-enabled GPU are listed after it, each with its memory;
- the pid sentinel 0xFFFFFFFF (library and driver disagree) is never shown as a pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from trainctl.supervisor.errors import GpuError

from . import DriverInfo, Gpu, GpuLostError, GpuProc, NoDriverError

try:
    import pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
    pynvml = None

T = TypeVar("T")
# Where the GPUs' device nodes live (/dev/nvidiaN); a container may map them elsewhere.
DEV_DIR_ENV = "TRAINCTL_NVIDIA_DEV_DIR"
# A pid NVML reports when the library and the driver disagree on the struct layout.
_SENTINEL_PIDS = (0, 0xFFFFFFFF)
_MAX_MIG_DEVICES = 8


def _errors() -> tuple[type[BaseException], ...]:
    """Every exception class nvidia-ml-py raises for a driver's answer."""
    mismatch = getattr(pynvml, "NVMLLibraryMismatchError", None)  # 12.575 and newer
    return (pynvml.NVMLError,) if mismatch is None else (pynvml.NVMLError, mismatch)


def _code(e: BaseException) -> int | None:
    value = getattr(e, "value", None)
    return value if isinstance(value, int) else None


_MISMATCH = (
    "NVML: the NVIDIA driver and its library differ in version (driver/library version "
    "mismatch): after a driver update, reboot or reload the nvidia kernel modules; in a "
    "container, its libnvidia-ml must be the host driver's version"
)


def explain(e: BaseException, gpu: int | None = None) -> GpuError:
    """Return the one-line error a user gets for NVML's failure ``e`` (on GPU ``gpu``)."""
    code = _code(e)
    on = f"GPU {gpu}: " if gpu is not None else ""
    if code in (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED):
        return NoDriverError(f"no NVIDIA driver found (NVML: {e})")
    text = {
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: _MISMATCH,
        pynvml.NVML_ERROR_NO_PERMISSION: (
            f"NVML: {on}no permission to read the GPUs (the /dev/nvidia* nodes are not "
            "open to this user, or a container did not get them)"
        ),
        pynvml.NVML_ERROR_GPU_IS_LOST: (
            f"GPU {gpu if gpu is not None else '?'} lost (Xid 79?): it fell off the bus; "
            "it needs a GPU reset or a reboot"
        ),
        pynvml.NVML_ERROR_RESET_REQUIRED: f"{on}the GPU needs a reset (NVML: {e})",
        # NVMLLibraryMismatchError has no code: a call this driver does not have
        None: f"NVML: {on}this driver lacks a call the library needs ({e})",
    }.get(code, f"NVML: {on}{e}")
    return GpuLostError(text) if code == pynvml.NVML_ERROR_GPU_IS_LOST else GpuError(text)


def _call(fn: Callable[..., T], *args: Any, gpu: int | None = None) -> T:
    try:
        return fn(*args)
    except _errors() as e:
        raise explain(e, gpu) from None


def _missing(e: BaseException) -> bool:
    """Tell whether ``e`` says the driver lacks the function (an older driver)."""
    return _code(e) in (None, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


class NvmlBackend:
    """GPUs through NVML: initialised once, kept open until :meth:`close`."""

    def __init__(self) -> None:
        if pynvml is None:
            raise NoDriverError("no NVIDIA driver found (nvidia-ml-py is not installed)")
        _call(pynvml.nvmlInit)
        self._open = True
        self._dev_dir = os.environ.get(DEV_DIR_ENV, "/dev")
        self._note: str | None = None
        self._proc_calls: dict[str, str] = {}  # kind -> the call this driver has
        try:
            count = _call(pynvml.nvmlDeviceGetCount)
            self._handles: list[Any] = []
            for i in range(count):
                try:
                    self._handles.append(pynvml.nvmlDeviceGetHandleByIndex(i))
                except _errors() as e:
                    self._handles.append(explain(e, i))  # that GPU only
        except GpuError:
            self.close()
            raise
        self._mig: dict[int, list[Any]] = {}

    # ----------------------------------------------------------------- the GPUs

    def gpus(self) -> list[Gpu]:
        """Return every GPU (a failing one with its ``error``), MIG instances after each."""
        out: list[Gpu] = []
        for i, h in enumerate(self._handles):
            if isinstance(h, GpuError):
                out.append(_broken(i, h))
                continue
            try:
                gpu = self._read(i, h)
            except GpuError as e:
                out.append(_broken(i, e))
                continue
            out.append(gpu)
            if gpu.mig_mode:
                out += self._instances(i, h, gpu)
        return out

    def _read(self, i: int, h: Any, mig: int | None = None, parent: str = "") -> Gpu:
        mem = _call(pynvml.nvmlDeviceGetMemoryInfo, h, gpu=i)
        return Gpu(
            index=i,
            uuid=str(_call(pynvml.nvmlDeviceGetUUID, h, gpu=i)),
            name=parent or str(_call(pynvml.nvmlDeviceGetName, h, gpu=i)),
            memory_used_bytes=int(mem.used),
            memory_total_bytes=int(mem.total),
            utilization_pct=_optional(pynvml.nvmlDeviceGetUtilizationRates, h, "gpu"),
            mig=mig,
            mig_mode=None if mig is not None else self._mig_mode(h),
            persistence=None if mig is not None else _flag(pynvml.nvmlDeviceGetPersistenceMode, h),
            ecc_uncorrected=None if mig is not None else _ecc(h),
            recovery_action=None if mig is not None else _recovery(h),
        )

    def _mig_mode(self, h: Any) -> bool | None:
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(h)
        except _errors():  # not a MIG-capable GPU (NOT_SUPPORTED), or an old driver
            return None
        return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)

    def _instances(self, i: int, h: Any, gpu: Gpu) -> list[Gpu]:
        handles = self._mig.get(i)
        if handles is None:
            handles = []
            for m in range(_MAX_MIG_DEVICES):
                try:
                    handles.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, m))
                except _errors():  # NOT_FOUND: an empty slot
                    continue
            self._mig[i] = handles
        out = []
        for m, mh in enumerate(handles):
            try:
                out.append(self._read(i, mh, mig=m, parent=f"{gpu.name} MIG"))
            except GpuError as e:
                out.append(_broken(i, e, mig=m))
        return out

    def _handle(self, gpu: Gpu) -> Any:
        h = self._handles[gpu.index]
        if isinstance(h, GpuError):
            raise h
        if gpu.mig is None:
            return h
        if gpu.index not in self._mig:
            self.gpus()
        return self._mig[gpu.index][gpu.mig]

    # ------------------------------------------------------------ the processes

    def processes(self, gpu: Gpu) -> list[GpuProc]:
        """Return the compute, graphics and MPS processes NVML lists on ``gpu``."""
        h = self._handle(gpu)
        out: dict[int, GpuProc] = {}
        for kind in ("compute", "graphics", "mps"):
            for p in self._list(kind, h, gpu.index):
                pid = int(p.pid)
                if pid in _SENTINEL_PIDS or pid in out:
                    continue
                used = getattr(p, "usedGpuMemory", None)
                # NVML reports "not available" as None or as a huge sentinel value
                known = used if isinstance(used, int) and 0 <= used < (1 << 60) else None
                out[pid] = GpuProc(pid=pid, used_bytes=known, kind=kind)
        return list(out.values())

    def _list(self, kind: str, h: Any, index: int) -> list[Any]:
        """One kind's list, through the newest call this driver has (remembered)."""
        base = {
            "compute": "nvmlDeviceGetComputeRunningProcesses",
            "graphics": "nvmlDeviceGetGraphicsRunningProcesses",
            "mps": "nvmlDeviceGetMPSComputeRunningProcesses",
        }[kind]
        names = [self._proc_calls[kind]] if kind in self._proc_calls else [base, f"{base}_v2"]
        for name in names:
            fn = getattr(pynvml, name, None)
            if fn is None:
                continue
            try:
                procs: list[Any] = fn(h)
            except _errors() as e:
                if _missing(e):
                    continue  # a driver older than the library: try the older call
                if _code(e) == pynvml.NVML_ERROR_NOT_SUPPORTED:
                    return []  # e.g. no MPS, no graphics on a compute GPU
                raise explain(e, index) from None
            self._proc_calls[kind] = name
            return procs
        if kind == "compute":
            self._note = (
                "process list not available with this driver: GPU release is proven by memory alone"
            )
        self._proc_calls[kind] = ""
        return []

    def device_paths(self) -> dict[str, int]:
        """Map /dev/nvidiaN (N = the device minor number) to the GPU index."""
        out = {}
        for i, h in enumerate(self._handles):
            if isinstance(h, GpuError):
                continue
            try:
                out[f"{self._dev_dir}/nvidia{_call(pynvml.nvmlDeviceGetMinorNumber, h)}"] = i
            except GpuError:
                continue
        return out

    def driver(self) -> DriverInfo:
        """Return the driver's and NVML's versions, and what this driver cannot do."""
        return DriverInfo(
            driver_version=_text(pynvml.nvmlSystemGetDriverVersion),
            nvml_version=_text(pynvml.nvmlSystemGetNVMLVersion),
            note=self._note,
        )

    def xid_events(self, indices: list[int], others: Sequence[int] = ()) -> XidEvents:
        """Return a watch of the critical Xid events on GPUs ``indices``, and on ``others``
        where the driver lets (a GPU that cannot register is left out, not an error)."""
        return XidEvents(self, indices, others)

    def close(self) -> None:
        """Shut NVML down (once); errors at shutdown are irrelevant."""
        if getattr(self, "_open", False):
            self._open = False
            with contextlib.suppress(*_errors()):
                pynvml.nvmlShutdown()

    @property
    def handles(self) -> list[Any]:
        """The whole-GPU handles by index (a GpuError where the GPU has none)."""
        return self._handles


def _broken(index: int, why: GpuError, mig: int | None = None) -> Gpu:
    lost = isinstance(why, GpuLostError)
    return Gpu(index, "?", "?", 0, 0, None, mig=mig, error=str(why), lost=lost)


def _optional(fn: Callable[..., Any], h: Any, attr: str) -> int | None:
    try:
        return int(getattr(fn(h), attr))
    except _errors():  # not supported on MIG instances and some vGPUs
        return None


def _flag(fn: Callable[..., Any], h: Any) -> bool | None:
    try:
        return bool(fn(h))
    except _errors():
        return None


def _ecc(h: Any) -> int | None:
    try:
        return int(
            pynvml.nvmlDeviceGetTotalEccErrors(
                h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            )
        )
    except _errors():  # ECC off, or not supported (consumer GPUs)
        return None


def _recovery(h: Any) -> int | None:
    """The driver's recovery action for the GPU, where it reports one (drivers 550+)."""
    # an nvidia-ml-py older than the field has no name for it (pyproject allows 12.535)
    field = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    if field is None:
        return None
    try:
        (v,) = pynvml.nvmlDeviceGetFieldValues(h, [field])
    except _errors():  # an older driver: no field values at all
        return None
    return int(v.value.uiVal) if v.nvmlReturn == 0 else None


def _text(fn: Callable[[], Any]) -> str | None:
    try:
        return str(fn())
    except _errors():
        return None


class XidEvents:
    """NVML's critical-Xid events on some GPUs: one event set, waited on from a thread."""

    def __init__(self, backend: NvmlBackend, indices: list[int], others: Sequence[int]) -> None:
        self._handles = backend.handles
        self._set = _call(pynvml.nvmlEventSetCreate)
        try:
            for i in [*indices, *others]:
                h = backend.handles[i]
                if isinstance(h, GpuError):
                    continue
                try:
                    _call(pynvml.nvmlDeviceRegisterEvents, h,
                          pynvml.nvmlEventTypeXidCriticalError, self._set, gpu=i)  # fmt: skip
                except GpuError:
                    if i in indices:
                        raise
        except GpuError:
            self.close()
            raise

    def wait(self, timeout_s: float) -> tuple[int, int] | None:
        """Return (GPU index, Xid) of the next event within ``timeout_s``, or None."""
        try:
            data = pynvml.nvmlEventSetWait(self._set, int(timeout_s * 1000))
        except _errors() as e:
            if _code(e) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            raise explain(e) from None
        index = -1
        for i, h in enumerate(self._handles):
            if not isinstance(h, GpuError) and _addr(h) == _addr(data.device):
                index = i
        return index, int(data.eventData)

    def close(self) -> None:
        """Free the event set."""
        with contextlib.suppress(*_errors()):
            pynvml.nvmlEventSetFree(self._set)


def _addr(handle: Any) -> int:
    """The address a device handle points to (handles are compared by it)."""
    return ctypes.cast(handle, ctypes.c_void_p).value or 0
