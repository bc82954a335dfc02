"""A fake GPU backend — FOR TESTS ONLY.

Selected only by ``TRAINCTL_FAKE_GPU=/path/to/gpus.json`` and refused when a real NVIDIA
driver is present (see :func:`trainctl.supervisor.gpu.open_backend`). The "GPU processes"
are real processes that keep ``<dev_dir>/nvidiaN`` open, standing in for ``/dev/nvidiaN``:
their fake memory is released exactly when the process really dies, and trainctl's fd
scan finds them the same way it finds real GPU holders. A holder's memory is the
``FAKE_GPU_MIB`` variable in its environment (default 1024).

JSON description::

    {"dev_dir": "/tmp/t/dev",
     "init_error": null,                  # a string: NVML fails to initialise with it
     "gpus": [{"uuid": "GPU-fake-0", "name": "Fake H200", "memory_total_mib": 143771,
               "base_used_mib": 0, "utilization": 0,
               "hide_processes": false,     # container: memory counted, process list empty
               "phantom_pids": [],          # pids listed that do not exist here
               "per_process_memory": true,  # false: used memory per process unknown
               "release_delay_s": 0,        # memory freed this long after the holder died
               "never_release": false}]}    # memory of dead holders stays for good

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
from collections.abc import Iterator
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
        if self.doc.get("init_error"):
            if self.doc["init_error"] == "no driver":
                raise NoDriverError("no NVIDIA driver found (fake)")
            raise GpuError(f"NVML: {self.doc['init_error']} (fake)")
        self.dev_dir = Path(self.doc["dev_dir"])
        self.specs: list[dict[str, Any]] = list(self.doc["gpus"])
        self._usage = self._observe()

    def device_paths(self) -> dict[str, int]:
        """Map the marker files to GPU indices."""
        return {str(self.dev_dir / f"nvidia{i}"): i for i in range(len(self.specs))}

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
                memory_used_bytes=(s.get("base_used_mib", 0) + self._usage[i][0]) * MIB,
                memory_total_bytes=s.get("memory_total_mib", 81920) * MIB,
                utilization_pct=s.get("utilization", 0),
            )
            for i, s in enumerate(self.specs)
        ]

    def processes(self, gpu: Gpu) -> list[GpuProc]:
        """Return the holders as NVML would list them (or not)."""
        index = gpu.index
        spec = self.specs[index]
        if spec.get("hide_processes"):
            return []
        per = spec.get("per_process_memory", True)
        out = [GpuProc(pid, mib * MIB if per else None) for pid, mib in self._usage[index][1]]
        out += [GpuProc(pid, 1024 * MIB if per else None) for pid in spec.get("phantom_pids", ())]
        return out

    def xid_events(self, indices: list[int]) -> XidSource | None:
        """The fake has no events (the C double of libnvidia-ml has)."""
        return None

    def driver(self) -> DriverInfo:
        """Return the fake's versions."""
        return DriverInfo("fake", "fake")

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
                    book[key] = {"mib": mib, "died": None}
                used = sum(mib for _, mib in live)
                alive_keys = {f"{pid}:{_start(pid)}" for pid, _ in live}
                for key in list(book):
                    if key in alive_keys:
                        continue
                    entry = book[key]
                    entry["died"] = entry["died"] or now
                    if spec.get("never_release") or now - entry["died"] < spec.get(
                        "release_delay_s", 0
                    ):
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
