"""The GPU boundary: NVML error translation and the fake backend's behaviours."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainctl.supervisor.errors import GpuError
from trainctl.supervisor.gpu import MIB, NoDriverError, open_backend
from trainctl.supervisor.gpu.fake import FakeBackend
from trainctl.supervisor.gpu.holders import classify_pid, find_holders
from trainctl.supervisor.gpu.verify import holders_of

pynvml = pytest.importorskip("pynvml")


def test_nvml_errors_are_translated() -> None:
    from trainctl.supervisor.gpu import nvml  # noqa: PLC0415

    def fail(code: int) -> None:
        raise pynvml.NVMLError(code)

    with pytest.raises(NoDriverError, match="no NVIDIA driver found"):
        nvml._call(fail, pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(NoDriverError):
        nvml._call(fail, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(GpuError, match="GPU 3 lost") as info:
        nvml._call(fail, pynvml.NVML_ERROR_GPU_IS_LOST, gpu=3)
    assert not isinstance(info.value, NoDriverError)
    with pytest.raises(GpuError, match="no permission") as info:  # not "no driver"
        nvml._call(fail, pynvml.NVML_ERROR_NO_PERMISSION)
    assert not isinstance(info.value, NoDriverError)
    with pytest.raises(GpuError, match=r"version mismatch.*reboot or reload.*container"):
        nvml._call(fail, pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    assert nvml._call(lambda x: x + 1, 1) == 2


def test_every_nvml_exception_becomes_a_gpu_error() -> None:
    """Every NVMLError subclass, and the mismatch class that is not one, stay inside."""
    from trainctl.supervisor.gpu import nvml  # noqa: PLC0415

    codes = [getattr(pynvml, n) for n in dir(pynvml) if n.startswith("NVML_ERROR_")]
    for code in codes:

        def fail(c: int = code) -> None:
            raise pynvml.NVMLError(c)

        with pytest.raises(GpuError):
            nvml._call(fail)

    def mismatch() -> None:
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called")

    with pytest.raises(GpuError, match="lacks a call"):
        nvml._call(mismatch)


def test_no_driver_without_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("a real NVIDIA driver is present")
    monkeypatch.delenv("TRAINCTL_FAKE_GPU", raising=False)
    with pytest.raises(NoDriverError, match="no NVIDIA driver found"):
        open_backend()


def describe(tmp: Path, **opts: object) -> Path:
    dev = tmp / "dev"
    dev.mkdir()
    (dev / "nvidia0").touch()
    (dev / "nvidia1").touch()
    path = tmp / "gpus.json"
    gpus = [
        {"uuid": f"GPU-{i}", "memory_total_mib": 1000, "base_used_mib": 10, **opts}
        for i in range(2)
    ]
    path.write_text(json.dumps({"dev_dir": str(dev), "gpus": gpus}))
    return path


def test_fake_counts_a_holder_by_its_open_fd(tmp_path: Path) -> None:
    path = describe(tmp_path)
    fd = os.open(tmp_path / "dev" / "nvidia1", os.O_RDWR)  # this test process "uses" GPU 1
    try:
        b = FakeBackend(str(path))
        g0, g1 = b.gpus()
        assert g0.memory_used_bytes == 10 * MIB
        assert g1.memory_used_bytes == (10 + 1024) * MIB
        assert [p.pid for p in b.processes(g1)] == [os.getpid()]
        assert find_holders(b.device_paths()) == {1: {os.getpid()}}
        [h] = holders_of(b.gpus()[1], b)
        assert h.seen == "nvml+fd"
        assert h.cmd
    finally:
        os.close(fd)
    assert FakeBackend(str(path)).gpus()[1].memory_used_bytes == 10 * MIB


def test_fake_container_and_phantom_modes(tmp_path: Path) -> None:
    path = describe(
        tmp_path, hide_processes=False, phantom_pids=[4194001], per_process_memory=False
    )
    b = FakeBackend(str(path))
    [p] = b.processes(b.gpus()[0])
    assert (p.pid, p.used_bytes) == (4194001, None)
    assert classify_pid(4194001, set()) == "absent"
    assert classify_pid(os.getpid(), set()) == "unconfirmed"  # exists, holds no GPU
    [h] = holders_of(b.gpus()[0], b)
    assert h.cmd is None  # never read a process NVML could not confirm


def test_fake_init_errors(tmp_path: Path) -> None:
    path = describe(tmp_path)
    doc = json.loads(path.read_text())
    for err, exc in (("no driver", NoDriverError), ("Unknown Error", GpuError)):
        doc["init_error"] = err
        path.write_text(json.dumps(doc))
        with pytest.raises(exc):
            FakeBackend(str(path))
    with pytest.raises(GpuError, match="unreadable"):
        FakeBackend(str(tmp_path / "missing.json"))
