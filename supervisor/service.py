"""The supervisor's lifecycle owner and its concurrency: one task steps the lifecycle and
writes the state; the reaper, the signal handler, the stop thread and the relaunch run
beside it, and the control server and the watchers below it (core.py, server.py,
watchers.py).

One supervisor per job run. It is never in the job's data path (the job writes its log
itself), so killing it loses no log line; ``trainctl stop`` then works from state.json.
The one exception is asked for: a ``--tty`` run's terminal is held here (terminal.py).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import os
import signal
import socket
import time
import traceback
from pathlib import Path

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel

from trainctl.supervisor.gpu.verify import fresh_baselines
from trainctl.supervisor.model.reports import STARTED_OVER, Cause, Failure, StopReport
from trainctl.supervisor.model.spec import Spec, StopOrder
from trainctl.supervisor.model.state import (
    RESUME_VAR,
    JobState,
    error_file,
    log_path,
)
from trainctl.supervisor.records import JsonObject, replace
from trainctl.supervisor.tree.launch import Handover, launch_supervisor
from trainctl.supervisor.tree.roster import widen_fd_table
from trainctl.supervisor.tree.spawn import Spawned
from trainctl.supervisor.tree.stacks import before_kill_writer
from trainctl.supervisor.tree.stop import run_stop
from trainctl.supervisor.tree.terminal import Terminal, log_appender
from trainctl.supervisor.tree.terminate import Grace

from . import ids
from .core import RunCore
from .diag import open_diag
from .errors import TrainctlError
from .life import causes
from .life import lifecycle as lc
from .life.judge import DeployJudge, release_held
from .linux import memory, systemd
from .logcopy import LOG_COPY_S, LogCopy
from .model import checkpoints, control, deploys, events
from .model.deploys import DeployReport
from .nextrun import NextRun
from .server import ControlServer
from .watchers import Watchers

# While a stop runs, orphans are reaped in batches this often (see Supervisor._reaper).
REAP_BATCH_S = 0.01
GUARD_HELD_S = 0.1  # a rollback run's look for its guard's verdict (see _release_rollback)
HELD_MAX_S = 600.0  # ... and the longest it holds its deploy's report for that verdict


class Owner:
    """The lifecycle owner: the one task that moves the run's life (lifecycle.py) and the
    only code that writes its state, and the concurrency beside it (the reaper, the
    signal handler, the stop thread, the relaunch). It holds the run's record and the
    other parts; none of them holds it."""

    def __init__(self, core: RunCore, server: ControlServer, watchers: Watchers) -> None:
        self.core, self.server, self.watchers = core, server, watchers
        self.grace = Grace(math.inf)  # the running stop's grace end; a later stop may shorten it
        self.backoff_scope: anyio.CancelScope | None = None
        self._stopping = False  # a stop sequence is running (see _reaper)
        self._reap_on_signal: anyio.CancelScope | None = None
        self._log_copy: LogCopy | None = None  # an adopted run's own file, into its log
        self._terminal: Terminal | None = None  # `--tty`: main's pty (see run)
        self.judge = DeployJudge(core.jdir, core.spec.cwd, self.fire)
        self.next = NextRun(core, self.judge)  # what the next run is handed
        self._held_back: DeployReport | None = None  # a rollback run: its deploy's report

    def fire(self, event: str, cause: Cause, *, notify: bool = True) -> None:
        """A hook, with the newest step the watchers sampled."""
        self.core.fire(event, cause, notify=notify, step=self.watchers.last_step())

    async def _own_lifecycle(self, tg: anyio.abc.TaskGroup) -> None:
        """The one task that moves the lifecycle and writes the state: every decision
        and every record happens here, in order."""
        while not lc.ended(self.core.life):
            await self._step(tg)

    async def _step(self, tg: anyio.abc.TaskGroup) -> None:
        ev = await self.core.events_rx.receive()
        self.core.life = replace(self.core.life, now=time.time())
        self.core.life, actions = lc.step(self.core.life, ev, self.core.spec)
        for action in actions:
            self._do(tg, action)

    def _do(self, tg: anyio.abc.TaskGroup, a: lc.Action) -> None:
        if isinstance(a, lc.RunStop):
            tg.start_soon(self._run_stop, a)
        elif isinstance(a, lc.Persist | lc.Record):
            self._write(a)
        elif isinstance(a, lc.Log):
            self.core.log.info(a.event, **a.fields)
        elif isinstance(a, lc.WaitBackoff):
            self.backoff_scope = anyio.CancelScope()
            tg.start_soon(self._wait_backoff, a.seconds, self.backoff_scope)
        elif isinstance(a, lc.CancelBackoff):
            if self.backoff_scope is not None:
                self.backoff_scope.cancel()
        elif isinstance(a, lc.ShortenGrace):
            self.grace.shorten(a.seconds)
            self.core.log.info(events.GraceShortened(round(self.grace.left_s(), 3)))
        elif isinstance(a, lc.Relaunch):
            tg.start_soon(self._relaunch, a.failure, a.rollback)
        elif isinstance(a, lc.Reply):
            for token in a.tokens:
                self._answer(token, a)
        elif isinstance(a, lc.Hook | lc.Judge):
            self._tell(a)

    def _tell(self, a: lc.Hook | lc.Judge) -> None:
        """A hook; or a deploy's verdict, written (life/judge.py), and the run's trial
        record moved on."""
        if isinstance(a, lc.Hook):
            self.fire(a.event, a.cause, notify=a.notify)
            return
        t = self.core.state.trial
        if t is None:
            return
        try:
            now = self.judge.judged(a, t)
        except (OSError, TrainctlError) as e:  # a verdict's files must not cost the run
            self.core.log.warning("deploy_verdict_unwritten", error=str(e), outcome=a.outcome)
            now = None if a.outcome in ("passed", "ended", "failed") else t
        if now != t:
            self._write(lc.Record(put=(("trial", now),)))

    def _write(self, a: lc.Persist | lc.Record) -> None:
        """The owner's writes: a phase move, or what a watcher observed (phase unchanged,
        its lines appended to the state as it is now)."""
        if isinstance(a, lc.Persist):
            self.core.set_state(a.phase, durable=a.durable, **a.fields)
            return
        fields = dict(a.put)
        for name, lines, keep in a.add:
            fields[name] = (*getattr(self.core.state, name), *lines)[-keep:]
        self.core.set_state(self.core.state.phase, durable=a.durable, **fields)

    def _answer(self, token: int, a: lc.Reply) -> None:
        if a.forward:
            msg = control.StopReply(
                retry=True, error="the job was just relaunched; ask its new supervisor"
            )
        else:
            report = a.report or lc.NOTHING_TO_STOP
            if self.core.persist_error:
                report = replace(report, persist_error=self.core.persist_error)
            msg = control.StopReply(
                ok=True,
                report=report,
                exit_code=self.core.state.exit_code,
                joined=token in self.core.life.joined,
            )
        self.core.answers[token] = msg.to_doc()
        done = self.core.replies.get(token)
        if done is not None:
            done.set()

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
                    self.core.reap()  # children that exited before the handler was installed
                    async for _ in signals:
                        self.core.reap()
            while self._stopping:
                self.core.reap()
                await anyio.sleep(REAP_BATCH_S)

    async def _watch_main(self) -> None:
        fd = self.core.spawned.pidfd
        try:
            await anyio.wait_readable(fd)  # readable = exited; no polling delay
        finally:
            os.close(fd)
        self.core.reap()
        if self.core.spawned.proc is None and not self.core.main_reaped.is_set():
            # Adopted: main is not our child, so its exit code is not ours to read.
            self.core.main_reaped.set()
            self.core.log.info(events.MainExited(self.core.spawned.pid, None, adopted=True))
            self.core.send(lc.MainExited(None))

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
                    self.server.rebind(why="SIGUSR1")
                elif sig == signal.SIGURG:
                    await self._scope_stopping()
                elif sig == signal.SIGHUP:
                    self.core.log.warning("supervisor_signal_ignored", signal=name)
                else:
                    self.core.log.warning("supervisor_signal_stops_job", signal=name)
                    self.core.send(lc.StopRequested(next(self.core.tokens), None, verb=name))

    async def _scope_stopping(self) -> None:
        """SIGURG is what systemd sends when it stops this run's scope (systemd.STOP_SIGNAL):
        a host shutdown or `systemctl stop`. The job then gets its own graceful stop, inside
        the scope's TimeoutStopSec. A SIGURG while the scope is plainly active (socket
        out-of-band data, a stray kill) changes nothing."""
        unit = self.core.state.unit
        if unit is None:
            self.core.log.info("supervisor_signal_ignored", signal="SIGURG", why="no systemd scope")
            return
        active = await anyio.to_thread.run_sync(systemd.unit_active_state, unit)
        if active == "active":
            self.core.log.info("supervisor_signal_ignored", signal="SIGURG", unit_state=active)
            return
        self.core.log.warning("scope_stopping", unit=unit, unit_state=active)
        self.core.send(lc.StopRequested(next(self.core.tokens), None, verb="shutdown"))

    async def _run_stop(self, a: lc.RunStop) -> None:
        """Run the stop sequence in a thread (shielded), then report it to the owner."""
        run = functools.partial(
            run_stop,
            self.core.target(),
            self.core.spec,
            grace_s=a.grace_s,
            reason=a.reason,
            order=StopOrder(a.order) if a.order else None,
            leases=self.core.state.gpus,
            gpu_timeout_s=a.gpu_timeout_s,
            emit=self.core.log.info,
            grace=self.grace,
            roster=self.core.roster(),
            before_kill=before_kill_writer(
                self.core.jdir, self.core.state.run, self.core.state.marker
            ),
            gpu_memory=lambda: dict(self.watchers.gpu.memory) if self.watchers.gpu else {},
            gpu_backend=self.watchers.gpu.backend if self.watchers.gpu else None,
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
                await self.core.main_reaped.wait()
            if self._terminal is not None:
                self._terminal.read_available()  # the job's last output, before its cause
            cause = None
            if a.reason == "main exited" and not self.core.life.user_stop:
                cause = await anyio.to_thread.run_sync(self._analyse_safely)
            with contextlib.suppress(OSError):  # a nicety: the stop's report must still land
                self.watchers.oom.look()  # the last kills, recorded before the group goes
                memory.remove(self.core.memory_group(), self.core.target().cgroup)
            await anyio.to_thread.run_sync(self._copy_rest_of_log)
            self.watchers.stamper.step()  # the times of the last lines (in the loop: one writer)
            self.watchers.stamp_steps()
            note = None
            if a.reason == STARTED_OVER:  # before anything reads the checkpoint again
                note = await anyio.to_thread.run_sync(self.next.put_back)
            ones = []
            if not self.core.life.user_stop:  # the breaker on progress needs the newest step
                ones = await anyio.to_thread.run_sync(self.next.complete_checkpoints)
        self.core.send(self._finished(report, cause, ones, note))

    def _finished(
        self,
        report: StopReport,
        cause: Cause | None,
        ones: list[checkpoints.Verdict],
        note: str | None,
    ) -> lc.StopFinished:
        """What the lifecycle is told of a finished stop: the newest complete checkpoint,
        what the run was handed, what the guard did."""
        st, g = self.core.state, self.core.state.guard
        return lc.StopFinished(
            report,
            cause,
            ckpt_step=ones[0].step if ones else None,
            resumed_from=st.resumed_from or self.core.spec.env.get(RESUME_VAR),
            resumed_step=g.handed_step if g is not None else None,
            guard_note=note,
            no_checkpoint=bool(self.core.spec.watch.checkpoint) and not ones,
            rollback_ready=self.next.previous_spec() is not None,
        )

    async def _release_rollback(self) -> None:
        """The rollback run of a deploy: its report is final once the checkpoint guard
        judged this run (its first step, or it had no floor); if the guard stops it, the
        report says so once the stop is over (:meth:`_released_at_end`)."""
        jdir, run = self.core.jdir, self.core.state.run
        self._held_back = await anyio.to_thread.run_sync(deploys.pending_rollback, jdir, run)
        until = time.monotonic() + HELD_MAX_S
        while self._held_back is not None and self.core.stage is lc.Stage.RUNNING:
            if time.monotonic() > until:
                break  # no first step in all that time: it runs; the report says so
            g = self.core.state.guard
            if g is not None and g.tripped is not None:
                return  # said once the run has ended
            if g is None or g.floor is None or g.first_step is not None:
                break
            await anyio.sleep(GUARD_HELD_S)
        if self.core.stage is lc.Stage.RUNNING and self._held_back is not None:
            held, self._held_back = self._held_back, None
            await anyio.to_thread.run_sync(release_held, jdir, held, None)

    def _released_at_end(self) -> None:
        held, self._held_back = self._held_back, None
        if held is None:
            return
        st = self.core.state
        tripped = st.guard is not None and st.guard.tripped is not None
        over = (st.cause.summary if st.cause else None) if tripped else None
        release_held(self.core.jdir, held, over)

    def _analyse_safely(self) -> Cause | None:
        """The analysis, or None (the plain exit-code cause) if it breaks: a log or error
        file the job wrote must never cost the run its stop report or the supervisor."""
        st, group = self.core.state, self.core.memory_group()
        try:
            ef = self.core.spec.env.get("TORCHELASTIC_ERROR_FILE")
            files = (log_path(self.core.jdir, st.run),
                     Path(ef) if ef else error_file(self.core.jdir, st.run))  # fmt: skip
            return causes.analyse_end(
                files, st, self.core.spec, self.core.main_status,
                self.core.life.main_code,
                memory.oom_kills(group) if group is not None else 0,
                self.watchers.oom_victims(),
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001  (logged; the lifecycle falls back)
            self.core.log.warning("cause_analysis_failed", error=f"{type(e).__name__}: {e}")
            return None

    async def _wait_backoff(self, seconds: float, scope: anyio.CancelScope) -> None:
        with scope:
            await anyio.sleep(seconds)
            self.core.send(lc.BackoffElapsed())

    async def _relaunch(self, failure: Failure, rollback: str | None = None) -> None:
        st, spec = self.core.state, self.core.spec
        restarts, history = st.restarts + 1, self.core.life.history
        if rollback is not None:  # the previous code, with a restart budget of its own
            prev = await anyio.to_thread.run_sync(self.next.previous_spec)
            if prev is None:
                self.core.send(lc.Relaunched(error="the code the deploy replaced is gone"))
                return
            spec, restarts, history = prev, 0, ()
            await anyio.to_thread.run_sync(self.next.hold_rollback, prev, st.run + 1)
        failure = replace(failure, at=time.time())
        target = functools.partial(self.next.resume_target, rollback=rollback is not None)
        resume, skipped = await anyio.to_thread.run_sync(target)
        if skipped is not None:
            self.core.log.warning("resume_skipped", skipped=skipped, resume_from=resume,
                             why="the run failed right after resuming from it")  # fmt: skip
        try:
            leases = await anyio.to_thread.run_sync(self.next.healthy_leases)
        except TrainctlError as e:
            self.core.send(lc.Relaunched(error=str(e)))
            return
        leases = tuple(await anyio.to_thread.run_sync(fresh_baselines, leases))
        handover = Handover(
            run=st.run + 1,
            marker=ids.new_marker(),
            gpus=leases,
            restarts=restarts,
            last_failure=failure,
            restart_history=history,
            resume_from=resume,  # a complete checkpoint, never a partial one
            rolled_back=rollback,
        )
        await self._hand_over(spec, handover, skipped)

    async def _hand_over(self, spec: Spec, handover: Handover, skipped: str | None) -> None:
        """Start the next run's supervisor, handing it the lock; tell the owner how it went."""
        self.core.listener.close()  # the new supervisor binds the socket path itself
        home = self.core.jdir.parent.parent
        launch = functools.partial(
            launch_supervisor, home, self.core.jdir, spec, handover, 30.0, self.core.lock_fd
        )
        try:
            reply = await anyio.to_thread.run_sync(launch)
        except TrainctlError as e:
            self.core.send(lc.Relaunched(error=str(e)))
            return
        self.core.log.info(
            "relaunched",
            run=handover.run,
            main_pid=reply.main_pid,
            restarts=handover.restarts,
            resume_from=handover.resume_from,
            skipped=skipped,
        )
        self.core.send(lc.Relaunched())

    async def _copy_log(self, source: Path) -> None:
        """An adopted run writes to its own file (nohup.out, a redirect): copy what it
        writes from adoption on into the run's log, where `logs`, progress and the stall
        watchdog read it. The first line says where the earlier output is."""
        note = f"==> trainctl: adopted; the output before this is in {source} <==\n"
        copy = self._log_copy = LogCopy(source, log_path(self.core.jdir, self.core.state.run))
        await anyio.to_thread.run_sync(copy.step, note.encode())
        while True:
            await anyio.sleep(LOG_COPY_S)
            await anyio.to_thread.run_sync(copy.step, b"")

    def _copy_rest_of_log(self) -> None:
        """The run ended: copy what its own file gained since the last copy, before the end
        is recorded (`wait` then `logs` must show the lines written just before exit)."""
        if self._log_copy is not None:
            self._log_copy.drain()

    async def run(self) -> None:
        """Supervise until the run has ended and every waiting client has its answer."""
        diag = open_diag(self.core.jdir, self.core.spec.name, self.core.state.run)
        if diag is not None:  # the CLI has its answer: structlog's imports cost it nothing
            self.core.log.divert(diag)
            diag.info("supervisor_started", main_pid=self.core.spawned.pid,
                      restarts=self.core.state.restarts, gc_on=gc.isenabled(),
                      gc_frozen=gc.get_freeze_count())  # fmt: skip
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._reaper)
            tg.start_soon(self._watch_main)
            tg.start_soon(self._signals)
            tg.start_soon(self.server.serve, tg)
            self.watchers.start(tg)
            if self.core.spawned.pty is not None:
                path = log_path(self.core.jdir, self.core.state.run)
                write, error = log_appender(path)
                if error is not None:  # the terminal is still read: the job must not block
                    self.core.log.warning("tty_log_unwritable", path=str(path), error=error)
                self._terminal = self.server.terminal = Terminal.over(self.core.spawned.pty, write)
                tg.start_soon(self._terminal.pump)
            source = self.core.state.adopted.log_source if self.core.state.adopted else None
            if source is not None:
                tg.start_soon(self._copy_log, Path(source))
            if self.core.state.restarts == 0 and self.core.state.adopted is None:
                self.fire("start", self._started(), notify=False)
            if self.core.state.rolled_back is not None:
                tg.start_soon(self._release_rollback)
            await self._own_lifecycle(tg)
            self._released_at_end()
            if self._terminal is not None:
                self._terminal.finish(self._end_of_run())
            if self.core.life.stage is not lc.Stage.HANDED_OVER:
                with contextlib.suppress(FileNotFoundError):
                    (self.core.jdir / control.SOCK_NAME).unlink()
            # clients still connected get their answer (late stops: the final report)
            # ... by the same owner: the ended machine answers a stop with the final report
            with anyio.move_on_after(5):
                while self.core.handlers:
                    with anyio.move_on_after(0.05):
                        await self._step(tg)
            tg.cancel_scope.cancel()

    def _end_of_run(self) -> JsonObject:
        """What an attached viewer is told when the run ends (terminal.END)."""
        st = self.core.state
        if self.core.life.stage is lc.Stage.HANDED_OVER:
            summary = f"run {st.run} ended; run {st.run + 1} started (attach again)"
        else:
            summary = st.cause.summary if st.cause else f"run {st.run} ended"
        return {
            "phase": str(st.phase),
            "run": st.run,
            "exit_code": st.exit_code,
            "summary": summary,
        }

    def _started(self) -> Cause:
        main = self.core.state.main.pid if self.core.state.main else None
        gpus = ",".join(str(g.index) for g in self.core.state.gpus)
        on = f" on GPU(s) {gpus}" if gpus else ""
        return Cause(
            kind="start", summary=f"run {self.core.state.run} started{on}, main pid {main}"
        )


class Supervisor:
    """One run of one job, supervised: its parts wired together, nothing more.

    The run's record (core.py) is held by each part; the control server answers the CLI
    and the watchers look (each reporting as an event); the lifecycle owner decides and
    writes. None inherits from another.
    """

    def __init__(self, core: RunCore) -> None:
        self.core = core
        self.server = ControlServer(self.core)
        self.watchers = Watchers(self.core, rebind=self.server.rebind)
        self.owner = Owner(self.core, self.server, self.watchers)
        self.run = self.owner.run


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
    sup = Supervisor(RunCore(jdir, spec, state, spawned, cgroup, listener, lock_fd))
    code = 0
    core = sup.core
    try:
        anyio.run(sup.run)
    except Exception:  # noqa: BLE001  (last resort: record why, the job itself is unharmed)
        core.log.error("supervisor_crashed", traceback=traceback.format_exc())  # noqa: TRY400
        code = 70
    core.log.info(
        "supervisor_exit",
        phase=str(core.state.phase),
        handed_over=core.stage is lc.Stage.HANDED_OVER,
    )
    # Everything is on disk (state fsynced, events line-buffered). Exiting right here keeps
    # the lock until the process is really gone, and skips an interpreter teardown that
    # `trainctl stop` would otherwise sit through waiting for supervisor.lock.
    del lock_fd
    os._exit(code)
