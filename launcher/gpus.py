"""GPU bindings at start (leases), and the `trainctl gpus` view.

A GPU is *leased* by a live job that bound it; another job gets it only with ``--share``.
A GPU on which processes outside any live job use more than ``foreign_threshold_mib`` is
refused unless ``--force``, naming those processes. ``--gpus N`` picks only free GPUs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainctl.supervisor import state
from trainctl.supervisor.errors import ConfigError, GpuError, JobNotFoundError, StateError
from trainctl.supervisor.gpu import MIB, Gpu, GpuBackend, NoDriverError, open_backend
from trainctl.supervisor.gpu.verify import holders_of
from trainctl.supervisor.reports import GpuHolder
from trainctl.supervisor.state import GpuLease


@dataclass(frozen=True, slots=True)
class JobRef:
    """What a marker tells about a process: its job, and whether that run is live."""

    name: str
    run: int
    live: bool


def known_markers(home: Path) -> tuple[dict[str, JobRef], dict[int, str]]:
    """Return ({marker: job}, {gpu index: live job leasing it}) from every job's state."""
    markers: dict[str, JobRef] = {}
    leased: dict[int, str] = {}
    for name in state.list_jobs(home):
        try:
            st = state.read_state(state.job_dir(home, name))
        except (StateError, JobNotFoundError, OSError):
            continue  # an untrusted or half-written job must not hide the GPUs
        # A run is live until it ends (stopped/exited/failed), even with its supervisor
        # lost; whatever still carries the marker of an ended run is an orphan.
        live = st.phase not in state.TERMINAL
        markers[st.marker] = JobRef(name, st.run, live)
        if live:
            for lease in st.gpus:
                leased.setdefault(lease.index, name)
    return markers, leased


def owner_of(holder: GpuHolder, markers: dict[str, JobRef]) -> str:
    """Classify a GPU holder: a job name, ``orphan``, ``foreign``, or ``not visible``."""
    if holder.cmd is None:
        return "not visible here"
    marker = holder.marker
    if not marker:
        return "foreign"
    job = markers.get(marker)
    if job is not None and job.live:
        return job.name
    return f"orphan of {job.name} run {job.run}" if job else "orphan"


def _foreign_bytes(gpu: Gpu, holders: list[GpuHolder], markers: dict[str, JobRef]) -> int:
    job_bytes = sum(
        h.used_bytes or 0
        for h in holders
        if (j := markers.get(h.marker or "")) is not None and j.live
    )
    return max(0, gpu.memory_used_bytes - job_bytes)


def _parse(request: str | list[int], gpus: list[Gpu]) -> int | list[Gpu]:
    """Return a count (``N``) or the named GPUs (``all``, ``0,3``, ``3,``, UUIDs)."""
    if isinstance(request, list):  # exact indices (restart re-binds the same GPUs)
        request = ",".join(map(str, request)) + ","
    req = request.strip()
    if req == "all":
        return list(gpus)
    if req.isdigit() and int(req) >= 1:
        return int(req)  # a count; "0" (a count of nothing) falls through: GPU 0
    by_index = {str(g.index): g for g in gpus}
    by_uuid = {g.uuid: g for g in gpus}
    picked: list[Gpu] = []
    for token in filter(None, (t.strip() for t in req.split(","))):
        g = by_index.get(token) or by_uuid.get(token)
        if g is None:
            raise ConfigError(
                f"--gpus: no GPU {token!r} here (have {', '.join(by_index) or 'none'})"
            )
        if g not in picked:
            picked.append(g)
    if not picked:
        raise ConfigError(f"--gpus: cannot parse {request!r} (use 0,3 or N or all or UUIDs)")
    return picked


def resolve_gpus(
    request: str | list[int],
    home: Path,
    *,
    share: bool,
    force: bool,
    foreign_threshold_bytes: int,
) -> list[GpuLease]:
    """Pick and check the GPUs for a new run; raise a one-line error if they are not free."""
    try:
        backend = open_backend()
    except NoDriverError as e:
        raise GpuError(f"--gpus: {e}") from None
    try:
        gpus = backend.gpus()
        markers, leased = known_markers(home)
        parsed = _parse(request, gpus)
        candidates = gpus if isinstance(parsed, int) else parsed
        busy: dict[int, str] = {}
        for g in candidates:
            holders = holders_of(g.index, backend)
            foreign = _foreign_bytes(g, holders, markers)
            if g.index in leased and not share:
                busy[g.index] = f"GPU {g.index} is leased by job {leased[g.index]} (--share)"
            elif foreign > foreign_threshold_bytes and not force:
                names = ", ".join(
                    f"pid {h.pid} ({owner_of(h, markers)})"
                    for h in holders
                    if owner_of(h, markers) not in {j.name for j in markers.values() if j.live}
                )
                busy[g.index] = (
                    f"GPU {g.index} has {foreign / MIB / 1024:.1f} GiB in use "
                    f"outside any job ({names or 'NVML lists no process'}; --force)"
                )
        if isinstance(parsed, int):
            free = [g for g in gpus if g.index not in busy]
            if len(free) < parsed:
                raise GpuError(
                    f"--gpus {parsed}: only {len(free)} of {len(gpus)} GPUs are free"
                    + (f" ({'; '.join(busy.values())})" if busy else "")
                )
            chosen = free[:parsed]
        else:
            refused = [busy[g.index] for g in parsed if g.index in busy]
            if refused:
                raise GpuError("; ".join(refused))
            chosen = parsed
        return [GpuLease(g.index, g.uuid, g.name, g.memory_used_bytes) for g in chosen]
    finally:
        backend.close()


_INVENTORY: list[Gpu] = []


def lease_fit(request: str, leased: dict[int, str], *, share: bool) -> str | None:
    """Could ``request`` fit, judged by the home's leases alone? None, or what holds it.

    The queue asks this four times a second without touching the driver: which GPUs a
    machine has does not change, so they are read once per process; a GPU leased by a
    live job is busy whatever its memory says. Foreign use is for `start` to find.
    """
    if not _INVENTORY:
        try:
            backend = open_backend()
        except NoDriverError as e:
            return f"no GPUs: {e}"
        try:
            _INVENTORY[:] = backend.gpus()
        finally:
            backend.close()
    parsed = _parse(request, _INVENTORY)
    held = {} if share else leased
    if isinstance(parsed, int):
        free = [g for g in _INVENTORY if g.index not in held]
        if len(free) >= parsed:
            return None
        return f"needs {parsed} GPU(s), {len(free)} free" + _held_by(held)
    busy = {g.index: held[g.index] for g in parsed if g.index in held}
    return None if not busy else _held_by(busy).removeprefix("; ")


def _held_by(held: dict[int, str]) -> str:
    by_job: dict[str, list[int]] = {}
    for index, job in sorted(held.items()):
        by_job.setdefault(job, []).append(index)
    parts = [
        f"GPU{'s' if len(ix) > 1 else ''} {' and '.join(map(str, ix))} held by {job}"
        for job, ix in by_job.items()
    ]
    return f"; {', '.join(parts)}" if parts else ""


def check_request(request: str) -> None:
    """Refuse a --gpus that names GPUs this machine does not have (before queueing it)."""
    try:
        backend = open_backend()
    except NoDriverError as e:
        raise GpuError(f"--gpus: {e}") from None
    try:
        _parse(request, backend.gpus())
    finally:
        backend.close()


def gpu_env(leases: list[GpuLease]) -> dict[str, str]:
    """Return the environment that binds a job to its GPUs (indices as nvidia-smi shows)."""
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(str(g.index) for g in leases),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }


# ---------------------------------------------------------------- `trainctl gpus`


@dataclass(slots=True)
class GpuView:
    """One GPU as `trainctl gpus` shows it."""

    index: int
    name: str
    uuid: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_pct: int | None
    leased_by: str | None
    processes: list[GpuHolder] = field(default_factory=list)

    def to_doc(self) -> dict[str, Any]:
        """Return the JSON form (each process without its marker)."""
        doc = asdict(self)
        doc["processes"] = [p.to_view() for p in self.processes]
        return doc


def gpu_views(home: Path) -> list[GpuView]:
    """Return every GPU with its lease and every process on it (NVML list + fd scan)."""
    backend: GpuBackend = open_backend()
    try:
        markers, leased = known_markers(home)
        out = []
        for g in backend.gpus():
            procs = holders_of(g.index, backend)
            for p in procs:
                p.owner = owner_of(p, markers)
            out.append(
                GpuView(
                    g.index,
                    g.name,
                    g.uuid,
                    g.memory_used_bytes,
                    g.memory_total_bytes,
                    g.utilization_pct,
                    leased.get(g.index),
                    procs,
                )
            )
        return out
    finally:
        backend.close()


def gpu_memory_by_pid() -> dict[int, int | None]:
    """Return {pid: GPU memory (None if unknown)} for every local GPU holder; {} without GPUs."""
    try:
        backend = open_backend()
    except GpuError:
        return {}
    out: dict[int, int | None] = {}
    try:
        for g in backend.gpus():
            for h in holders_of(g.index, backend):
                if h.cmd is None:
                    continue
                out.setdefault(h.pid, None)
                if h.used_bytes is not None:
                    out[h.pid] = (out[h.pid] or 0) + h.used_bytes
    except GpuError:
        return {}
    finally:
        backend.close()
    return out
