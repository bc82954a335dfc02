"""GPU bindings at start (leases), and the `trainctl gpus` view.

A GPU is *leased* by a live job that bound it; another job gets it only with ``--share``.
A GPU on which processes outside any live job use more than ``foreign_threshold_mib`` is
refused unless ``--force``, naming those processes. ``--gpus N`` picks only free GPUs.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainctl.launcher.results import GpuInventory, GpuView
from trainctl.supervisor.errors import ConfigError, GpuError, JobNotFoundError, StateError
from trainctl.supervisor.gpu import MIB, Gpu, GpuBackend, NoDriverError, health, open_backend
from trainctl.supervisor.gpu.verify import fd_scan, holders_of
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model import state
from trainctl.supervisor.model.reports import GpuHolder
from trainctl.supervisor.model.state import GpuLease
from trainctl.supervisor.records import record


@record(frozen=True)
class JobRef:
    """What a marker tells about a process: its job, and whether that run is live."""

    name: str
    run: int
    live: bool
    # the live run's supervisor (pid, start ticks): on a real driver it holds the device
    # nodes open for its GPU watch, and the fd scan finds it beside the job's processes
    supervisor: tuple[int, int] | None = None


def known_markers(home: Path) -> tuple[dict[str, JobRef], dict[str, str]]:
    """Return ({marker: job}, {GPU uuid: live job leasing it}) from every job's state."""
    markers: dict[str, JobRef] = {}
    leased: dict[str, str] = {}
    for name in state.list_jobs(home):
        try:
            st = state.read_state(state.job_dir(home, name))
        except (StateError, JobNotFoundError, OSError):
            continue  # an untrusted or half-written job must not hide the GPUs
        # A run is live until it ends (stopped/exited/failed), even with its supervisor
        # lost; whatever still carries the marker of an ended run is an orphan.
        live = not st.phase.ended
        sup = st.supervisor if live else None
        markers[st.marker] = JobRef(
            name, st.run, live, None if sup is None else (sup.pid, sup.start_ticks)
        )
        if live:
            for lease in st.gpus:
                leased.setdefault(lease.uuid, name)
    return markers, leased


def owner_of(holder: GpuHolder, markers: dict[str, JobRef]) -> str:
    """Classify a GPU holder: a job name, a job's supervisor, ``orphan``, ``foreign``, or
    ``not visible``."""
    if holder.cmd is None:
        return "not visible here"
    for ref in markers.values():
        if ref.supervisor is not None and ref.supervisor[0] == holder.pid:
            st = procfs.read_stat(holder.pid)
            if st is not None and st.start_ticks == ref.supervisor[1]:
                return f"supervisor of {ref.name}"  # its NVML handle: no memory of its own
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
    """Return a count (``N``) or the named GPUs (``all``, ``0,3``, ``3,``, ``0/1``, UUIDs).

    A MIG instance is named by its MIG-… uuid or as ``GPU/MIG`` (``0/1``); a GPU in MIG
    mode is bound per instance, never whole.
    """
    if isinstance(request, list):  # exact indices
        request = ",".join(map(str, request)) + ","
    req = request.strip()
    leasable = [g for g in gpus if g.leasable]
    if req == "all":
        return leasable
    if req.isdigit() and int(req) >= 1:
        return int(req)  # a count; "0" (a count of nothing) falls through: GPU 0
    by_name = {g.label: g for g in gpus} | {g.uuid: g for g in gpus if g.error is None}
    picked: list[Gpu] = []
    for token in filter(None, (t.strip() for t in req.split(","))):
        g = by_name.get(token)
        if g is None:
            have = ", ".join(g.label for g in leasable) or "none"
            raise ConfigError(f"--gpus: no GPU {token!r} here (have {have})")
        if g.error is not None:
            raise GpuError(f"--gpus: {g.error}")
        if g.mig_mode:
            names = ", ".join(m.label for m in gpus if m.index == g.index and m.mig is not None)
            raise ConfigError(
                f"--gpus: GPU {g.label} is in MIG mode: name one of its instances "
                f"({names or 'none is configured'}) or its MIG-… uuid"
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
        leasable = [g for g in gpus if g.leasable]
        candidates = leasable if isinstance(parsed, int) else parsed
        busy = _unhealthy(home, candidates, gpus)  # reset-/reboot-class: never handed out
        fds = fd_scan(backend)
        for g in [g for g in candidates if g.uuid not in busy]:
            try:
                holders = holders_of(g, backend, fds)
            except GpuError as e:  # this GPU's process list fails: it is not free
                busy[g.uuid] = str(e)
                continue
            foreign = _foreign_bytes(g, holders, markers)
            if g.uuid in leased and not share:
                busy[g.uuid] = f"GPU {g.label} is leased by job {leased[g.uuid]} (--share)"
            elif foreign > foreign_threshold_bytes and not force:
                names = ", ".join(
                    f"pid {h.pid} ({owner_of(h, markers)})"
                    for h in holders
                    if owner_of(h, markers) not in {j.name for j in markers.values() if j.live}
                )
                busy[g.uuid] = (
                    f"GPU {g.label} has {foreign / MIB / 1024:.1f} GiB in use "
                    f"outside any job ({names or 'NVML lists no process'}; --force)"
                )
        if isinstance(parsed, int):
            chosen = _count_of(parsed, gpus, leasable, busy)
        else:
            refused = [busy[g.uuid] for g in parsed if g.uuid in busy]
            if refused:
                raise GpuError("; ".join(refused))
            chosen = parsed
        return [GpuLease(g.index, g.uuid, g.name, g.memory_used_bytes, g.mig) for g in chosen]
    finally:
        backend.close()


def _unhealthy(home: Path, candidates: list[Gpu], gpus: list[Gpu]) -> dict[str, str]:
    """{uuid: why} of the candidates a reset- or reboot-class fault made unhealthy: as
    marked, and as the box's own look at ``gpus`` finds them now (no run need watch)."""
    health.look(home, gpus)
    sick = health.unhealthy(home)
    busy = {}
    for g in candidates:
        bad = sick.get(g.index)
        if bad is not None and bad.covers(g.uuid):
            busy[g.uuid] = (
                f"GPU {g.label} is {bad.line()}; `trainctl gpus --clear {g.index}` once the "
                "driver shows it healthy again"
            )
    return busy


def _count_of(n: int, gpus: list[Gpu], leasable: list[Gpu], busy: dict[str, str]) -> list[Gpu]:
    """The first ``n`` free GPUs, or a one-line refusal that says what holds the others."""
    free = [g for g in leasable if g.uuid not in busy]
    if len(free) >= n:
        return free[:n]
    why = list(busy.values()) + [g.error for g in gpus if g.error is not None]
    raise GpuError(
        f"--gpus {n}: only {len(free)} of {len(leasable) + len(why) - len(busy)} GPUs are free"
        + (f" ({'; '.join(why)})" if why else "")
    )


_INVENTORY: list[Gpu] = []


def lease_fit(
    request: str, leased: dict[str, str], *, share: bool, sick: dict[int, str] | None = None
) -> str | None:
    """Could ``request`` fit, judged by the home's leases and GPU health alone? None, or
    what holds it.

    The queue asks this four times a second without touching the driver: which GPUs a
    machine has does not change, so they are read once per process; a GPU leased by a
    live job is busy whatever its memory says. Foreign use is for `start` to find. An
    unhealthy GPU (``sick``: index -> why, gpu/health.py) is as good as absent: a job
    that needs more than the healthy count waits, saying so.
    """
    sick = sick or {}
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
    label = {g.uuid: g.label for g in _INVENTORY}
    if isinstance(parsed, int):
        healthy = [g for g in _INVENTORY if g.leasable and g.index not in sick]
        free = [g for g in healthy if g.uuid not in held]
        if len(free) >= parsed:
            return None
        ill = "".join(f"; GPU {i} {why}" for i, why in sorted(sick.items()))
        return f"needs {parsed} GPU(s), {len(free)} free" + _held_by(held, label) + ill
    named = [f"GPU {g.label} is {sick[g.index]}" for g in parsed if g.index in sick]
    busy = {g.uuid: held[g.uuid] for g in parsed if g.uuid in held}
    if busy:
        named.append(_held_by(busy, label).removeprefix("; "))
    return "; ".join(named) or None


def _held_by(held: dict[str, str], label: dict[str, str]) -> str:
    by_job: dict[str, list[str]] = {}
    for uuid, job in sorted(held.items(), key=lambda kv: label.get(kv[0], kv[0])):
        by_job.setdefault(job, []).append(label.get(uuid, uuid))
    parts = [
        f"GPU{'s' if len(ix) > 1 else ''} {' and '.join(ix)} held by {job}"
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


def lease_token(lease: GpuLease) -> str:
    """How a lease is named in CUDA_VISIBLE_DEVICES and the spec: an index, or MIG-…."""
    return lease.token


# ---------------------------------------------------------------- `trainctl gpus`


def gpu_inventory(home: Path) -> GpuInventory:
    """Return the driver and every GPU with its lease and processes (NVML list + fd scan)."""
    backend: GpuBackend = open_backend()
    try:
        markers, leased = known_markers(home)
        fds = fd_scan(backend)
        gpus = backend.gpus()
        health.look(home, gpus)  # the box's own look: whether or not a run holds the GPU
        sick, seen = health.unhealthy(home), health.last_faults(home)
        out = []
        for g in gpus:
            procs: list[GpuHolder] = []
            error = g.error
            if error is None and not g.mig_mode:
                try:
                    procs = holders_of(g, backend, fds)
                except GpuError as e:
                    error = str(e)
            procs = [p for p in procs if p.pid != os.getpid()]  # this command's own NVML
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
                    leased.get(g.uuid),
                    procs,
                    g.label,
                    g.mig,
                    g.mig_mode,
                    g.persistence,
                    g.ecc_uncorrected,
                    error,
                    sick[g.index].line() if g.index in sick else None,
                    seen[g.index].line() if g.index in seen and g.mig is None else None,
                )
            )
        return GpuInventory(backend.driver(), out)
    finally:
        backend.close()


def gpu_views(home: Path) -> list[GpuView]:
    """Return every GPU with its lease and every process on it."""
    return gpu_inventory(home).views


def gpu_memory_by_pid() -> dict[int, int | None]:
    """Return {pid: GPU memory (None if unknown)} for every local GPU holder; {} without GPUs."""
    try:
        backend = open_backend()
    except GpuError:
        return {}
    out: dict[int, int | None] = {}
    try:
        fds = fd_scan(backend)
        for g in backend.gpus():
            if g.error is not None or g.mig_mode:
                continue
            try:
                holders = holders_of(g, backend, fds)
            except GpuError:
                continue  # that GPU only
            for h in holders:
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
