"""A fake GPU backend — FOR TESTS ONLY.

Selected only by ``TRAINCTL_FAKE_GPU=/path/to/gpus.json`` and refused when a real NVIDIA
driver is present (see :func:`trainctl.supervisor.gpu.open_backend`). The "GPU processes"
are real processes that keep a device node (``node``) open, standing in for ``/dev/nvidiaN``:
their fake memory is released exactly when the process really dies, and trainctl's fd
scan finds them the same way it finds real GPU holders. A holder's memory is the
``FAKE_GPU_MIB`` variable in its environment (default 1024).

The description is the C double's (tests/gpu/nvml_double.c): ONE schema for both
fakes of the driver, so a test can say the same thing to either, and a test runs the
same document through both (tests/gpu/test_backends.py). The keys this fake reads::

    {"driver_version": "550.54.15", "nvml_version": "12.550.54.15",
     "init_error": "DRIVER_NOT_LOADED",   # NVML's error name: nvmlInit fails with it
     "devices": [{"uuid": "GPU-...", "name": "NVIDIA H200",
                  "total": bytes, "used": bytes (driver-reserved, with no process),
                  "utilization": 0,
                  "recovery_action": 1,      # what the driver says the GPU needs (xid.py)
                  "node": "/tmp/t/dev/nvidia0",  # live processes with it open hold the GPU
                  "release_delay_s": 0,      # a dead holder's memory is freed this late
                  "stuck": false,            # a dead holder's memory is never freed
                  "hide_processes": false,   # memory counted, process list empty (container)
                  "process_memory": true,    # false: NVML gives no per-process memory
                  "processes": [{"pid": 7, "used": bytes | -1, "host": true}]}]}
                                             # listed while /proc/<pid> exists, or always
                                             # with "host" (a host pid seen from a container)

The double's other keys (Xid events, MIG, a lost GPU, per-call failures, a slow init)
are the C double's alone: a test of them loads the real nvidia-ml-py on the double.

Delayed and never-released memory needs memory across CLI calls: ``<json>.ghosts``
records each holder seen alive and when it was first seen dead (under an flock). A
holder no call saw alive is not remembered: a test of lingering memory looks at the
GPUs while the job runs (the stop itself asks nothing before its signals).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from trainctl.supervisor.errors import GpuError

from . import MIB, DriverInfo, Gpu, GpuProc, NoDriverError, XidSource
from .holders import find_holders, read_env_var


class FakeBackend:
    """GPUs described by a JSON file; holders are processes with a marker file open."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        try:
            self.doc: dict[str, Any] = json.loads(self.path.read_text())
        except (OSError, ValueError) as e:
            raise GpuError(f"fake GPU description {path} unreadable: {e}") from None
        error = self.doc.get("init_error")
        if error:
            if error in _NO_DRIVER:
                raise NoDriverError("no NVIDIA driver found (fake)")
            raise GpuError(f"NVML: {_MESSAGES.get(error, error)} (fake)")
        self.specs: list[dict[str, Any]] = list(self.doc.get("devices", ()))
        self._usage = self._observe()

    def device_paths(self) -> dict[str, int]:
        """Map the device nodes to GPU indices."""
        return {s["node"]: i for i, s in enumerate(self.specs) if s.get("node")}

    def gpus(self) -> list[Gpu]:
        """Return the GPUs with memory = base + live holders + not-yet-released ghosts.

        Each call looks again (a backend stays open for a whole release check, as NVML's).
        """
        self._usage = self._observe()
        return [
            Gpu(
                index=i,
                uuid=s["uuid"],
                name=s.get("name", "Fake GPU"),
                memory_used_bytes=int(s.get("used", 0))
                + self._usage[i][0] * MIB
                + sum(max(0, used) for _, used in _listed(s)),
                memory_total_bytes=int(s.get("total", 80 << 30)),
                utilization_pct=s.get("utilization", 0),
                recovery_action=s.get("recovery_action"),
            )
            for i, s in enumerate(self.specs)
        ]

    def processes(self, gpu: Gpu) -> list[GpuProc]:
        """Return the holders as NVML would list them (or not)."""
        index = gpu.index
        spec = self.specs[index]
        if spec.get("hide_processes"):
            return []
        per = spec.get("process_memory", True)
        out = [GpuProc(pid, mib * MIB if per else None) for pid, mib in self._usage[index][1]]
        out += [GpuProc(pid, used if used >= 0 else None) for pid, used in _listed(spec)]
        return out

    def xid_events(self, indices: list[int], others: Sequence[int] = ()) -> XidSource | None:
        """The fake has no events (the C double of libnvidia-ml has)."""
        return None

    def driver(self) -> DriverInfo:
        """Return the versions the description gives (else "fake")."""
        return DriverInfo(
            self.doc.get("driver_version", "fake"), self.doc.get("nvml_version", "fake")
        )

    def close(self) -> None:
        """Nothing to release."""

    # ------------------------------------------------------------ bookkeeping

    def _observe(self) -> list[tuple[int, list[tuple[int, int]]]]:
        """Return, per GPU, (MiB in use, [(pid, MiB) of live holders])."""
        holders = find_holders(self.device_paths())
        now = time.time()
        out = []
        with self._ghosts() as ghosts:
            for i, spec in enumerate(self.specs):
                book: dict[str, dict[str, Any]] = ghosts.setdefault(str(i), {})
                live = []
                alive_keys = set()
                for pid in sorted(holders.get(i, ())):
                    started = _start(pid)
                    key = f"{pid}:{started}"
                    # A holder's environ reads empty as it exits: keep what it was seen to
                    # hold then, not the default (a stop looks at exactly that moment).
                    said = read_env_var(pid, "FAKE_GPU_MIB")
                    if started == "?" or (not said and key not in book and _exiting(pid)):
                        continue  # gone between the fd scan and now: never a holder of its own
                    mib = int(said) if said else int(book.get(key, {}).get("mib", 1024))
                    live.append((pid, mib))
                    alive_keys.add(key)
                    book[key] = {"mib": mib, "died": None}
                # the keys counted live, not read again: a holder exiting between two reads
                # of its start time was counted twice, live and as a ghost (a CI failure)
                used = sum(mib for _, mib in live)
                for key in list(book):
                    if key in alive_keys:
                        continue
                    entry = book[key]
                    entry["died"] = entry["died"] or now
                    if spec.get("stuck") or now - entry["died"] < spec.get("release_delay_s", 0):
                        used += entry["mib"]
                    else:
                        del book[key]
                out.append((used, live))
        return out

    @contextlib.contextmanager
    def _ghosts(self) -> Iterator[dict[str, Any]]:
        path = self.path.with_name(self.path.name + ".ghosts")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.read(fd, 1 << 20)
            doc: dict[str, Any] = json.loads(raw) if raw else {}
            yield doc
            data = json.dumps(doc).encode()
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, data)
        finally:
            os.close(fd)


def _listed(spec: dict[str, Any]) -> list[tuple[int, int]]:
    """The device's listed processes NVML shows now: (pid, bytes; -1 not available), each
    while its /proc entry exists, or always for a host pid (seen from a container)."""
    out = []
    for p in spec.get("processes", ()):
        pid = int(p["pid"])
        if p.get("host") or os.path.exists(f"/proc/{pid}"):
            out.append((pid, int(p.get("used", 0))))
    return out


_NO_DRIVER = {"DRIVER_NOT_LOADED", "LIBRARY_NOT_FOUND"}
_MESSAGES = {  # NVML's own words for the errors a test names
    "UNKNOWN": "Unknown Error",
    "NO_PERMISSION": "Insufficient Permissions",
    "LIB_RM_VERSION_MISMATCH": "RM has detected an NVML/RM version mismatch.",
}


def _exiting(pid: int) -> bool:
    """Its environ reads empty: the process is exiting (or gone), its memory map torn down."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return not f.read(1)
    except OSError:
        return True


def _start(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[19].decode()
    except OSError:
        return "?"
