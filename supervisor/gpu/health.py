"""GPU health in the home: the GPUs a reset- or reboot-class fault made unhealthy.

``<home>/gpu-health.json`` maps a GPU index to the fault that took it out (its class,
Xid, when, on which boot, its uuid). No start, restart or queue dispatch hands such a GPU
to a run until it is healthy again: a reboot-class fault clears with a new boot (the
machine rebooted), any fault with ``trainctl gpus --clear N`` (after a reset, say). The
supervisor that saw the fault writes it; the launcher reads it.

``<home>/gpu-faults.json`` keeps the last fault seen on each GPU of the box, of any class
and whether or not a run held the GPU (an Xid on an idle GPU is seen by the watch of any
run with GPUs): `trainctl gpus` shows it. One entry a GPU, so it stays small.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from trainctl.supervisor import records
from trainctl.supervisor.errors import StateError, TrainctlError
from trainctl.supervisor.model.state import (
    GpuLease,
    current_boot_id,
    ensure_home,
    flock_file,
    job_dir,
    list_jobs,
    read_state,
    write_json_atomic,
)
from trainctl.supervisor.records import asdict

from . import Gpu, xid
from .xid import ACTION_WORDS, REBOOT, Fault

T = TypeVar("T")

FILE = "gpu-health.json"
LOCK = "gpu-health.lock"
FAULTS = "gpu-faults.json"
# the watches of several runs see one Xid on an idle GPU: the same fault this close is one
SAME_FAULT_S = 5.0


@records.record(frozen=True)
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


@records.record(frozen=True)
class Seen:
    """The last fault seen on one GPU of the box."""

    index: int
    klass: str
    xid: int | None
    what: str
    at: float
    job: str | None = None  # the run that held the GPU; None: no run held it

    def line(self) -> str:
        """``last fault: Xid 13 at 03:12 (restart the application; no run held it)``."""
        when = time.strftime("%H:%M", time.localtime(self.at))
        xid = f"Xid {self.xid}" if self.xid is not None else self.what
        whose = f"in run {self.job}" if self.job else "no run held it"
        return f"last fault: {xid} at {when} ({ACTION_WORDS[self.klass]}; {whose})"


def _read(home: Path, name: str = FILE) -> dict[str, dict[str, object]]:
    try:
        doc = json.loads((home / name).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise StateError(f"{home / name} is unreadable: {e}") from None
    return doc if isinstance(doc, dict) else {}


def _entries(home: Path, name: str, kind: type[T]) -> dict[int, T]:
    """The entries of file ``name`` by GPU index, each read as ``kind``; a malformed entry
    is left out (StateError: the file itself cannot be read)."""
    out = {}
    for key, raw in _read(home, name).items():
        with contextlib.suppress(TypeError, ValueError, KeyError):
            out[int(key)] = kind(**raw)
    return out


def unhealthy(home: Path) -> dict[int, Unhealthy]:
    """The GPUs unhealthy now (a reboot-class fault of an earlier boot has cleared)."""
    boot = current_boot_id()
    return {
        index: u
        for index, u in _entries(home, FILE, Unhealthy).items()
        if not (u.klass == REBOOT and u.boot_id != boot)  # the machine rebooted since
    }


def record(home: Path, fault: Fault, uuid: str | None, job: str | None) -> Unhealthy:
    """Mark ``fault.gpu`` unhealthy (the first fault that did stays the one shown)."""
    entry = Unhealthy(
        fault.gpu, fault.klass, fault.xid, fault.what, time.time(), current_boot_id(), uuid, job
    )
    with flock_file(home / LOCK, 10.0, "another GPU health update"):
        doc = _read(home)
        kept = doc.setdefault(str(fault.gpu), asdict(entry))
        if kept.get("job") is None and job is not None:  # seen first by another run's watch
            kept["job"] = job
        write_json_atomic(home / FILE, doc)
    return entry


def note(home: Path, fault: Fault, job: str | None) -> None:
    """Keep ``fault`` as the last seen on its GPU (the same fault seen by another run's
    watch within SAME_FAULT_S is not written twice)."""
    entry = Seen(fault.gpu, fault.klass, fault.xid, fault.what, time.time(), job)
    with flock_file(home / LOCK, 10.0, "another GPU health update"):
        try:
            doc = _read(home, FAULTS)
        except StateError:
            doc = {}  # a torn file is replaced: it only ever holds the last faults
        last = doc.get(str(fault.gpu)) or {}
        at = last.get("at")
        recent = isinstance(at, (int, float)) and entry.at - at < SAME_FAULT_S
        if recent and last.get("xid") == fault.xid and job in (None, last.get("job")):
            return
        doc[str(fault.gpu)] = asdict(entry)
        write_json_atomic(home / FAULTS, doc)


def look(home: Path, gpus: Iterable[Gpu]) -> list[Fault]:
    """The box's own look at its GPUs (issue 56 §6), made by every command that reads them
    (`trainctl gpus`, the choice of GPUs for a start, a restart or the queue's dispatch),
    so that a fault on a GPU no run holds is known with no process left watching: a GPU
    the driver has lost, or whose driver asks for a reset or a reboot (its recovery
    action, drivers 550+), is marked unhealthy and kept as its last fault, once (an
    earlier look's or a run's mark stands). The faults newly marked."""
    sick = unhealthy(home)
    new = []
    for g in gpus:
        if g.mig is not None or g.index in sick:
            continue
        lost = xid.lost(g.index, g.error or "lost") if g.lost else None
        fault = lost or xid.from_recovery(g.index, g.recovery_action or 0)
        if fault is None or not fault.unhealthy:
            continue
        holder = holder_of(home, g.index)
        # the home may not exist yet (`trainctl gpus` before any job), or be read-only
        # here (`--home` of another user's): the look is kept where it can be
        with contextlib.suppress(OSError, TrainctlError):
            ensure_home(home)
            record(home, fault, None if g.lost else g.uuid, holder)
            note(home, fault, holder)
        new.append(fault)
    return new


def holder_of(home: Path, index: int) -> str | None:
    """The run of the home that leases GPU ``index`` (or a MIG instance of it) now, if any:
    whose a fault seen by another run's watch is. A state that cannot be read is skipped."""
    for name in list_jobs(home):
        with contextlib.suppress(OSError, TrainctlError):
            st = read_state(job_dir(home, name))
            if not st.phase.ended and any(g.index == index for g in st.gpus):
                return name
    return None


def last_faults(home: Path) -> dict[int, Seen]:
    """The last fault seen on each GPU of the box."""
    try:
        return _entries(home, FAULTS, Seen)
    except StateError:
        return {}


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
