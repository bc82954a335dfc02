"""Who belongs to a job: every net at once, strongest first.

Nets (a member records every net that caught it):

- ``cgroup``    listed in the job's cgroup v2 ``cgroup.procs``
- ``marker``    its initial environment holds ``TRAINCTL_JOB=<uuid>`` (setsid, double fork and
                nohup do not shed it; only an exec with a scrubbed environment does)
- ``tree``      a descendant of the main process by parent links
- ``subreaper`` a child of the supervisor other than main: an orphan that reparented to it
- ``child``     a descendant of any other member (catches a scrubbed-env exec below a member)
- ``pgroup`` / ``session``  shares the main's process group / session while main holds them
- ``snapshot``  listed in state.json's last member snapshot, same pid *and* start time

A process counts only while its ``(pid, start_ticks)`` is consistent; every job process
starts no earlier than the main process, so older processes are never even read beyond
their stat line. The calling process is never a member (a job may run ``trainctl stop``
on itself).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trainctl.supervisor.linux import cgroup as cg
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.linux.procfs import Stat
from trainctl.supervisor.model.procs import HELPER_VAR, NODE_VAR, ProcRef
from trainctl.supervisor.records import field, record

if TYPE_CHECKING:  # the state file's record, as a type: the tree sits below the state
    from trainctl.supervisor.model.state import JobState


@record(frozen=True)
class Target:
    """Everything a scan needs to recognise a job's processes."""

    marker: str
    main: ProcRef | None = None
    supervisor: ProcRef | None = None
    pgid: int | None = None
    sid: int | None = None
    cgroup: Path | None = None
    # nets each member was found by in the last snapshot: a stop that takes its members
    # from cgroup.procs reports them fully even for processes gone before its full scan
    known_nets: dict[ProcRef, tuple[str, ...]] = field(default_factory=dict)
    # ... and their command lines then, for the stop report (see terminate._Tracker)
    known_cmds: dict[ProcRef, str] = field(default_factory=dict)
    # a Slurm node agent: only the marked processes of its own node (NODE_VAR). Two
    # slurmd on one host (--enable-multiple-slurmd, the test bed) share one /proc, and
    # each agent would otherwise stop the other node's ranks by the job's marker.
    node: str | None = None


class Member:
    """A process of the job as seen by one scan."""

    __slots__ = ("nets", "ref", "stat")

    def __init__(self, stat: Stat, nets: set[str] | None = None) -> None:
        self.stat = stat
        self.nets: set[str] = set() if nets is None else nets
        # the trusted identity (pid + start time), made once: a stop plan asks for it often
        self.ref = ProcRef(stat.pid, stat.start_ticks)

    def __repr__(self) -> str:
        return f"Member(stat={self.stat!r}, nets={self.nets!r}, ref={self.ref!r})"

    @property
    def escaped(self) -> bool:
        """Tell whether it left main's tree (setsid + double fork, reparented, ...)."""
        return "main" not in self.nets and "tree" not in self.nets

    @property
    def alive(self) -> bool:
        """A zombie has finished running: it only waits to be reaped."""
        return self.stat.state not in ("Z", "X")


def target_of(st: JobState) -> Target:
    """Build the scan target of a recorded run (supervisor and CLI alike).

    Only what can still be trusted goes in: a cgroup path outside trainctl's own subtree
    is dropped (its processes are not ours to kill), and a run from another boot keeps
    only its marker and cgroup, because its pids and start times now name strangers.
    """
    group = Path(st.cgroup) if st.cgroup else None
    cgroup = group if group is not None and cg.is_ours(group) else None
    if st.from_other_boot():
        return Target(marker=st.marker, cgroup=cgroup)
    return Target(
        marker=st.marker,
        main=st.main,
        supervisor=st.supervisor,
        pgid=st.pgid,
        sid=st.sid,
        cgroup=cgroup,
        known_nets=st.member_nets(),
        known_cmds={ProcRef(m.pid, m.start_ticks): m.cmd for m in st.members},
    )


def _verified(ref: ProcRef | None, stats: dict[int, Stat]) -> bool:
    return ref is not None and ref.pid in stats and stats[ref.pid].start_ticks == ref.start_ticks


def _candidates(target: Target) -> dict[int, Stat]:
    """Stat every process that could belong to the job (started no earlier than main)."""
    floor = target.main.start_ticks if target.main else 0
    out: dict[int, Stat] = {}
    for pid in procfs.list_pids():
        st = procfs.read_stat(pid)
        if st is not None and st.start_ticks >= floor:
            out[pid] = st
    return out


def scan(target: Target) -> dict[int, Member]:
    """Return every live-or-zombie process of the job, keyed by pid."""
    me = os.getpid()
    stats = _candidates(target)
    members: dict[int, Member] = {}

    def add(pid: int, net: str) -> None:
        if pid == me or pid not in stats:
            return
        if target.supervisor and pid == target.supervisor.pid:
            return
        members.setdefault(pid, Member(stats[pid])).nets.add(net)

    main_ok = _verified(target.main, stats)
    if main_ok and target.main:
        add(target.main.pid, "main")
    # The last member snapshot, each verified by start time: it still finds a member that
    # escaped every other net (setsid + double fork + scrubbed env, supervisor gone).
    for ref in target.known_nets:
        if _verified(ref, stats):
            add(ref.pid, "snapshot")
    if target.cgroup is not None:
        for pid in cg.read_pids(target.cgroup):
            add(pid, "cgroup")
    _add_by_fields(stats, target, main_ok, add)
    _add_descendants(stats, members, target, add)
    return members


def _add_by_fields(
    stats: dict[int, Stat], target: Target, main_ok: bool, add: Callable[[int, str], None]
) -> None:
    """The per-process nets: marker, subreaper, process group, session."""
    needle = f"TRAINCTL_JOB={target.marker}".encode()
    helper = f"{HELPER_VAR}={target.marker}".encode()
    node_key, node = f"{NODE_VAR}=".encode(), (target.node or "").encode()
    # The supervisor started before main, so it is not among the candidates: check it alone.
    sup = target.supervisor
    sup_pid = (
        sup.pid if sup is not None and procfs.is_supervisor(sup.pid, sup.start_ticks) else None
    )
    # pgid/sid numbers cannot be recycled while main holds them (the kernel keeps the
    # struct pid alive), so they identify the job only while main is verified.
    pgid = target.pgid if main_ok else None
    sid = target.sid if main_ok else None
    for pid, st in stats.items():
        # a node agent's marker net skips what another node's agent on this host started
        mine = (
            procfs.has_marker_of_node(pid, needle, node_key, node)
            if target.node
            else procfs.has_marker(pid, needle)
        )
        if mine:
            add(pid, "marker")
        if sup_pid is not None and st.ppid == sup_pid and not procfs.has_marker(pid, helper):
            add(pid, "subreaper")  # an orphan of the job, not one of the supervisor's helpers
        if pgid is not None and st.pgid == pgid:
            add(pid, "pgroup")
        if sid is not None and st.sid == sid:
            add(pid, "session")


def scan_counted(target: Target) -> dict[int, Member]:
    """The members as `status` counts them (the CLI's count, and the supervisor's answer
    to it): the job's cgroup.procs while its cgroup is there, else the full scan."""
    if target.cgroup is not None and target.cgroup.is_dir():
        return scan_cgroup(target)
    return scan(target)


def scan_cgroup(target: Target) -> dict[int, Member]:
    """Return the members listed in the job's cgroup alone (no /proc walk, no environ reads).

    Half the cost of :func:`scan` for a big tree; it misses only processes moved out of
    the cgroup (which takes root), so the stop sequence still runs a full scan after it.
    """
    out: dict[int, Member] = {}
    if target.cgroup is None:
        return out
    me = os.getpid()
    floor = target.main.start_ticks if target.main else 0
    for pid in cg.read_pids(target.cgroup):
        st = procfs.read_stat(pid)
        if st is None or pid == me or st.start_ticks < floor:
            continue  # older than main: whatever it is, it was not started by this job
        m = out[pid] = Member(st, {"cgroup"})
        if target.main is not None and target.main == m.ref:
            m.nets.add("main")
    if target.main is not None and target.main.pid in out:
        children: dict[int, list[int]] = {}
        for pid, m in out.items():
            children.setdefault(m.stat.ppid, []).append(pid)
        for pid in descendants(children, target.main.pid):
            out[pid].nets.add("tree")
    return out


def scan_light(target: Target) -> dict[int, Member]:
    """The members as the supervisor tracks them between full scans, at a cost that grows
    with the job, not with the host: cgroup.procs in cgroup mode, else the process tree
    below the supervisor (main, and the orphans it adopted as subreaper), followed through
    /proc/PID/task/TID/children. The full :func:`scan` (every /proc entry, every environ)
    still runs at start, at stop, and now and then as a safety net.
    """
    if target.cgroup is not None and target.cgroup.is_dir():
        return scan_cgroup(target)
    me = os.getpid()
    floor = target.main.start_ticks if target.main else 0
    out: dict[int, Member] = {}
    helper = f"{HELPER_VAR}={target.marker}".encode()
    stack = [p for p in procfs.children(me) if not procfs.has_marker(p, helper)]
    if target.main is not None:
        stack.append(target.main.pid)  # an adopted main is not our child: its tree too
    while stack:
        pid = stack.pop()
        if pid in out or pid == me:
            continue
        st = procfs.read_stat(pid)
        if st is None or st.start_ticks < floor:
            continue
        m = out[pid] = Member(st, {"subreaper" if st.ppid == me else "tree"})
        if target.main is not None and m.ref == target.main:
            m.nets = {"main"}
        stack.extend(procfs.children(pid))
    return out


def _add_descendants(
    stats: dict[int, Stat],
    members: dict[int, Member],
    target: Target,
    add: Callable[[int, str], None],
) -> None:
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(st.ppid, []).append(pid)
    main_pid = target.main.pid if target.main and target.main.pid in members else None
    if main_pid is not None:
        for pid in descendants(children, main_pid):
            add(pid, "tree")
    for root in list(members):
        for pid in descendants(children, root):
            if pid not in members:
                add(pid, "child")


def descendants(children: dict[int, list[int]], root: int) -> list[int]:
    """Return every pid below ``root`` in a {parent: [children]} map."""
    out: list[int] = []
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def alive(members: dict[int, Member]) -> dict[int, Member]:
    """Return the members that are still running (not zombies)."""
    return {pid: m for pid, m in members.items() if m.alive}
