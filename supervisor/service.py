"""The supervisor's main loop (anyio): exit watch, reaping, snapshots, control socket, stop.

One supervisor per job run. It is never in the job's data path (the job writes its log
itself), so killing it loses no log line; ``trainctl stop`` then works from state.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import itertools
import logging
import math
import os
import re
import signal
import socket
import threading
import time
import traceback
from pathlib import Path
from typing import Any, TextIO, cast

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream

from . import causes, control, handoff, hooks, ids, memory, procfs, steps, systemd
from . import lifecycle as lc
from .drift import drift, fingerprint
from .errors import GpuError, StateError, TrainctlError
from .gpu.verify import fresh_baselines
from .gpu.watch import GpuWatch
from .launch import Handover, launch_supervisor
from .logs import rotate_if_big
from .proctree import Member, Target, alive, scan, scan_light, target_of
from .reports import Cause, Failure
from .roster import Roster, widen_fd_table
from .spawn import Spawned, exit_code_of
from .spec import Spec, StopOrder
from .stacks import before_kill_writer, stacks_writer
from .state import (
    JobState,
    MemberSnap,
    Phase,
    ProcRef,
    error_file,
    log_path,
    mtime,
    open_events,
    open_in,
    progress_path,
    write_event_line,
    write_state,
)
from .stop import run_stop
from .terminate import Grace


def _configure_events(jdir: Path, name: str) -> structlog.typing.FilteringBoundLogger:
    events = _BestEffortFile(jdir / "events.jsonl")
    structlog.configure(
        processors=[
            structlog.processors.TimeStamper(fmt=None, key="ts"),
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.WriteLoggerFactory(file=cast(TextIO, events)),
        # per-orphan "reaped" lines are debug: 240 of them would slow a stop by ~15 ms
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        cache_logger_on_first_use=True,
    )
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger().bind(job=name)
    return log


# How often the supervisor walks every /proc entry (and environ) for members that left
# both the cgroup and the tree, e.g. a process moved out of the cgroup by root.
FULL_SCAN_S = 60.0
# While a stop runs, orphans are reaped in batches this often (see Supervisor._reaper).
REAP_BATCH_S = 0.01
# How often, at most, the checkpoint's age is looked at (on_checkpoint_stale).
STALE_CHECK_S = 30.0
# How often, at most, the newest step of a log-reported progress is sampled for the ETA.
STEP_SAMPLE_S = 15.0


def _newest_mtime(cwd: str, pattern: str) -> float | None:
    """The newest modification time among files matching ``pattern`` under ``cwd``."""
    best: float | None = None
    for path in glob.iglob(os.path.join(cwd, pattern), recursive=True):
        t = mtime(Path(path))
        if t and (best is None or t > best):
            best = t
    return best


class _BestEffortFile:
    """events.jsonl for structlog: a full or read-only disk loses event lines, never the job.

    Each line goes out through the same writer as the CLI's events (one write(2) on an
    O_APPEND descriptor). A failed write is counted and dropped; it never raises into the
    supervisor, which must keep reaping and answering stops (state.json's own write
    failures are reported).
    """

    def __init__(self, path: Path) -> None:
        self.failures = 0
        self.fd: int | None = None
        try:
            self.fd = open_events(path.parent)
        except (OSError, StateError):
            self.failures += 1

    def write(self, text: str) -> None:
        if self.fd is None:
            return
        try:
            write_event_line(self.fd, text)
        except OSError:
            self.failures += 1

    def flush(self) -> None:
        """Nothing is buffered: every line was written whole."""


class Supervisor:
    """Supervises one run of one job; one task owns its lifecycle (see lifecycle.py)."""

    def __init__(
        self,
        jdir: Path,
        spec: Spec,
        state: JobState,
        spawned: Spawned,
        cgroup: Path | None,
        listener: socket.socket,
        lock_fd: int,
    ) -> None:
        self.listener = listener
        self.jdir, self.spec, self.state, self.spawned, self.cgroup = (
            jdir,
            spec,
            state,
            spawned,
            cgroup,
        )
        self.log = _configure_events(jdir, spec.name)
        self.lock_fd = lock_fd
        self.life = lc.Life(restarts=state.restarts, run=state.run, history=state.restart_history)
        self.main_status: int | None = None
        self.main_reaped = anyio.Event()
        self.events_tx, self.events_rx = anyio.create_memory_object_stream[lc.Event](64)
        self.replies: dict[int, anyio.Event] = {}
        self.answers: dict[int, dict[str, Any]] = {}
        self.tokens = itertools.count(1)
        self.backoff_scope: anyio.CancelScope | None = None
        self.persist_error: str | None = None
        self.drift_mark: tuple[int, ...] = ()
        self.drift_at = 0.0
        self.grace = Grace(math.inf)  # the running stop's grace end; a later stop may shorten it
        self.handlers = 0  # control connections not yet answered
        self._sampled_at = 0.0  # progress samples for the ETA (see supervisor/steps.py)
        self._sampled_step: tuple[int, float] | None = None  # (run, step)
        self._roster: Roster | None = None  # cgroup mode: the run's members, held by pidfd
        self._stopping = False  # a stop sequence is running (see _reaper)
        self._reap_on_signal: anyio.CancelScope | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._gpu: GpuWatch | None = None  # the run's GPUs, looked at (see _watch_gpus)
        self._exe_checked: set[ProcRef] = set()  # members whose executable was read
        self._log_copy: _LogCopy | None = None  # an adopted run's own file, into its log
        try:  # the socket this supervisor serves; a different file there is not ours
            self._sock_ino: int | None = os.stat(jdir / control.SOCK_NAME).st_ino
        except OSError:
            self._sock_ino = None
        self._stale_checked = 0.0  # when the checkpoint's age was last looked at
        self._stale_fired = False  # on_checkpoint_stale fired; re-armed by a newer checkpoint

    # ------------------------------------------------------------ state

    def _set(self, phase: Phase, *, durable: bool = True, **changes: Any) -> None:
        """Record a phase move in memory, then on disk as far as the disk lets us.

        Never raises for a full or read-only disk: the job must still be reaped and
        stopped. The first failure is kept and surfaces in stop reports.
        """
        self.state = self.state.moved(phase, **changes)
        try:
            write_state(self.jdir, self.state, durable=durable)
        except OSError as e:
            if self.persist_error is None:
                self.persist_error = f"cannot write {self.jdir / 'state.json'}: {e.strerror}"
                self.log.warning("persist_failed", error=self.persist_error)

    def _target(self) -> Target:
        return target_of(self.state)

    def roster(self) -> Roster | None:
        """The current run's roster (cgroup mode only); a new run gets a new one."""
        t = self._target()
        if t.cgroup is None or t.main is None:
            return None
        r = self._roster
        if r is None or r.target.cgroup != t.cgroup or r.target.main != t.main:
            if r is not None:
                r.close()
            r = self._roster = Roster(t)
        return r

    # ------------------------------------------------------------ events in

    def _observe(
        self, *, add: tuple[tuple[str, tuple[str, ...], int], ...] = (), **put: object
    ) -> None:
        """A watcher's look, handed to the owner, which records it (lc.Observed)."""
        self.send(lc.Observed(tuple(put.items()), add))

    def send(self, ev: lc.Event) -> None:
        """Queue an event for the lifecycle owner (never blocks: the buffer is generous)."""
        with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
            self.events_tx.send_nowait(ev)

    async def _own_lifecycle(self, tg: anyio.abc.TaskGroup) -> None:
        """The one task that moves the lifecycle and writes the state: every decision
        and every record happens here, in order."""
        while not lc.ended(self.life):
            await self._step(tg)

    async def _step(self, tg: anyio.abc.TaskGroup) -> None:
        ev = await self.events_rx.receive()
        self.life = dataclasses.replace(self.life, now=time.time())
        self.life, actions = lc.step(self.life, ev, self.spec)
        for action in actions:
            self._do(tg, action)

    def _do(self, tg: anyio.abc.TaskGroup, a: lc.Action) -> None:
        if isinstance(a, lc.RunStop):
            tg.start_soon(self._run_stop, a)
        elif isinstance(a, lc.Persist | lc.Record):
            self._write(a)
        elif isinstance(a, lc.Log):
            self.log.info(a.event, **a.fields)
        elif isinstance(a, lc.WaitBackoff):
            self.backoff_scope = anyio.CancelScope()
            tg.start_soon(self._wait_backoff, a.seconds, self.backoff_scope)
        elif isinstance(a, lc.CancelBackoff):
            if self.backoff_scope is not None:
                self.backoff_scope.cancel()
        elif isinstance(a, lc.ShortenGrace):
            self.grace.shorten(a.seconds)
            self.log.info("grace_shortened", grace_left_s=round(self.grace.left_s(), 3))
        elif isinstance(a, lc.Relaunch):
            tg.start_soon(self._relaunch, a.failure)
        elif isinstance(a, lc.Reply):
            for token in a.tokens:
                self._answer(token, a)
        elif isinstance(a, lc.Hook):
            self._fire(a.event, a.cause, notify=a.notify)

    def _write(self, a: lc.Persist | lc.Record) -> None:
        """The owner's writes: a phase move, or what a watcher observed (phase unchanged,
        its lines appended to the state as it is now)."""
        if isinstance(a, lc.Persist):
            self._set(a.phase, durable=a.durable, **a.fields)
            return
        fields = dict(a.put)
        for name, lines, keep in a.add:
            fields[name] = (*getattr(self.state, name), *lines)[-keep:]
        self._set(self.state.phase, durable=a.durable, **fields)

    def _fire(self, event: str, cause: Cause, *, notify: bool = True) -> None:
        """Hand the event to a hook runner, if the job has a hook or a URL for it."""
        step = self._sampled_step[1] if self._sampled_step else None
        if step is None:  # a job that reports through $TRAINCTL_PROGRESS (trainer.report)
            reported = progress_path(self.jdir, self.state.run)
            step = steps.newest_reported(reported)
        if step is not None and step == int(step):
            step = int(step)
        progress = None if step is None else {"step": step, "total": self.spec.watch.total_steps}
        try:
            error = hooks.fire(
                event, self.spec, self.jdir, self.state, cause, progress, notify=notify
            )
        except Exception as e:  # noqa: BLE001  (a hook must never cost the job its supervisor)
            error = f"cannot start the {event} hook: {type(e).__name__}: {e}"
        if error:
            self.log.warning("hook_failed", hook_event=event, error=error)

    def _answer(self, token: int, a: lc.Reply) -> None:
        if a.forward:
            msg = control.StopReply(
                retry=True, error="the job was just relaunched; ask its new supervisor"
            )
        else:
            report = a.report or lc.NOTHING_TO_STOP
            if self.persist_error:
                report = dataclasses.replace(report, persist_error=self.persist_error)
            msg = control.StopReply(
                ok=True,
                report=report,
                exit_code=self.state.exit_code,
                joined=token in self.life.joined,
            )
        self.answers[token] = msg.to_doc()
        done = self.replies.get(token)
        if done is not None:
            done.set()

    # ------------------------------------------------------------ reaping

    def reap(self) -> None:
        """Reap every exited child: main (recording its status) and adopted orphans."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.spawned.pid and self.spawned.proc is not None:
                self.main_status = status
                # We reaped it ourselves; tell Popen so it never waits or warns.
                self.spawned.proc.returncode = exit_code_of(status)
                self.main_reaped.set()
                self.log.info("main_exited", pid=pid, exit_code=exit_code_of(status))
                self.send(lc.MainExited(exit_code_of(status)))
            else:
                self.log.debug("reaped", pid=pid, exit_code=exit_code_of(status))

    async def _reaper(self) -> None:
        """Reap on SIGCHLD; while a stop runs, in batches on a short timer instead.

        A stop ends hundreds of processes within milliseconds, and the orphans among them
        are ours to reap. One SIGCHLD wakeup each cost this loop 12-17 ms of CPU in a
        30 ms stop of a 241-process tree, CPU the exiting tree needed on a 2-core host. So
        during a stop the handler is removed (SIGCHLD's default action queues nothing
        and leaves the zombies for waitpid) and the zombies are reaped every
        REAP_BATCH_S. Main's own exit is still seen at once, on its pidfd (_watch_main).
        """
        while True:
            with anyio.CancelScope() as self._reap_on_signal:
                with anyio.open_signal_receiver(signal.SIGCHLD) as signals:
                    self.reap()  # children that exited before the handler was installed
                    async for _ in signals:
                        self.reap()
            while self._stopping:
                self.reap()
                await anyio.sleep(REAP_BATCH_S)

    async def _watch_main(self) -> None:
        fd = self.spawned.pidfd
        try:
            await anyio.wait_readable(fd)  # readable = exited; no polling delay
        finally:
            os.close(fd)
        self.reap()
        if self.spawned.proc is None and not self.main_reaped.is_set():
            # Adopted: main is not our child, so its exit code is not ours to read.
            self.main_reaped.set()
            self.log.info("main_exited", pid=self.spawned.pid, exit_code=None, adopted=True)
            self.send(lc.MainExited(None))

    async def _signals(self) -> None:
        """SIGTERM and SIGINT stop the job gracefully; SIGHUP is ignored; SIGUSR1 rebinds.

        An admin's `kill <supervisor>` or a container runtime's stop means "stop this":
        the supervisor runs the job's own stop sequence (top-down, with its grace), as
        systemd, supervisord and docker do with their children, records it, and exits;
        the job is never left unsupervised. A later SIGTERM joins the running stop. A
        closing terminal (SIGHUP) changes nothing. SIGUSR1 binds the control socket again
        (the CLI sends it when the socket file was deleted), as tmux does.
        """
        sigs = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1, signal.SIGURG)
        with anyio.open_signal_receiver(*sigs) as signals:
            async for sig in signals:
                name = signal.Signals(sig).name
                if sig == signal.SIGUSR1:
                    self._rebind(why="SIGUSR1")
                elif sig == signal.SIGURG:
                    await self._scope_stopping()
                elif sig == signal.SIGHUP:
                    self.log.warning("supervisor_signal_ignored", signal=name)
                else:
                    self.log.warning("supervisor_signal_stops_job", signal=name)
                    self.send(lc.StopRequested(next(self.tokens), None, verb=name))

    async def _scope_stopping(self) -> None:
        """SIGURG is what systemd sends when it stops this run's scope (systemd.STOP_SIGNAL):
        a host shutdown or `systemctl stop`. The job then gets its own graceful stop, inside
        the scope's TimeoutStopSec. A SIGURG while the scope is plainly active (socket
        out-of-band data, a stray kill) changes nothing."""
        unit = self.state.unit
        if unit is None:
            self.log.info("supervisor_signal_ignored", signal="SIGURG", why="no systemd scope")
            return
        active = await anyio.to_thread.run_sync(systemd.unit_active_state, unit)
        if active == "active":
            self.log.info("supervisor_signal_ignored", signal="SIGURG", unit_state=active)
            return
        self.log.warning("scope_stopping", unit=unit, unit_state=active)
        self.send(lc.StopRequested(next(self.tokens), None, verb="shutdown"))

    def _rebind(self, why: str) -> None:
        """Bind control.sock again if it is gone (a tmp cleaner, a careless rm)."""
        if self.life.stage not in (lc.Stage.RUNNING, lc.Stage.STOPPING, lc.Stage.BACKOFF):
            return  # a successor binds it (or the run is over)
        path = self.jdir / control.SOCK_NAME
        try:
            if os.stat(path).st_ino == self._sock_ino:
                return
        except FileNotFoundError:
            pass
        except OSError:
            return
        try:
            sock = control.bind(self.jdir)
            self._sock_ino = os.stat(path).st_ino
        except (OSError, StateError) as e:
            self.log.warning("control_socket_rebind_failed", error=str(e), why=why)
            return
        self.log.warning("control_socket_rebound", why=why)
        if self._tg is not None:
            self._tg.start_soon(self._serve_socket, sock)

    # ------------------------------------------------------------ snapshots

    async def _snapshots(self) -> None:
        """Keep state.json's member snapshot current, at a cost that follows the job's size.

        Each tick reads the job's own processes only (cgroup.procs, or the tree below us:
        see proctree.scan_light); the full scan of every /proc entry and environ, which
        costs as much as the host has processes, runs every FULL_SCAN_S as a safety net.
        """
        last_full = time.monotonic()
        # The first ticks come early (0.25, 0.5, 1 s, … up to the interval): a helper
        # that escapes at start-up (setsid, double fork, scrubbed environment) is on
        # record within a moment, so a supervisor that dies soon after does not take
        # the only knowledge of it along.
        pause = min(EARLY_SNAPSHOT_S, self.spec.watch.snapshot_interval_s)
        while True:
            await anyio.sleep(pause)
            pause = min(pause * 2, self.spec.watch.snapshot_interval_s)
            self.reap()
            self._rebind(why="the socket file was gone")
            if self._check_stall():
                await self._write_stall_stacks()
            self._sample_steps()
            self._bound_log()
            if self.life.stage is not lc.Stage.RUNNING:
                continue
            self._watch_oom()
            await self._watch_checkpoint_age()
            await self._check_drift()
            full = time.monotonic() - last_full >= FULL_SCAN_S
            if full:
                last_full = time.monotonic()
            roster = self.roster()
            light = (
                roster.refresh
                if roster is not None
                else functools.partial(scan_light, self._target())
            )
            if full:
                if roster is not None:  # kept current for a stop, whichever scan runs
                    await anyio.to_thread.run_sync(roster.refresh)
                members = await anyio.to_thread.run_sync(scan, self._target())
            else:
                members = await anyio.to_thread.run_sync(light)
                self._keep_known(members)
            live = {pid: m for pid, m in members.items() if m.alive}
            await self._look_for_handoffs(live)
            # Rewrite (and fsync) only when the member set changed: a quiet job costs
            # nothing, not even a read of each member's command line.
            if {m.ref for m in live.values()} != {
                ProcRef(s.pid, s.start_ticks) for s in self.state.members
            } and self.life.stage is lc.Stage.RUNNING:
                snap = tuple(
                    MemberSnap.of(m.stat, tuple(sorted(m.nets))) for _, m in sorted(live.items())
                )
                self._observe(members=snap, snapshot_at=time.time())

    async def _look_for_handoffs(self, live: dict[int, Member]) -> None:
        """Record a member that is a tmux client of a server outside the job.

        Each member's executable is read once, when it is first seen (one readlink); the
        sockets are looked at only when a member runs tmux.
        """
        refs = {m.ref for m in live.values()}
        new = refs - self._exe_checked
        self._exe_checked = refs
        if not any(handoff.is_tmux(r.pid) for r in new):
            return
        found = await anyio.to_thread.run_sync(handoff.find_handoffs, set(live))
        lines = [h.line() for h in found if h.line() not in self.state.handed_off]
        if lines:
            for line in lines:
                self.log.warning("handed_off", what=line)
            self._observe(add=(("handed_off", tuple(lines), 10),))

    async def _check_drift(self) -> None:
        """Recompute the code drift when git or the entry script changed, else once a minute.

        `status` then reads the result from state.json instead of running `git diff` on
        every call, so its cost does not grow with the repository.
        """
        if not self.state.code:
            return
        now = time.monotonic()
        mark = await anyio.to_thread.run_sync(fingerprint, self.spec)
        if mark == self.drift_mark and now - self.drift_at < FULL_SCAN_S:
            return
        self.drift_mark, self.drift_at = mark, now
        changes = tuple(await anyio.to_thread.run_sync(drift, self.state.code, self.spec))
        if changes != self.state.code_drift or self.state.drift_checked_at is None:
            self._observe(code_drift=changes, drift_checked_at=time.time())

    def _keep_known(self, members: dict[int, Member]) -> None:
        """Between full scans, keep the snapshot's members that still live (same start time).

        The light scan cannot see a member that left both the cgroup and our tree (only
        the marker finds it); it must not drop out of the snapshot until the next full scan.
        """
        for snap in self.state.members:
            if snap.pid in members:
                continue
            st = procfs.read_stat(snap.pid)
            if st is not None and st.start_ticks == snap.start_ticks and st.state != "Z":
                members[snap.pid] = Member(st, set(snap.nets))

    # ------------------------------------------------------------ GPUs

    async def _watch_gpus(self) -> None:
        """Look at the run's GPUs for its whole life: memory, Xid events, ECC errors.

        NVML is opened once, in a thread, after the run started: never on the stop path.
        The Xid wait blocks in the driver, in a daemon thread of its own (an anyio worker
        would hold up the supervisor's exit until its wait returns); memory and ECC are
        read every ``GPU_SAMPLE_S``. At rest that is one wake-up a minute.
        """
        if not self.state.gpus:
            return
        try:
            self._gpu = await anyio.to_thread.run_sync(GpuWatch.open, self.state.gpus)
        except GpuError as e:
            self.log.warning("gpu_watch_unavailable", error=str(e))
            return
        watch = self._gpu
        info = watch.backend.driver()
        self.log.info(
            "gpu_watch",
            gpus=[g.label for g in self.state.gpus],
            xid_events=watch.xids is not None,
            driver=info.driver_version,
        )
        if watch.xids is not None:
            token = anyio.lowlevel.current_token()
            threading.Thread(
                target=self._wait_xids, args=(watch, token), name="xid-watch", daemon=True
            ).start()
        while True:
            await anyio.sleep(GPU_SAMPLE_S)
            try:
                faults = await anyio.to_thread.run_sync(watch.sample, abandon_on_cancel=True)
            except GpuError as e:
                self.log.warning("gpu_watch_failed", error=str(e))
                continue
            for fault in faults:
                self._gpu_fault(fault)

    def _wait_xids(self, watch: GpuWatch, token: anyio.lowlevel.EventLoopToken) -> None:
        """The Xid wait (a daemon thread): each fault is handed to the event loop."""
        while True:
            try:
                faults = watch.wait_xid(XID_WAIT_S)
            except GpuError as e:
                faults = [f"the Xid watch stopped: {e}"]
                watch.xids = None
            for fault in faults:
                try:
                    anyio.from_thread.run_sync(self._gpu_fault, fault, token=token)
                except RuntimeError:  # the loop has ended: the supervisor is exiting
                    return
            if watch.xids is None:
                return

    def _gpu_fault(self, fault: str) -> None:
        """Record a GPU fault of the run (events, state; the cause if the run dies of it)."""
        self.log.warning("gpu_fault", fault=fault)
        self._observe(add=(("gpu_faults", (fault,), 20),))

    # ------------------------------------------------------------ stop

    async def _run_stop(self, a: lc.RunStop) -> None:
        """Run the stop sequence in a thread (shielded), then report it to the owner."""
        run = functools.partial(
            run_stop,
            self._target(),
            self.spec,
            grace_s=a.grace_s,
            reason=a.reason,
            order=StopOrder(a.order) if a.order else None,
            leases=self.state.gpus,
            gpu_timeout_s=a.gpu_timeout_s,
            emit=self.log.info,
            grace=self.grace,
            roster=self.roster(),
            before_kill=before_kill_writer(self.jdir, self.state.run, self.state.marker),
            gpu_memory=lambda: dict(self._gpu.memory) if self._gpu else {},
            gpu_backend=self._gpu.backend if self._gpu else None,
        )
        with anyio.CancelScope(shield=True):
            self._stopping = True
            if self._reap_on_signal is not None:
                self._reap_on_signal.cancel()
            try:
                report = await anyio.to_thread.run_sync(run)
            finally:
                self._stopping = False
            # main's exit status comes through the reaper; let it land before deciding
            with anyio.move_on_after(2):
                await self.main_reaped.wait()
            cause = None
            if a.reason == "main exited" and not self.life.user_stop:
                cause = await anyio.to_thread.run_sync(self._analyse_safely)
            with contextlib.suppress(OSError):  # a nicety: the stop's report must still land
                self._watch_oom()  # the last kills, recorded before the group goes
                memory.remove(self._memory_group(), self._target().cgroup)
            await anyio.to_thread.run_sync(self._copy_rest_of_log)
        self.send(lc.StopFinished(report, cause))

    def _memory_group(self) -> Path | None:
        group = self.state.memory_cgroup
        return Path(group) if group and memory.is_ours(Path(group)) else None

    def _analyse_safely(self) -> Cause | None:
        """The analysis, or None (the plain exit-code cause) if it breaks: a log or error
        file the job wrote must never cost the run its stop report or the supervisor."""
        try:
            return self._analyse()
        except Exception as e:  # noqa: BLE001  (logged; the lifecycle falls back)
            self.log.warning("cause_analysis_failed", error=f"{type(e).__name__}: {e}")
            return None

    def _analyse(self) -> Cause:
        """Why main ended on its own: its exit, a signal, the OOM killer; the job's reason."""
        st, status = self.state, self.main_status
        code = self.life.main_code
        died_of = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None
        reason = causes.Reason()
        if code != 0 or died_of is not None:
            ef = self.spec.env.get("TORCHELASTIC_ERROR_FILE")
            reason = causes.job_reason(
                log_path(self.jdir, st.run),
                Path(ef) if ef else error_file(self.jdir, st.run),
                st.started_at,
                self.spec.causes,
            )
        cause = causes.ended_on_its_own(code, died_of, reason, self._oom_of(died_of))
        if (code != 0 or died_of is not None) and st.gpu_faults:
            # a GPU that failed during the run is why it died, before the job's own words
            fault = st.gpu_faults[-1]
            cause = dataclasses.replace(cause, gpu=fault, summary=f"{fault}, then {cause.summary}")
        return cause

    def _oom_of(self, died_of: int | None) -> tuple[int, str | None, int, int | None] | None:
        """(pid, cmd, kills, cap) when the OOM killer took a process of the job."""
        group = self._memory_group()
        kills = memory.oom_kills(group) if group is not None else 0
        if not kills and died_of != signal.SIGKILL:
            return None
        st = self.state
        cmds = {m.pid: m.cmd for m in st.members}
        main = st.main.pid if st.main else 0
        victims = self._oom_victims()
        if not kills and not victims:
            return None  # a SIGKILL from someone else, not the OOM killer
        pick = next((v for v in victims if v.pid == main), victims[0] if victims else None)
        if pick is None and died_of == signal.SIGKILL:
            pick = memory.Victim(main, "")
        cap = self.spec.memory.max_bytes
        if pick is None:
            return (0, None, kills, cap)
        cmd = cmds.get(pick.pid)
        if not cmd and pick.pid == main:
            cmd = " ".join(self.spec.argv)
        cmd = (cmd or pick.comm)[:200] or None
        return (pick.pid, cmd, kills or len(victims), cap)

    async def _wait_backoff(self, seconds: float, scope: anyio.CancelScope) -> None:
        with scope:
            await anyio.sleep(seconds)
            self.send(lc.BackoffElapsed())

    # ------------------------------------------------------------ restart policy

    async def _relaunch(self, failure: Failure) -> None:
        st = self.state
        failure = dataclasses.replace(failure, at=time.time())
        leases = tuple(await anyio.to_thread.run_sync(fresh_baselines, st.gpus))
        handover = Handover(
            run=st.run + 1,
            marker=ids.new_marker(),
            gpus=leases,
            restarts=st.restarts + 1,
            last_failure=failure,
            restart_history=self.life.history,
        )
        self.listener.close()  # the new supervisor binds the socket path itself
        home = self.jdir.parent.parent
        try:
            reply = await anyio.to_thread.run_sync(
                functools.partial(
                    launch_supervisor, home, self.jdir, self.spec, handover, 30.0, self.lock_fd
                )
            )
        except TrainctlError as e:
            self.send(lc.Relaunched(error=str(e)))
            return
        self.log.info(
            "relaunched",
            run=handover.run,
            main_pid=reply.main_pid,
            restarts=handover.restarts,
        )
        self.send(lc.Relaunched())

    def _bound_log(self) -> None:
        log = log_path(self.jdir, self.state.run)
        try:
            size = rotate_if_big(log, self.spec.logs.max_bytes, self.spec.logs.keep)
        except OSError as e:
            self.log.warning("log_rotation_failed", error=e.strerror)
            return
        if size:
            self.log.info("log_rotated", bytes=size, keep=self.spec.logs.keep)

    # ------------------------------------------------------------ stall watchdog

    def _check_stall(self) -> bool:
        """Mark or clear STALLED; True the moment a stall is first seen."""
        timeout = self.spec.watch.stall_timeout_s
        if not timeout or self.life.stage is not lc.Stage.RUNNING:
            return False
        st = self.state
        progress = progress_path(self.jdir, st.run)
        last = max([st.started_at, *(mtime(p) for p in (log_path(self.jdir, st.run), progress))])
        idle = time.time() - last
        if idle < timeout:
            if st.stalled_since is not None:
                self._observe(stalled_since=None)
                self.log.info("unstalled")
            return False
        first = st.stalled_since is None
        if first:
            self._observe(stalled_since=last)
            self.log.warning("stalled", idle_s=round(idle, 1), on_stall=self.spec.watch.on_stall)
            idle_line = f"no progress and no output for {idle:.0f} s"
            self._fire("stall", Cause(kind="stalled", summary=idle_line))
        if self.spec.watch.on_stall == "restart":
            self.send(lc.Stalled())
        return first

    async def _write_stall_stacks(self) -> None:
        """Where every process of the stalled run stands, read once, off the event loop."""
        refs = [m.ref for m in alive(scan_light(self._target())).values()]
        write = stacks_writer(self.jdir, self.state.run, "stall", self.state.marker)
        path = await anyio.to_thread.run_sync(write, refs)
        if path:
            self.log.warning("stacks_written", path=path, why="stalled", processes=len(refs))

    def _watch_oom(self) -> None:
        """Name each OOM kill in the job's memory group as it happens (one small read)."""
        group = self._memory_group()
        if group is None:
            return
        kills = memory.oom_kills(group)
        if kills <= self.state.oom_kills:
            return
        cmds = {m.pid: m.cmd for m in self.state.members}
        self.log.warning(
            "oom_kill",
            oom_kills=kills,
            victims=[{"pid": v.pid, "cmd": cmds.get(v.pid) or v.comm} for v in self._oom_victims()],
            cap_bytes=self.spec.memory.max_bytes,
        )
        self._observe(oom_kills=kills)

    def _oom_victims(self) -> list[memory.Victim]:
        """The kernel log's OOM kills of this run: its members' pids, or its group's name."""
        st = self.state
        pids = {m.pid for m in st.members} | ({st.main.pid} if st.main else set())
        return memory.oom_victims(pids, Path(st.cgroup).name if st.cgroup else None)

    async def _watch_checkpoint_age(self) -> None:
        """Fire on_checkpoint_stale once the newest checkpoint is older than allowed.

        Looked at every STALE_CHECK_S at most (a glob may walk a big folder; more often
        for a short limit), off the loop;
        fired once, and armed again when a newer checkpoint appears.
        """
        limit = self.spec.hooks.checkpoint_stale_s
        pattern = self.spec.watch.checkpoint
        now = time.time()
        if (
            limit is None
            or not pattern
            or now - self._stale_checked < min(STALE_CHECK_S, limit / 4)
        ):
            return
        self._stale_checked = now
        newest = await anyio.to_thread.run_sync(_newest_mtime, self.spec.cwd, pattern)
        age = now - max(newest or 0.0, self.state.started_at)
        if age < limit:
            self._stale_fired = False
            return
        if self._stale_fired:
            return
        self._stale_fired = True
        what = "no checkpoint yet" if newest is None else "the newest checkpoint"
        summary = f"{what}: {age:.0f} s since {'start' if newest is None else 'it was written'}"
        self.log.warning("checkpoint_stale", age_s=round(age, 1), limit_s=limit)
        self._fire("checkpoint_stale", Cause(kind="checkpoint_stale", summary=summary))

    def _sample_steps(self) -> None:
        """Record (time, newest step) now and then, for an ETA over a recent window."""
        regex = self.spec.watch.progress_regex
        if not regex or self.life.stage is not lc.Stage.RUNNING:
            return
        now = time.time()
        every = self.spec.watch.snapshot_interval_s
        if now - self._sampled_at < max(min(STEP_SAMPLE_S, 5 * every), every):
            return
        log = log_path(self.jdir, self.state.run)
        written = mtime(log)
        if written <= self._sampled_at:
            return  # nothing new since the last sample
        self._sampled_at = now
        step = steps.newest_step(log, re.compile(regex))
        if step is not None and (self.state.run, step) != self._sampled_step:
            self._sampled_step = (self.state.run, step)
            with contextlib.suppress(OSError, TrainctlError):  # a full disk costs the ETA only
                steps.append_sample(log, written, step)

    # ------------------------------------------------------------ control socket

    async def _serve(self) -> None:
        await self._serve_socket(self.listener)

    async def _serve_socket(self, sock: socket.socket) -> None:
        listener = await anyio.abc.SocketListener.from_socket(sock)
        async with listener:
            await listener.serve(self._handle)

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        self.handlers += 1
        try:
            await self._handle_one(stream)
        finally:
            self.handlers -= 1

    async def _handle_one(self, stream: anyio.abc.SocketStream) -> None:
        with contextlib.suppress(
            anyio.EndOfStream,
            anyio.IncompleteRead,
            anyio.BrokenResourceError,
            anyio.DelimiterNotFound,
            ValueError,
        ):
            async with stream:
                raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)  # noqa: S610
                if control.peer_uid(raw) != os.geteuid():
                    await stream.send(control.encode({"ok": False, "error": "permission denied"}))
                    return
                line = await BufferedByteReceiveStream(stream).receive_until(
                    b"\n", control.MAX_LINE
                )
                reply = await self._dispatch(control.decode(line))
                await stream.send(control.encode(reply))

    async def _dispatch(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "phase": str(self.state.phase)}
        if op == "stop":
            try:
                ask = control.StopAsk.from_doc(req)
            except StateError as e:
                return control.StopReply(error=str(e)).to_doc()
            token = next(self.tokens)
            done = self.replies[token] = anyio.Event()
            order = ask.order if ask.order in tuple(StopOrder) else None
            self.send(lc.StopRequested(token, ask.grace_s, order, ask.gpu_timeout_s, ask.verb))
            await done.wait()
            del self.replies[token]
            return self.answers.pop(token)
        return {"ok": False, "error": f"unknown op {op!r}"}

    async def _copy_log(self, source: Path) -> None:
        """An adopted run writes to its own file (nohup.out, a redirect): copy what it
        writes from adoption on into the run's log, where `logs`, progress and the stall
        watchdog read it. The first line says where the earlier output is."""
        note = f"==> trainctl: adopted; the output before this is in {source} <==\n"
        copy = self._log_copy = _LogCopy(source, log_path(self.jdir, self.state.run))
        await anyio.to_thread.run_sync(copy.step, note.encode())
        while True:
            await anyio.sleep(LOG_COPY_S)
            await anyio.to_thread.run_sync(copy.step, b"")

    def _copy_rest_of_log(self) -> None:
        """The run ended: copy what its own file gained since the last copy, before the end
        is recorded (`wait` then `logs` must show the lines written just before exit)."""
        if self._log_copy is not None:
            self._log_copy.drain()

    # ------------------------------------------------------------ main

    async def run(self) -> None:
        """Supervise until the run has ended and every waiting client has its answer."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._reaper)
            tg.start_soon(self._watch_main)
            tg.start_soon(self._signals)
            tg.start_soon(self._snapshots)
            tg.start_soon(self._serve)
            tg.start_soon(self._watch_gpus)
            source = self.state.adopted.log_source if self.state.adopted else None
            if source is not None:
                tg.start_soon(self._copy_log, Path(source))
            if self.state.restarts == 0 and self.state.adopted is None:
                self._fire("start", self._started(), notify=False)
            await self._own_lifecycle(tg)
            if self.life.stage is not lc.Stage.HANDED_OVER:
                with contextlib.suppress(FileNotFoundError):
                    (self.jdir / control.SOCK_NAME).unlink()
            # clients still connected get their answer (late stops: the final report)
            # ... by the same owner: the ended machine answers a stop with the final report
            with anyio.move_on_after(5):
                while self.handlers:
                    with anyio.move_on_after(0.05):
                        await self._step(tg)
            tg.cancel_scope.cancel()

    def _started(self) -> Cause:
        main = self.state.main.pid if self.state.main else None
        gpus = ",".join(str(g.index) for g in self.state.gpus)
        on = f" on GPU(s) {gpus}" if gpus else ""
        return Cause(kind="start", summary=f"run {self.state.run} started{on}, main pid {main}")


EARLY_SNAPSHOT_S = 0.25  # the first member snapshot after a start (then doubling)
XID_WAIT_S = 60.0  # one Xid wait in the driver (a daemon thread: exit does not wait)
GPU_SAMPLE_S = 30.0  # how often the leased GPUs' memory and ECC counts are read
LOG_COPY_S = 0.5  # how often an adopted run's own output file is copied into its log


class _LogCopy:
    """What an adopted run's own file gained, appended to the run's log: one position,
    under a lock, shared by the periodic copy and the last one at the run's end (two
    copies from one position would write the same lines twice)."""

    def __init__(self, source: Path, log: Path) -> None:
        self.source, self.log = source, log
        self.pos: int | None = None  # None: not started (the first copy starts at the end)
        self.lock = threading.Lock()

    def step(self, head: bytes) -> None:
        """Copy what is new (``head`` first)."""
        with self.lock:
            self.pos = _copy_new(self.source, self.log, self.pos, head)

    def drain(self) -> None:
        """Copy until nothing is new (4 MiB a round: what a dying job can still write)."""
        with self.lock:
            if self.pos is None:
                return  # the copy never started: the adoption's own note comes first
            for _ in range(64):
                new = _copy_new(self.source, self.log, self.pos, b"")
                if new == self.pos:
                    return
                self.pos = new


def _copy_new(source: Path, log: Path, pos: int | None, head: bytes) -> int:
    """Append what ``source`` gained past ``pos`` (None: its end now) to ``log``; return
    the new position. Never raises: a vanished or unreadable file costs the copy only."""
    try:
        size = source.stat().st_size
        if pos is None or size < pos:  # the start, or truncated (copytruncate): anew
            pos = size if pos is None else 0
        data = b""
        if size > pos:
            with open(source, "rb") as f:
                f.seek(pos)
                data = f.read(min(size - pos, 1 << 22))
        if head or data:
            fd = open_in(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                os.write(fd, head + data)
            finally:
                os.close(fd)
        return pos + len(data)
    except (OSError, StateError):
        return pos or 0


def run_supervisor(
    jdir: Path,
    spec: Spec,
    state: JobState,
    spawned: Spawned,
    cgroup: Path | None,
    listener: socket.socket,
    lock_fd: int,
) -> int:
    """Run the supervisor to completion; log (not show) any crash. Does not return."""
    widen_fd_table()  # while still single-threaded: see roster.widen_fd_table
    sup = Supervisor(jdir, spec, state, spawned, cgroup, listener, lock_fd)
    code = 0
    try:
        anyio.run(sup.run)
    except Exception:  # noqa: BLE001  (last resort: record why, the job itself is unharmed)
        sup.log.error("supervisor_crashed", traceback=traceback.format_exc())  # noqa: TRY400
        code = 70
    sup.log.info(
        "supervisor_exit",
        phase=str(sup.state.phase),
        handed_over=sup.life.stage is lc.Stage.HANDED_OVER,
    )
    # Everything is on disk (state fsynced, events line-buffered). Exiting right here keeps
    # the lock until the process is really gone, and skips an interpreter teardown that
    # `trainctl stop` would otherwise sit through waiting for supervisor.lock.
    del lock_fd
    os._exit(code)
