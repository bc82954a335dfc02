"""Build and drive the C double of libnvidia-ml.so.1 (tests/gpu/nvml_double.c).

The real nvidia-ml-py loads it through LD_LIBRARY_PATH, so trainctl's own NVML backend
(supervisor/gpu/nvml.py) runs against NVML's ABI and protocol. "The driver" is a JSON
document the double reads again on every call; :class:`Driver` edits it while jobs run.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("nvml_double.c")
GIB = 1 << 30
MIB = 1 << 20


def build(old_driver: bool = False) -> Path:
    """Return a directory holding the compiled double (built once per source version).

    ``old_driver``: without the ``_v3`` process-list symbols, as a driver older than the
    library. Skips the test when this machine has no C compiler.
    """
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        import pytest  # noqa: PLC0415  (the benchmarks use this module without pytest)

        pytest.skip("no C compiler to build the libnvidia-ml double (apt-get install gcc)")
    digest = hashlib.sha256(SOURCE.read_bytes() + bytes([old_driver])).hexdigest()[:12]
    root = Path(tempfile.gettempdir()) / f"trainctl-nvml-double-{digest}"
    lib = root / "libnvidia-ml.so.1"
    if lib.exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{root}.lock", "w") as lock:  # xdist workers build it once between them
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lib.exists():
            tmp = Path(tempfile.mkdtemp(dir=root.parent))
            flags = ["-DOLD_DRIVER"] if old_driver else []
            subprocess.run(
                [cc, "-shared", "-fPIC", "-O1", "-Wall", *flags, "-o",
                 str(tmp / "libnvidia-ml.so.1"), str(SOURCE)],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
            tmp.rename(root)
    return root


def h200(i: int, dev: Path, **over: Any) -> dict[str, Any]:
    """One H200 as the driver describes it (driver-reserved memory, no process)."""
    return {
        "uuid": f"GPU-{i:08x}-0000-4000-8000-00000000000{i % 10}",
        "name": "NVIDIA H200",
        "minor": i,
        "total": 141 * GIB,
        "used": 512 * MIB,
        "persistence": 1,
        "node": str(dev / f"nvidia{i}"),
        **over,
    }


def document(dev: Path, n: int, **top: Any) -> dict[str, Any]:
    """n H200s in the one schema of both driver fakes (this double and the Python fake,
    supervisor/gpu/fake.py), each with its device node in ``dev``."""
    dev.mkdir(exist_ok=True)
    for i in range(n):
        (dev / f"nvidia{i}").touch()
    return {
        "driver_version": "550.54.15",
        "nvml_version": "12.550.54.15",
        "devices": [h200(i, dev) for i in range(n)],
        **top,
    }


class Driver:
    """The double's JSON document for one test, and the environment that selects it."""

    def __init__(self, tmp: Path, n: int = 8, old_driver: bool = False, **top: Any) -> None:
        self.dev = tmp / "nvdev"
        self.path = tmp / "nvml.json"
        self.init_log = tmp / "nvml-inits.log"
        self.doc = document(self.dev, n, init_log=str(self.init_log), **top)
        self.lib = build(old_driver)
        self.write()

    def env(self) -> dict[str, str]:
        """What a trainctl call (and its supervisor) needs to load this driver."""
        return {
            "LD_LIBRARY_PATH": str(self.lib),
            "NVML_DOUBLE": str(self.path),
            "TRAINCTL_NVIDIA_DEV_DIR": str(self.dev),
            "FAKE_DEV_DIR": str(self.dev),  # where tests/trees/gpu_holders.py opens "GPUs"
            "NVML_DOUBLE_DEV": str(self.dev),  # the double's fd walk keeps only these
        }

    def write(self) -> None:
        """Replace the document atomically (the double may read it at any moment)."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc))
        os.replace(tmp, self.path)

    def set(self, **top: Any) -> None:
        """Change top-level keys (``init_delay_s``, ``init_error``, ``fail``, …)."""
        self.doc.update(top)
        self.write()

    def device(self, i: int, **keys: Any) -> None:
        """Change keys of device ``i`` (``lost``, ``xids``, ``release_delay_s``, …)."""
        self.doc["devices"][i].update(keys)
        self.write()

    def uuid(self, i: int) -> str:
        """Device ``i``'s uuid."""
        return str(self.doc["devices"][i]["uuid"])

    def inits(self) -> int:
        """How many nvmlInit calls that loaded the driver (first in a process) were made."""
        if not self.init_log.exists():
            return 0
        return sum(1 for line in self.init_log.read_text().splitlines() if line.endswith("first"))
