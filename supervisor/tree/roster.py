"""The job's members as the supervisor holds them between stops, each by a pidfd.

In cgroup mode the supervisor keeps a roster of the run's members: each one's stat
fields and a pidfd, which turns readable the moment that process exits. A refresh reads
``cgroup.procs`` once, polls the held pidfds once, and reads ``/proc/PID/stat`` only for
processes that joined (and once more, a tick later, for those that were new at the last
refresh). Its cost follows the job's churn, not its size, and not the host's.

A stop *takes* the roster instead of reading every member again. When nothing joined or
exited since the last refresh, the tree's shape is what the roster says: a parent link
moves only when the parent exits, and that exit shows on the parent's pidfd. So the stop
plans at once and signals through the held pidfds, which name exactly the processes
they were opened for (no recycled pid can receive a signal meant for a member). What
decides the order, who catches the signal and who is a launcher, the stop's planner
still reads fresh from /proc.

What a roster can hold stale: the process group and session of a member that called
setpgid/setsid long after it was born without forking or exiting since. Neither decides
who is signalled (pidfds do); the session only feeds one launcher hint.
"""

from __future__ import annotations

import os
import resource
import select
import threading
from pathlib import Path

from trainctl.supervisor.linux import cgroup as cg
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model.procs import ProcRef
from trainctl.supervisor.records import record

from .proctree import Member, Target, descendants


@record()
class Held:
    """One member and the pidfd that holds it (None past the fd budget: checked by stat)."""

    member: Member
    fd: int | None
    settled: bool = False  # read again at a later refresh than the one that found it


# fds the supervisor's table is grown to at start (see widen_fd_table)
FD_TABLE = 4096


def widen_fd_table() -> None:
    """Grow this process's fd table once, at start, to FD_TABLE entries (or the limit).

    The kernel grows a process's fd table by doubling it, and in a multi-threaded process
    every growth waits for an RCU grace period: 300 pidfds opened from a worker thread
    took 13.8 ms here, 0.8 ms with the table grown beforehand. A stop opens one pidfd per
    member, so without this it would pay those waits in the middle of the stop. Tables
    never shrink; the cost is FD_TABLE pointers of memory.
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = (FD_TABLE if soft == resource.RLIM_INFINITY else min(FD_TABLE, soft)) - 1
    if top < 64:
        return
    fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.dup2(fd, top, inheritable=False)
        os.close(top)
    except OSError:
        pass  # a table this size is not allowed: the stop only runs a little slower
    finally:
        os.close(fd)


def _fd_budget() -> int:
    """How many pidfds a roster may hold: half the soft limit, leaving the rest for the
    stop's own pidfds, the control socket and the logs."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(0, (soft if soft != resource.RLIM_INFINITY else 65536) // 2 - 64)


class Roster:
    """The run's cgroup members, refreshed incrementally; a stop takes it over whole."""

    def __init__(self, target: Target) -> None:
        if target.cgroup is None:
            raise ValueError("a roster follows a cgroup")
        self.target = target
        self.cgroup: Path = target.cgroup
        self.floor = target.main.start_ticks if target.main else 0
        self.held: dict[int, Held] = {}  # by pid
        self.by_fd: dict[int, int] = {}  # fd -> pid
        self.poller = select.poll()
        self.budget = _fd_budget()
        self.taken = False
        self.lock = threading.Lock()  # the snapshot task and a stop run in worker threads

    def refresh(self) -> dict[int, Member]:
        """Bring the roster up to date; return a copy of its live members, keyed by pid."""
        with self.lock:
            if self.taken:
                return {}
            self._update()
            return {pid: Member(h.member.stat, set(h.member.nets)) for pid, h in self.held.items()}

    def take(self) -> list[Held] | None:
        """Bring the roster up to date and hand every member, with its pidfd, to a stop.

        The stop then owns (and closes) the pidfds; the roster is empty from here on.
        Processes that joined since the last refresh come without a pidfd (the stop opens
        one after its first signals, as for any member it finds itself). None when the
        roster never held anything: the stop then collects the members itself, as fast.
        """
        with self.lock:
            if self.taken:
                return None
            self.taken = True
            if not self.held:
                return None
            self._update(open_fds=False)
            out = list(self.held.values())
            self.held.clear()
            self.by_fd.clear()
            return out

    def close(self) -> None:
        """Release every pidfd (a run that ended without a stop taking them)."""
        with self.lock:
            for fd in self.by_fd:
                os.close(fd)
            self.held.clear()
            self.by_fd.clear()
            self.taken = True

    # ------------------------------------------------------------ internals

    def _update(self, *, open_fds: bool = True) -> None:
        listed = cg.read_pids(self.cgroup)
        gone = self._exited()
        for pid in gone:
            self.held.pop(pid, None)
        for h in self.held.values():
            # A parent exited: its children have a new parent. A member found at an earlier
            # refresh and not read since may have called setsid right after its fork.
            if h.member.stat.ppid in gone or not h.settled:
                self._reread(h)
                h.settled = True
        me = os.getpid()
        for pid in listed:
            if pid not in self.held and pid != me:
                self._join(pid, open_fd=open_fds)
        self._mark_nets(set(listed))

    def _exited(self) -> set[int]:
        """Close the pidfds of members that exited; return their pids."""
        gone: set[int] = set()
        for fd, _ev in self.poller.poll(0):
            pid = self.by_fd.pop(fd)
            self.poller.unregister(fd)
            os.close(fd)
            gone.add(pid)
        for pid, h in self.held.items():
            if h.fd is None and not procfs.is_alive(pid, h.member.stat.start_ticks):
                gone.add(pid)
        return gone

    def _join(self, pid: int, *, open_fd: bool) -> None:
        fd: int | None = None
        if open_fd and len(self.by_fd) < self.budget:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                return
            except OSError:
                fd = None  # out of fds after all: this one is checked by stat
        st = procfs.read_stat(pid)  # read after the open: the fd is this process's
        if st is None or st.start_ticks < self.floor or st.state in ("Z", "X"):
            if fd is not None:
                os.close(fd)
            return  # gone, or older than main: whatever it is, this job did not start it
        self.held[pid] = Held(Member(st, {"cgroup"}), fd)
        if fd is not None:
            self.by_fd[fd] = pid
            self.poller.register(fd, select.POLLIN)

    def _reread(self, h: Held) -> None:
        st = procfs.read_stat(h.member.stat.pid)
        if st is not None and st.start_ticks == h.member.stat.start_ticks:
            h.member.stat = st
            h.member.ref = ProcRef(st.pid, st.start_ticks)

    def _mark_nets(self, listed: set[int]) -> None:
        main = self.target.main
        children: dict[int, list[int]] = {}
        for pid, h in self.held.items():
            h.member.nets = {"cgroup"} if pid in listed else {"snapshot"}
            children.setdefault(h.member.stat.ppid, []).append(pid)
        if main is not None and main.pid in self.held:
            m = self.held[main.pid].member
            if m.ref == main:
                m.nets.add("main")
                for pid in descendants(children, main.pid):
                    self.held[pid].member.nets.add("tree")
