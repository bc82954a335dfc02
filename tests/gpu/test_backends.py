"""The GPU boundary: NVML error translation and the fake backend's behaviours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.nvml_double import document
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
    """Two GPUs in the one schema of both driver fakes (tests/gpu/nvml_double.py)."""
    doc = document(tmp / "dev", 2)
    for i, g in enumerate(doc["devices"]):
        g.update(uuid=f"GPU-{i}", total=1000 * MIB, used=10 * MIB, **opts)
    path = tmp / "gpus.json"
    path.write_text(json.dumps(doc))
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
        tmp_path, processes=[{"pid": 4194001, "used": -1, "host": True}], process_memory=False
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
    for err, exc in (("DRIVER_NOT_LOADED", NoDriverError), ("UNKNOWN", GpuError)):
        doc["init_error"] = err
        path.write_text(json.dumps(doc))
        with pytest.raises(exc):
            FakeBackend(str(path))
    with pytest.raises(GpuError, match="unreadable"):
        FakeBackend(str(tmp_path / "missing.json"))


_LOOK = """\
import json
from trainctl.supervisor.gpu import open_backend
b = open_backend()
print(json.dumps([[g.index, g.uuid, g.name, g.memory_used_bytes, g.memory_total_bytes,
                   g.utilization_pct, sorted([p.pid, p.used_bytes] for p in b.processes(g)),
                   g.recovery_action]
                  for g in b.gpus()]))
"""


def test_one_document_says_the_same_through_both_driver_fakes(tmp_path: Path) -> None:
    """issue 45 item 5: the Python fake and the C double of libnvidia-ml read one schema:
    the same document gives the same GPUs, memory and process lists through the fake and
    through the real nvidia-ml-py on the double (a bug is fixed once, in one reading)."""
    pytest.importorskip("pynvml")
    from tests.gpu.nvml_double import Driver  # noqa: PLC0415  (builds the double: skips without cc)

    d = Driver(tmp_path, 3)
    d.device(0, process_memory=False, processes=[{"pid": 4194001, "used": -1, "host": True}])
    d.device(1, hide_processes=True, used=3 * MIB)
    d.device(2, processes=[{"pid": 4194002, "used": 5 * MIB, "host": True}], utilization=40,
             recovery_action=1)  # fmt: skip
    holds = [os.open(d.dev / f"nvidia{i}", os.O_RDWR) for i in (0, 1, 2)]  # a holder of each
    try:
        env = {k: v for k, v in os.environ.items() if k != "TRAINCTL_FAKE_GPU"}
        out = subprocess.run(
            [sys.executable, "-c", _LOOK], env={**env, **d.env()},
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        through_nvml = json.loads(out)
        fake = FakeBackend(str(d.path))
        through_fake = [
            [g.index, g.uuid, g.name, g.memory_used_bytes, g.memory_total_bytes,
             g.utilization_pct, sorted([p.pid, p.used_bytes] for p in fake.processes(g)),
             g.recovery_action]
            for g in fake.gpus()
        ]  # fmt: skip
    finally:
        for fd in holds:
            os.close(fd)
    assert through_fake == through_nvml
    me = os.getpid()
    assert through_fake[0][6] == sorted([[me, None], [4194001, None]])  # no per-process memory
    assert through_fake[1][6] == []  # a container's empty list
    assert through_fake[1][3] == 3 * MIB + 1024 * MIB  # ... its memory still counted
    assert [me, 1024 * MIB] in through_fake[2][6]
    # the driver's recovery action: where it is reported, and None where not (an older driver)
    assert [g[7] for g in through_fake] == [None, None, 1]
