"""GPU health in the home: the GPUs a reset- or reboot-class fault made unhealthy.

``<home>/gpu-health.json`` maps a GPU index to the fault that took it out (its class,
Xid, when, on which boot, its uuid). No start, restart or queue dispatch hands such a GPU
to a run until it is healthy again: a reboot-class fault clears with a new boot (the
machine rebooted), any fault with ``trainctl gpus --clear N`` (after a reset, say). The
supervisor that saw the fault writes it; the launcher reads it.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trainctl.supervisor.errors import StateError
from trainctl.supervisor.model.state import (
    GpuLease,
    current_boot_id,
    flock_file,
    write_json_atomic,
)

from .xid import REBOOT, Fault

FILE = "gpu-health.json"
LOCK = "gpu-health.lock"


@dataclass(frozen=True, slots=True)
class Unhealthy:
    """One unhealthy GPU: why, since when."""

    index: int
    klass: str  # reset-gpu | reboot
    xid: int | None
    what: str
    at: float
    boot_id: str | None
    uuid: str | None = None
    job: str | None = None  # the run it was seen in

    def covers(self, uuid: str) -> bool:
        """Whether this fault is the GPU with ``uuid`` (one recorded without a uuid covers
        whatever GPU holds its index)."""
        return self.uuid in (None, uuid)

    def line(self) -> str:
        """``unhealthy: Xid 79 at 03:12 (reboot needed)``."""
        when = time.strftime("%H:%M", time.localtime(self.at))
        xid = f"Xid {self.xid}" if self.xid is not None else self.what
        need = "reboot needed" if self.klass == REBOOT else "GPU reset needed"
        return f"unhealthy: {xid} at {when} ({need})"


def _read(home: Path) -> dict[str, dict[str, object]]:
    try:
        doc = json.loads((home / FILE).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise StateError(f"{home / FILE} is unreadable: {e}") from None
    return doc if isinstance(doc, dict) else {}


def unhealthy(home: Path) -> dict[int, Unhealthy]:
    """The GPUs unhealthy now (a reboot-class fault of an earlier boot has cleared)."""
    boot = current_boot_id()
    out = {}
    for key, raw in _read(home).items():
        with contextlib.suppress(TypeError, ValueError, KeyError):
            u = Unhealthy(**raw)  # type: ignore[arg-type]
            if u.klass == REBOOT and u.boot_id != boot:
                continue  # the machine rebooted since
            out[int(key)] = u
    return out


def record(home: Path, fault: Fault, uuid: str | None, job: str | None) -> Unhealthy:
    """Mark ``fault.gpu`` unhealthy (the first fault that did stays the one shown)."""
    entry = Unhealthy(
        fault.gpu, fault.klass, fault.xid, fault.what, time.time(), current_boot_id(), uuid, job
    )
    with flock_file(home / LOCK, 10.0, "another GPU health update"):
        doc = _read(home)
        doc.setdefault(str(fault.gpu), asdict(entry))
        write_json_atomic(home / FILE, doc)
    return entry


def split_leases(
    home: Path, leases: tuple[GpuLease, ...]
) -> tuple[tuple[GpuLease, ...], list[Unhealthy]]:
    """A run's leases that are healthy, and the faults of those that are not (a fault
    recorded for another GPU at that index, by its uuid, is not this lease's)."""
    sick = unhealthy(home)
    keep, lost = [], []
    for g in leases:
        bad = sick.get(g.index)
        if bad is not None and bad.covers(g.uuid):
            lost.append(bad)
        else:
            keep.append(g)
    return tuple(keep), lost


def clear(home: Path, index: int) -> bool:
    """Mark GPU ``index`` healthy again; False when it was not marked."""
    with flock_file(home / LOCK, 10.0, "another GPU health update"):
        doc = _read(home)
        if doc.pop(str(index), None) is None:
            return False
        write_json_atomic(home / FILE, doc)
    return True
