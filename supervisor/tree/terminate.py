"""The stop algorithm: graceful first, then certain, then proven.

Synchronous and loop-free so that it runs both inside the supervisor (through
``anyio.to_thread``) and straight from the CLI when the supervisor is gone.

1. scan every net for members; nothing alive -> done
2. stop signal (then SIGCONT) to the members the stop order makes due: by default the top
   of the process forest first, a process's children once it has exited (see
   :mod:`.forest`); wait ``grace_s`` on pidfds, re-scanning, signalling each member the
   moment it becomes due (a parent exited, a newcomer appeared)
3. survivors: freeze (cgroup.freeze, or SIGSTOP-and-rescan until no new process appears),
   SIGKILL everything (cgroup.kill + pidfd), wait ``kill_wait_s`` re-scanning
4. report: who was found through which net, who got the signal and when, who exited on
   it and how fast, who needed SIGKILL (pid and command), who survived (pid, state,
   wchan) and which zombies wait for a reaper
"""

from __future__ import annotations

import os
import select
import signal
import statistics
import time
from collections.abc import Callable

from trainctl.supervisor.linux import cgroup as cg
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model.events import Escalated
from trainctl.supervisor.model.procs import ProcRef
from trainctl.supervisor.model.reports import NamedProc, StopReport, Survivor, Zombie
from trainctl.supervisor.model.spec import StopOrder, StopPolicy
from trainctl.supervisor.records import asdict

from .forest import Planner
from .proctree import Member, Target, scan, scan_cgroup
from .roster import Held, Roster

Emit = Callable[..., None]
BeforeKill = Callable[[list[ProcRef]], str | None]


# How many processes a report names one by one (the counts always cover everyone).
REPORT_NAMED = 64
# While members exit and none is waiting for its signal, exits are collected this often.
EXIT_BATCH_S = 0.001


class Grace:
    """The end of a stop's grace period; a later `stop --grace S` may bring it closer.

    Read by the stop's thread on every wake-up (at least every ``rescan_s``), shortened
    from the supervisor's event loop; a float assignment is atomic, so no lock is needed.
    """

    def __init__(self, end: float) -> None:
        self.end = end

    def shorten(self, seconds: float) -> float:
        """Make the grace end within ``seconds`` from now, never later; return the end."""
        self.end = min(self.end, time.monotonic() + seconds)
        return self.end

    def left_s(self) -> float:
        """Seconds of grace left (0 once it is over)."""
        return max(0.0, self.end - time.monotonic())


class _Tracker:
    """Members seen so far, a pidfd per live one, and the moment each was seen gone.

    Waiting polls the pidfds, so an exit is noticed the moment it happens (a pidfd turns
    readable when its process exits) instead of at the next tick of a sleep loop.
    """

    def __init__(self, target: Target, policy: StopPolicy) -> None:
        self.target, self.policy = target, policy
        self.known: dict[ProcRef, Member] = {}
        self.gone_at: dict[ProcRef, float] = {}
        self.waiting: dict[ProcRef, None] = {}  # known, not seen gone (ordered: a set's pop
        # order would shuffle the report)
        self.found_dead: set[ProcRef] = set()  # already zombies when first seen
        self.cmds: dict[ProcRef, str] = {}
        self.killed: set[ProcRef] = set()  # still alive when the grace ended: SIGKILLed
        self.fds: dict[int, ProcRef] = {}
        self.fd_of: dict[ProcRef, int] = {}  # the same pidfds, by member
        self.unwatched: list[ProcRef] = []
        self.nofd: set[ProcRef] = set()  # no pidfd could be opened (EMFILE): poll these
        # epoll, not poll(): a stop waits through one wakeup per few exits, and poll() sets
        # up a wait on every pidfd at each call (241 members: 241 each time)
        self.poller = select.epoll()
        self.last_scan = 0.0
        # The job's own supervisor is the subreaper its orphans exit to. Its stop reaps
        # them here, in the stop's thread, instead of leaving each zombie to the event
        # loop's next batch (service.REAP_BATCH_S, behind the GIL): until it is reaped the
        # process still answers `kill -0 -PGID` and shows in `ps`. A member is reaped when
        # its pidfd says it exited; one that exited while its parent lived becomes ours
        # only when that parent dies, so what is left is reaped again once every member
        # is gone (reap_left). Main never: its exit status is the supervisor's to record.
        me = target.supervisor
        self.reaper = me is not None and me.pid == os.getpid()
        self.unreaped: list[int] = []  # pidfds of members gone, not reaped by us yet

    def _add(self, members: list[Member], now: float) -> list[Member]:
        new = []
        for m in members:
            if m.ref in self.known:
                seen = self.known[m.ref]
                seen.nets |= m.nets
                seen.stat = m.stat  # fresh ppid: an orphan's parent link has changed
                continue
            self.known[m.ref] = m
            m.nets.update(self.target.known_nets.get(m.ref, ()))
            if m.alive:
                new.append(m)
                self.unwatched.append(m.ref)
                self.waiting[m.ref] = None
            else:
                self.found_dead.add(m.ref)
                self._gone(m.ref, now)
        return new

    def _gone(self, ref: ProcRef, now: float) -> None:
        self.gone_at.setdefault(ref, now)
        self.waiting.pop(ref, None)

    def adopt(self, held: list[Held]) -> list[Member]:
        """Take the supervisor's roster: members with the pidfds already held on them.

        Returns the live ones. Their pidfds signal them from now on, are watched from the
        next watch_all (after the first signals: registering them costs ~0.3 ms for 241)
        and are closed with the tracker's; a member without one is watched like any other
        newcomer.
        """
        new = self._add([h.member for h in held], time.monotonic())
        for h in held:
            if h.fd is None:
                continue
            ref = h.member.ref
            if self.known.get(ref) is h.member and ref not in self.gone_at:
                self._hold(h.fd, ref, watch=False)
            else:
                os.close(h.fd)
        return new

    def watch_all(self) -> None:
        """Open pidfds for members seen since the last call.

        Called *after* signalling, so the stop signal is not delayed by ~2 syscalls per
        member; a member that exits in between is simply seen gone (pidfd_open fails, or
        the start time no longer matches).
        """
        now = time.monotonic()
        for ref in self.unwatched:
            if ref in self.gone_at:
                continue
            fd = self.fd_of.get(ref)
            if fd is not None:
                self.poller.register(fd, select.EPOLLIN)  # adopted with its pidfd
            elif not self._watch(ref):
                self._gone(ref, now)
            elif len(self.cmds) < 2 * REPORT_NAMED and ref not in self.target.known_cmds:
                # for the report: read while it lives. Not for members the snapshot names:
                # reading the command line of a process that is exiting waits on its memory
                # map, and this runs while the whole tree exits.
                self.cmds[ref] = procfs.read_cmdline(ref.pid)[:200]
        self.unwatched.clear()

    def cmd(self, ref: ProcRef) -> str:
        """Return the command line of a member as read while it lived, else its comm."""
        return (
            self.cmds.get(ref)
            or self.target.known_cmds.get(ref, "")[:200]
            or f"[{self.known[ref].stat.comm}]"
        )

    def _watch(self, ref: ProcRef) -> bool:
        """Open a pidfd for ``ref``; False if it is already gone."""
        try:
            fd = os.pidfd_open(ref.pid)
        except ProcessLookupError:
            return False
        except OSError:  # out of fds (EMFILE): this member is checked by polling instead
            self.nofd.add(ref)
            return procfs.is_alive(ref.pid, ref.start_ticks)
        if not procfs.is_alive(ref.pid, ref.start_ticks):  # checked after open: see procfs
            self._release(fd, ref)
            return False
        self._hold(fd, ref)
        return True

    def _hold(self, fd: int, ref: ProcRef, *, watch: bool = True) -> None:
        self.fds[fd] = ref
        self.fd_of[ref] = fd
        if watch:
            self.poller.register(fd, select.EPOLLIN)

    def rescan(self) -> list[Member]:
        """Scan all nets; return live members never seen before."""
        self.last_scan = time.monotonic()
        return self._add(list(scan(self.target).values()), self.last_scan)

    def collect_cgroup(self) -> list[Member]:
        """Take the members listed in the job's cgroup (cheap: one file plus their stats)."""
        return self._add(list(scan_cgroup(self.target).values()), time.monotonic())

    def pending(self) -> list[ProcRef]:
        """Return the known members not seen gone yet."""
        self.watch_all()
        self._reap_fds(0)
        now = time.monotonic()
        for ref in [r for r in self.nofd if r in self.waiting]:
            if not procfs.is_alive(ref.pid, ref.start_ticks):
                self._gone(ref, now)
        return list(self.waiting)

    def _reap_fds(self, timeout_s: float) -> None:
        for fd, _ev in self.poller.poll(max(0.0, timeout_s), maxevents=len(self.fds) or 1):
            ref = self.fds.pop(fd)
            del self.fd_of[ref]
            self._gone(ref, time.monotonic())
            self.poller.unregister(fd)
            self._release(fd, ref)

    def _release(self, fd: int, ref: ProcRef) -> None:
        """Close the pidfd of a member seen gone, reaping it first where it is ours."""
        if not self.reaper or ref == self.target.main or _reaped(fd):
            os.close(fd)
        else:
            self.unreaped.append(fd)  # not our child yet: its parent still lives

    def reap_left(self) -> None:
        """Reap the members gone since whose parent has died too (now ours, see above)."""
        left = []
        for fd in self.unreaped:
            if _reaped(fd):
                os.close(fd)
            else:
                left.append(fd)
        self.unreaped = left

    def live(self) -> list[Member]:
        """Return the known members not seen gone yet."""
        return [self.known[r] for r in self.pending()]

    def wait_gone(
        self,
        until: float | Grace,
        on_change: Callable[[list[Member]], None],
        *,
        all_sent: Callable[[], bool] = lambda: True,
    ) -> list[ProcRef]:
        """Wait until no known member is alive and a fresh scan finds none; return the rest.

        ``until`` is a timeout in seconds, or a :class:`Grace` whose end may move closer
        while we wait. ``on_change(new)`` runs after every re-scan (``new``: the members it
        found) and whenever members exited (``[]``): an exit, or time passing, may make
        members due.

        Once ``all_sent()`` (every member has had its signal, so an exit changes nothing
        but the count), exits are collected in batches, EXIT_BATCH_S apart, instead of one
        wakeup each: a 241-process tree exiting within 25 ms cost ~150 wakeups and ~5 ms
        of CPU, which the exiting tree needed. An exit is then seen at most that late.
        """
        grace = until if isinstance(until, Grace) else Grace(time.monotonic() + until)
        gone = len(self.gone_at)
        while True:
            left = self.pending()
            if len(self.gone_at) != gone:
                gone = len(self.gone_at)
                on_change([])
                left = self.pending()
                if left and all_sent():
                    time.sleep(EXIT_BATCH_S)
                    left = self.pending()
            if not left or time.monotonic() - self.last_scan >= self.policy.rescan_s:
                if not left:
                    self.reap_left()  # before the scan: it need not read their zombies
                new = self.rescan()
                on_change(new)
                if new:
                    left = self.pending()
                elif not left:
                    return []
            now, deadline = time.monotonic(), grace.end
            if now >= deadline:
                return left
            wake = min(deadline, self.last_scan + self.policy.rescan_s)
            if self.nofd:  # some members have no pidfd: poll them too
                wake = min(wake, now + self.policy.max_poll_s)
            self._reap_fds(max(0.0, wake - now))

    def close(self) -> None:
        """Release every pidfd, and the epoll instance."""
        self.reap_left()
        for fd in [*self.fds, *self.unreaped]:
            os.close(fd)
        self.unreaped.clear()
        self.fds.clear()
        self.fd_of.clear()
        self.poller.close()


def _reaped(pidfd: int) -> bool:
    """Reap the exited process of ``pidfd`` if it is our child (an orphan of the job that
    reparented to its supervisor); False while it is anyone else's."""
    try:
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    except ChildProcessError:  # not our child (or reaped already by the event loop)
        return False
    except OSError:
        return True  # nothing more to do with it
    return True


def _signal_members(
    members: list[Member], target: Target, sig: int, *, group: bool, held: dict[ProcRef, int]
) -> int:
    """Signal the process group (if main holds it) and every member outside it by pidfd.

    A member with a pidfd already ``held`` on it is signalled through that: no lookup, and
    no recycled pid can get it. The group is used only when no member has one (the first
    round of a stop that collected its members itself): a roster's process groups may be
    stale, its pidfds never are.
    """
    sent = 0
    pgid = target.pgid
    use_group = (
        group
        and not any(m.ref in held for m in members)
        and pgid is not None
        and target.main is not None
        and target.main.pid == pgid
        and procfs.exists(target.main.pid, target.main.start_ticks)
    )
    if use_group and pgid is not None:
        # pgid cannot be recycled while its leader (main) exists, checked just above; the
        # remaining window is main being reaped *and* its pid reused within microseconds.
        try:
            os.killpg(pgid, sig)
            sent += 1
        except (ProcessLookupError, PermissionError):
            use_group = False
    for m in members:
        if use_group and m.stat.pgid == pgid:
            continue
        fd = held.get(m.ref)
        if fd is None:
            sent += procfs.send_signal(m.stat.pid, m.stat.start_ticks, sig)
        else:
            sent += procfs.signal_pidfd(fd, sig)
    return sent


def stop_tree(
    target: Target,
    policy: StopPolicy,
    *,
    emit: Emit | None = None,
    grace: Grace | None = None,
    roster: Roster | None = None,
    before_kill: BeforeKill | None = None,
) -> StopReport:
    """Stop every process of the job and nothing else; return the proof.

    A supervisor passes its ``roster`` (cgroup mode): the members it already holds by
    pidfd, brought up to date, so the first signals need no read of every member.
    ``before_kill`` sees who outlived the grace, before the SIGKILL (stacks.py writes
    their stacks) and returns where it put what it saw.
    """
    emit = emit or (lambda *_a, **_k: None)
    sig, order = policy.signum, StopOrder(policy.order)
    t0 = time.monotonic()
    report = StopReport(
        signal=signal.Signals(sig).name,
        grace_s=policy.grace_s,
        order=str(order),
        mode="cgroup" if target.cgroup else "signals",
    )
    tr = _Tracker(target, policy)
    plan = Planner(order, sig, target.main, launcher_linger_s=policy.launcher_linger_s)
    try:
        # Collect first. With a cgroup, its member list is enough to start signalling; the
        # full /proc scan (which also finds anything that left the cgroup) then runs once
        # the members are gone or rescan_s has passed, whichever is first, instead of
        # competing for the CPU with a tree that is busy exiting.
        held = roster.take() if roster is not None and target.cgroup is not None else None
        if held is not None:
            first = tr.adopt(held)
            report.held = len(tr.fd_of)
        else:
            first = tr.collect_cgroup() if target.cgroup else tr.rescan()
        if not first and target.cgroup:
            first = tr.rescan()
        if not first:
            report.already_stopped = True
            return _finish(report, tr, plan, t0, emit)
        _send_due(plan, first, target, emit, tr.fd_of)
        tr.last_scan = time.monotonic()

        def on_change(new: list[Member]) -> None:
            report.late_joiners += len(new)
            if new or len(plan.sent) < len(tr.known):  # exits change nothing once all are sent
                _send_due(plan, tr.live(), target, emit, tr.fd_of)

        began = time.monotonic()
        if grace is None:
            grace = Grace(began + policy.grace_s)
        else:
            grace.shorten(policy.grace_s)  # the grace starts with the first signal
        left = tr.wait_gone(
            grace, on_change, all_sent=lambda: len(plan.sent) + len(tr.found_dead) >= len(tr.known)
        )
        # the grace that applied: a later `stop --grace S` that joined may have cut it short
        report.grace_s = round(min(report.grace_s, max(0.0, grace.end - began)), 1)
        _count_exits(report, tr, plan)
        if left:
            if before_kill is not None:
                report.stacks = before_kill(left)
                if report.stacks:
                    emit("stacks_written", path=report.stacks, processes=len(left))
            report.killed, report.killed_procs = _escalate(tr, target, policy, emit)
        return _finish(report, tr, plan, t0, emit)
    finally:
        tr.close()


def _send_due(
    plan: Planner, live: list[Member], target: Target, emit: Emit, held: dict[ProcRef, int]
) -> None:
    """Send the stop signal, then SIGCONT, to every member the order makes due now."""
    due = plan.due([m for m in live if m.alive])
    if not due:
        return
    # First round with everyone due (order `all`, or a tree where nobody shields a child):
    # one killpg reaches the whole group, so the stop is as fast as a bare `kill -- -PGID`.
    group = not plan.sent and len(due) == sum(1 for m in live if m.alive)
    _signal_members(due, target, plan.sig, group=group, held=held)
    _signal_members(due, target, signal.SIGCONT, group=group, held=held)
    now = time.monotonic()
    for m in due:
        plan.sent[m.ref] = now
    emit(
        "signal_sent",
        signal=signal.Signals(plan.sig).name,
        order=str(plan.order),
        members=len(due),
        pids=[m.stat.pid for m in due[:REPORT_NAMED]],
    )


def _count_exits(report: StopReport, tr: _Tracker, plan: Planner) -> None:
    """Sort the members that left within the grace: on the signal, or without it."""
    exits = []
    for ref, gone in tr.gone_at.items():
        sent = plan.sent.get(ref)
        if sent is not None and gone >= sent:
            exits.append(gone - sent)
        elif sent is None and ref not in tr.found_dead:
            report.exited_unsignalled += 1  # e.g. loaders shut down by their rank
    exits.sort()
    report.signalled = len(plan.sent)
    report.exited_on_signal = len(exits)
    if exits:
        report.exit_s = {
            "first": round(exits[0], 4),
            "median": round(statistics.median(exits), 4),
            "last": round(exits[-1], 4),
        }


def _escalate(
    tr: _Tracker, target: Target, policy: StopPolicy, emit: Emit
) -> tuple[int, list[NamedProc]]:
    """Freeze what is left so nothing can fork, SIGKILL all of it, wait for it to go.

    Returns how many were killed and, for up to REPORT_NAMED of them, pid and command
    (read while they are frozen, so the command is still there to read).
    """
    frozen = target.cgroup is not None and cg.freeze(target.cgroup, policy.freeze_timeout_s)
    stopped = _stop_until_quiet(tr, policy, skip_cgroup=frozen)
    victims = [r for r in tr.known if r not in tr.gone_at]
    tr.killed.update(victims)
    named = [_named(ref) for ref in victims[:REPORT_NAMED]]
    emit(Escalated("cgroup" if frozen else "sigstop", len(victims), stopped, named))
    killed = 0
    if target.cgroup is not None:
        cg.kill(target.cgroup)
    for ref in victims:
        killed += procfs.send_signal(ref.pid, ref.start_ticks, signal.SIGKILL)

    def late(new: list[Member]) -> None:
        for m in new:
            procfs.send_signal(m.stat.pid, m.stat.start_ticks, signal.SIGKILL)

    tr.wait_gone(policy.kill_wait_s, late)
    if target.cgroup is not None:
        cg.thaw(target.cgroup)
    return max(killed, len(victims)), named


def _named(ref: ProcRef) -> NamedProc:
    return NamedProc(ref.pid, procfs.read_cmdline(ref.pid)[:200])


def _stop_until_quiet(tr: _Tracker, policy: StopPolicy, *, skip_cgroup: bool) -> int:
    """SIGSTOP every live member, re-scanning until a scan turns up nobody new."""
    stopped: set[ProcRef] = set()
    for rounds in range(1, policy.stop_rounds + 1):
        tr.rescan()
        todo = [
            r
            for r, m in tr.known.items()
            if r not in stopped and r not in tr.gone_at and not (skip_cgroup and "cgroup" in m.nets)
        ]
        if not todo:
            return rounds
        for ref in todo:
            procfs.send_signal(ref.pid, ref.start_ticks, signal.SIGSTOP)
            stopped.add(ref)
    return policy.stop_rounds


def _unsignalled(tr: _Tracker, plan: Planner, t0: float) -> list[NamedProc]:
    """The members that left without the stop's signal (shut down by their parent), each
    with when it was seen gone, up to REPORT_NAMED: the timeline shows every member."""
    out = []
    for ref, seen_gone in tr.gone_at.items():
        if ref in plan.sent or ref in tr.found_dead:
            continue
        out.append(NamedProc(ref.pid, tr.cmd(ref), round(seen_gone - t0, 4)))
        if len(out) >= REPORT_NAMED:
            break
    return out


def _finish(report: StopReport, tr: _Tracker, plan: Planner, t0: float, emit: Emit) -> StopReport:
    left = tr.pending()
    report.found = len(tr.known)
    for m in tr.known.values():
        for net in m.nets:
            report.by_net[net] = report.by_net.get(net, 0) + 1
    report.escaped = sum(1 for m in tr.known.values() if m.escaped)
    report.launchers = [
        NamedProc(ref.pid, tr.cmd(ref), why=why) for ref, why in plan.launchers.items()
    ]
    report.unsignalled = _unsignalled(tr, plan, t0)
    for ref, at in list(plan.sent.items())[:REPORT_NAMED]:
        gone = tr.gone_at.get(ref)
        exit_s = None if gone is None else round(max(0.0, gone - at), 4)
        report.sent.append(
            NamedProc(ref.pid, tr.cmd(ref), round(at - t0, 4), exit_s, ref in tr.killed)
        )
    for ref in left:
        st = procfs.read_stat(ref.pid)
        uid = procfs.read_uid(ref.pid)
        foreign = uid is not None and uid != os.geteuid() and os.geteuid() != 0
        report.survivors.append(
            Survivor(
                ref.pid,
                st.state if st else "?",
                procfs.read_wchan(ref.pid),
                procfs.read_cmdline(ref.pid)[:200],
                f"not permitted to signal it: owned by uid {uid}" if foreign else None,
            )
        )
    for ref in tr.known:
        st = procfs.read_stat(ref.pid)
        if st is not None and st.start_ticks == ref.start_ticks and st.state == "Z":
            report.zombies.append(Zombie(ref.pid, st.ppid))
    report.ok = not left
    report.total_s = round(time.monotonic() - t0, 4)
    exits = [at for ref, at in tr.gone_at.items() if ref not in tr.found_dead]
    report.gone_s = round(max(exits) - t0, 4) if exits and not left else None
    if left:
        emit("survivors", survivors=[asdict(sv) for sv in report.survivors])
    emit("stop_report", **{k: v for k, v in report.to_doc().items() if k != "survivors"})
    return report
