"""Read-only views of jobs: status, list, ps, logs. Import-light: `status` must stay fast."""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import os
import select
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainctl.supervisor import procfs, state
from trainctl.supervisor.errors import ConfigError, JobNotFoundError, StateError, TrainctlError
from trainctl.supervisor.proctree import scan, scan_cgroup, target_of
from trainctl.supervisor.spec import Spec, StopOrder
from trainctl.supervisor.state import Phase

from . import backends
from .exitcodes import ExitCode
from .jobs import current_phase, existing_job

RUNNING_PHASES = frozenset({Phase.STARTING, Phase.RUNNING, Phase.STOPPING})


@dataclass(slots=True)
class Status:
    """What `trainctl status NAME` shows (and `--json` emits)."""

    name: str
    state: str
    run: int
    main_pid: int | None
    pgid: int | None
    supervisor_pid: int | None
    supervisor_alive: bool
    exit_code: int | None
    members: int
    escaped: int
    mode: str
    cgroup: str | None
    started_at: float
    ended_at: float | None
    uptime_s: float
    log: str
    last_log_line: str
    argv: list[str] = field(default_factory=list)
    cwd: str | None = None  # the job's working directory (spec), for shorter commands
    last_stop: dict[str, Any] | None = None
    error: str | None = None
    previous_boot: bool = False  # recorded before the machine last booted
    unit: str | None = None  # the run's systemd scope
    gpus: list[int] = field(default_factory=list)
    restarts: int = 0
    last_failure: dict[str, Any] | None = None
    restart_in_s: float | None = None
    stalled_for_s: float | None = None
    checkpoint: dict[str, Any] | None = None  # newest: path, age_s, size
    progress: dict[str, Any] | None = None
    code_changed: list[str] = field(default_factory=list)
    slurm: dict[str, Any] | None = None  # Slurm backend: state, reason, nodes, job id

    def to_doc(self) -> dict[str, Any]:
        """Return the JSON form."""
        return asdict(self)


def status_exit_code(s: Status) -> int:
    """0 while the run is live, 3 once it has ended, 4 when its supervisor is lost."""
    if s.state == Phase.LOST:
        return ExitCode.STATE_UNKNOWN
    return ExitCode.OK if s.state in RUNNING_PHASES else ExitCode.NOT_RUNNING


def last_line(path: Path) -> str:
    """Return the last non-empty line of a file, cheaply (reads at most 8 KiB)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return ""
    for raw in reversed(lines):
        text = raw.decode(errors="replace").strip()
        # progress bars rewrite one line with \r: show its latest frame
        text = text.rsplit("\r", 1)[-1].strip()
        if text:
            return text[:200]
    return ""


def job_status(home: Path, name: str, *, brief: bool = False) -> Status:
    """Return the status of a job, with a live member count.

    ``brief`` (the `list` table): without what comes from the spec (argv, cwd) and the
    training view (checkpoint, progress, drift), which the table does not show.
    """
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    spec: Spec | None = None
    if not brief:
        with contextlib.suppress(StateError, JobNotFoundError):
            spec = state.read_spec(jdir)
    seen = backends.of(st).seen(jdir, st)
    st = dataclasses.replace(st, exit_code=seen.exit_code)
    phase = seen.phase
    sup_alive = phase not in state.TERMINAL and phase != Phase.LOST
    target = target_of(st)
    # cgroup.procs is cheap and complete unless root moved a process out; use it for the
    # frequent `status`, while `ps` and `stop` walk every net.
    scan_fn = scan_cgroup if target.cgroup is not None and target.cgroup.is_dir() else scan
    members = (
        scan_fn(target)
        if seen.members is None
        and (
            phase not in state.TERMINAL or st.last_stop is None or not st.last_stop.get("ok", True)
        )
        else {}
    )
    live = [m for m in members.values() if m.alive]
    now = time.time()
    end = st.ended_at or now
    log = state.log_path(jdir, st.run)
    training = _training_view(jdir, st, spec, live=phase not in state.TERMINAL)
    return Status(
        name=st.name,
        state=str(phase),
        run=st.run,
        main_pid=st.main.pid if st.main else None,
        pgid=st.pgid,
        supervisor_pid=st.supervisor.pid if st.supervisor else None,
        supervisor_alive=sup_alive,
        exit_code=st.exit_code,
        members=len(live) if seen.members is None else seen.members,
        escaped=sum(1 for m in live if m.escaped) if seen.whole_job_here else 0,
        mode=seen.mode,
        cgroup=st.cgroup,
        started_at=st.started_at,
        ended_at=st.ended_at,
        uptime_s=round(end - st.started_at, 3),
        log=str(log),
        last_log_line=last_line(log),
        argv=list(spec.argv) if spec else [],
        cwd=spec.cwd if spec else None,
        last_stop=st.last_stop,
        error=st.error,
        previous_boot=st.from_other_boot(),
        unit=st.unit,
        gpus=[g.index for g in st.gpus],
        restarts=st.restarts,
        last_failure=st.last_failure,
        restart_in_s=None if st.restart_at is None else round(max(0.0, st.restart_at - now), 1),
        stalled_for_s=None if st.stalled_since is None else round(now - st.stalled_since, 1),
        slurm=seen.details,
        **training,
    )


def _training_view(
    jdir: Path, st: state.JobState, spec: Spec | None, *, live: bool
) -> dict[str, Any]:
    """Checkpoint, progress and code drift for `status` (cheap: tails and one git diff)."""
    if spec is None:
        return {}
    from .checkpoint import newest_checkpoint  # noqa: PLC0415
    from .progress import read_progress  # noqa: PLC0415

    out: dict[str, Any] = {}
    ck = newest_checkpoint(spec)
    if ck is not None:
        out["checkpoint"] = {"path": ck.path, "age_s": round(ck.age_s, 1), "size": ck.size}
    prog = read_progress(jdir, st, spec)
    if prog is not None:
        out["progress"] = prog.to_doc()
    if live and st.drift_checked_at is not None:
        out["code_changed"] = list(st.code_drift)  # kept current by the supervisor
    elif live:  # a supervisor from before this field, or one that has not looked yet
        from trainctl.supervisor.drift import drift  # noqa: PLC0415

        out["code_changed"] = drift(st.code, spec)
    return out


def all_statuses(home: Path, *, brief: bool = False) -> list[Status | tuple[str, str]]:
    """Return the status of every job; an untrusted one becomes (name, error)."""
    out: list[Status | tuple[str, str]] = []
    for name in state.list_jobs(home):
        try:
            out.append(job_status(home, name, brief=brief))
        except (StateError, ConfigError) as e:
            out.append((name, str(e)))
        except FileNotFoundError:
            continue
    return out


@dataclass(frozen=True, slots=True)
class PsRow:
    """One process of a job, for `trainctl ps`."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    cpu_percent: float
    rss_bytes: int
    escaped: bool
    nets: list[str]
    cmd: str
    depth: int
    gpu_holder: bool = False  # has a GPU open
    gpu_bytes: int | None = None  # its GPU memory, when the driver reports it
    stop_role: str = ""  # first | after parent | launcher: WHY (see supervisor/forest.py)
    unit: str | None = None  # the run's systemd scope (the same for every row)
    node: str | None = None  # Slurm: the node it runs on, as its agent published it


def job_ps(home: Path, name: str, sample_s: float = 0.2) -> list[PsRow]:
    """Return the job's live process tree, parents before children (escapees at top level)."""
    import psutil  # noqa: PLC0415  (only `ps` pays for it)

    from .gpus import gpu_memory_by_pid  # noqa: PLC0415

    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    elsewhere = backends.of(st).seen(jdir, st).processes
    if elsewhere is not None:  # on the nodes that run them, as their agents published them
        return [_remote_row(p) for p in elsewhere]
    members = {pid: m for pid, m in scan(target_of(st)).items() if m.alive}
    roles = _stop_roles(jdir, st, list(members.values()))
    procs: dict[int, psutil.Process] = {}
    for pid in members:
        try:
            procs[pid] = psutil.Process(pid)
            procs[pid].cpu_percent(None)
        except psutil.NoSuchProcess:
            continue
    gpu_mem = gpu_memory_by_pid() if procs else {}  # doubles as part of the CPU sample
    time.sleep(sample_s if procs else 0)
    rows: list[PsRow] = []
    for pid, depth in _tree_order(members):
        m = members[pid]
        try:
            cpu = procs[pid].cpu_percent(None) if pid in procs else 0.0
            rss = procs[pid].memory_info().rss if pid in procs else 0
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            cpu, rss = 0.0, 0
        rows.append(
            PsRow(
                pid=pid,
                ppid=m.stat.ppid,
                pgid=m.stat.pgid,
                sid=m.stat.sid,
                state=m.stat.state,
                cpu_percent=round(cpu, 1),
                rss_bytes=rss,
                escaped=m.escaped and "main" not in m.nets,
                nets=sorted(m.nets),
                cmd=procfs.read_cmdline(pid) or f"[{m.stat.comm}]",
                depth=depth,
                gpu_holder=pid in gpu_mem,
                gpu_bytes=gpu_mem.get(pid),
                stop_role=roles.get(m.ref, ""),
                unit=st.unit,
            )
        )
    return rows


def _remote_row(p: dict[str, Any]) -> PsRow:
    return PsRow(
        pid=int(p["pid"]),
        ppid=int(p.get("ppid", 0)),
        pgid=0,
        sid=0,
        state=str(p.get("state", "?")),
        cpu_percent=0.0,
        rss_bytes=0,
        escaped=False,
        nets=["agent"],
        cmd=str(p.get("cmd", "")),
        depth=0,
        node=str(p["node"]),
    )


def job_cwd(home: Path, name: str) -> str | None:
    """The job's working directory, when its spec is readable (for shorter commands)."""
    try:
        return state.read_spec(existing_job(home, name)).cwd
    except (StateError, JobNotFoundError):
        return None


def job_unit(home: Path, name: str) -> str | None:
    """The systemd scope of the job's current run, if it has one."""
    return state.read_state(existing_job(home, name)).unit


def _stop_roles(jdir: Path, st: state.JobState, live: list[Any]) -> dict[Any, str]:
    """What `stop` would do to each member now, under the job's own order and signal."""
    import signal  # noqa: PLC0415

    from trainctl.supervisor.forest import stop_roles  # noqa: PLC0415

    try:
        spec = state.read_spec(jdir)
    except TrainctlError:
        return {}  # ps still shows the tree; only the stop column stays empty
    order = StopOrder(spec.stop.order)
    return stop_roles(live, order, signal.Signals[spec.stop.signal], st.main)


def _tree_order(members: dict[int, Any]) -> list[tuple[int, int]]:
    kids: dict[int, list[int]] = {}
    roots = []
    for pid, m in sorted(members.items()):
        if m.stat.ppid in members:
            kids.setdefault(m.stat.ppid, []).append(pid)
        else:
            roots.append(pid)
    out: list[tuple[int, int]] = []
    stack = [(pid, 0) for pid in reversed(roots)]
    while stack:
        pid, depth = stack.pop()
        out.append((pid, depth))
        stack.extend((c, depth + 1) for c in reversed(kids.get(pid, [])))
    return out


# ---------------------------------------------------------------- logs


def log_lines(
    home: Path, name: str, run: int | None, tail: int | None, *, node: str | None = None
) -> tuple[Path, list[str]]:
    """Return the log path of run ``run`` (default: current) and its last ``tail`` lines.

    ``tail`` None means the whole log; 0 means no line (as ``tail -n 0``). ``node``: the
    log of that node of a multi-node Slurm job (the first node's is the run's own log).
    """
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    run = st.run if run is None else run
    if run < 1 or run > st.run:
        raise ConfigError(f"job {name} has runs 1..{st.run}, not {run}")
    path = state.log_path(jdir, run)
    if node is not None:
        path = _node_log(jdir, run, node, path)
    try:
        data = path.read_bytes() if tail is None else _tail_bytes(path, tail)
    except FileNotFoundError:
        data = b""
    lines = data.decode(errors="replace").splitlines(keepends=True)
    if tail is None:
        return path, lines
    return path, lines[len(lines) - tail :] if tail else []


def _node_log(jdir: Path, run: int, node: str, first: Path) -> Path:
    """The log file node ``node`` writes (see supervisor/node.py: node_log)."""
    from .slurm import node_records  # noqa: PLC0415

    records = {r["node"]: r for r in node_records(jdir, run)}
    if node not in records:
        known = ", ".join(sorted(records)) or "none reported yet"
        raise ConfigError(f"run {run} of job {jdir.name} has no node {node!r} (nodes: {known})")
    if records[node].get("rank") in (None, "", "0"):
        return first
    return first.with_name(f"run-{run}.{node}.log")


def _tail_bytes(path: Path, lines: int, block: int = 1 << 16) -> bytes:
    """The end of ``path`` holding its last ``lines`` lines, read backwards block by block.

    `logs -n 5` on a 500 MiB log reads a few KiB, not the file: its cost does not grow
    with the log.
    """
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        pos, chunks, newlines = end, [], 0
        while pos > 0 and newlines <= lines:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            chunk = f.read(step)
            chunks.append(chunk)
            # a final line without its newline still counts as a line
            newlines += chunk.count(b"\n")
        return b"".join(reversed(chunks))


def reader_gone(fd: int = 1) -> bool:
    """Tell whether nobody reads ``fd`` any more (ssh gone, `| head` done)."""
    p = select.poll()
    p.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))


def follow(home: Path, name: str, path: Path, poll_s: float) -> Iterator[str]:
    """Yield new log text as it appears, switching to the next run's log after a restart.

    Ends when the job has finished and its log is drained: the run is over (or its
    supervisor is lost and no process of it is left) and nobody holds the job lock to
    restart it.
    """
    jdir = existing_job(home, name)
    run = int(path.stem.split("-")[-1])
    reader = _LogReader(path, from_end=True)
    while True:
        chunk = reader.read()
        if chunk:
            yield chunk
            continue
        st = state.read_state(jdir)
        if st.run > run:
            run += 1
            reader = _LogReader(state.log_path(jdir, run), from_end=False)
            yield f"==> {name} run {run} <==\n"
            continue
        if _finished(jdir, st) and not state.is_locked(jdir, "lock"):
            yield reader.read(final=True)
            return
        if reader_gone():
            # e.g. `trainctl --host X logs -f` after Ctrl-C: ssh is gone; do not linger
            return
        time.sleep(poll_s)


def _finished(jdir: Path, st: state.JobState) -> bool:
    phase = current_phase(jdir, st)
    if phase == Phase.LOST:
        return not any(m.alive for m in scan(target_of(st)).values())
    return phase in state.TERMINAL


class _LogReader:
    """Reads a growing log from an offset, never splitting a UTF-8 character."""

    def __init__(self, path: Path, *, from_end: bool) -> None:
        self.path = path
        self.pos = path.stat().st_size if from_end and path.exists() else 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read(self, *, final: bool = False) -> str:
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self.pos:
                    self.pos = 0  # rotated (copied, then truncated): read it from the start
                f.seek(self.pos)
                data = f.read(1 << 20)
        except FileNotFoundError:
            data = b""
        self.pos += len(data)
        return self.decoder.decode(data, final=final)
