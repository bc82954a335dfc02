"""The supervisor's main loop (anyio): exit watch, reaping, snapshots, control socket, stop.

One supervisor per job run. It is never in the job's data path (the job writes its log
itself), so killing it loses no log line; ``trainctl stop`` then works from state.json.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream

from . import cgroup as cg
from . import control, procfs
from .errors import TrainctlError
from .gpu.verify import fresh_baselines, gpu_policy_of
from .launch import Handover, launch_supervisor
from .policy import backoff_s, restart_refusal
from .proctree import Target, scan, target_of
from .spawn import Spawned, exit_code_of
from .state import JobState, MemberSnap, Phase, Spec, StopOrder, log_path, mtime, write_state
from .terminate import StopPolicy, stop_and_verify


def _configure_events(jdir: Path, name: str) -> structlog.typing.FilteringBoundLogger:
    events = open(jdir / "events.jsonl", "a", buffering=1)  # noqa: SIM115 (lives as long as we do)
    structlog.configure(
        processors=[
            structlog.processors.TimeStamper(fmt=None, key="ts"),
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.WriteLoggerFactory(file=events),
        # per-orphan "reaped" lines are debug: 240 of them would slow a stop by ~15 ms
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        cache_logger_on_first_use=True,
    )
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger().bind(job=name)
    return log


class Supervisor:
    """Supervises one run of one job."""

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
        self.main_status: int | None = None
        self.main_exited = anyio.Event()
        self.stop_done = anyio.Event()
        self.stop_report: dict[str, Any] | None = None
        self.stopping = False
        self.done = anyio.Event()
        self.handlers = 0
        self.lock_fd = lock_fd
        self.in_backoff = False
        self.cancel_restart = anyio.Event()
        self.handed_over = False  # a relaunch gave the job (and its lock) to a successor
        self.cancelled: dict[str, Any] | None = None  # report of a stop during the backoff
        self.idle = anyio.Event()  # set when the run is done and no client awaits a reply

    # ------------------------------------------------------------ state

    def _set(self, phase: Phase, *, durable: bool = True, **changes: Any) -> None:
        self.state = self.state.moved(phase, **changes)
        write_state(self.jdir, self.state, durable=durable)

    def _target(self) -> Target:
        return target_of(self.state)

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
            if pid == self.spawned.pid:
                self.main_status = status
                # We reaped it ourselves; tell Popen so it never waits or warns.
                self.spawned.proc.returncode = exit_code_of(status)
                self.main_exited.set()
                self.log.info("main_exited", pid=pid, exit_code=exit_code_of(status))
            else:
                self.log.debug("reaped", pid=pid, exit_code=exit_code_of(status))

    async def _reaper(self) -> None:
        with anyio.open_signal_receiver(signal.SIGCHLD) as signals:
            self.reap()  # children that exited before the handler was installed
            async for _ in signals:
                self.reap()

    async def _watch_main(self) -> None:
        fd = self.spawned.pidfd
        try:
            await anyio.wait_readable(fd)  # readable = exited; no polling delay
        finally:
            os.close(fd)
        self.reap()
        await self.main_exited.wait()
        if not self.stopping:
            # Main is gone on its own: whatever it left behind (orphaned workers holding
            # GPUs) is cleaned up now, with the same grace a stop would give.
            await self.stop(self.spec.grace_s, reason="main exited")

    # ------------------------------------------------------------ snapshots

    async def _snapshots(self) -> None:
        while True:
            await anyio.sleep(self.spec.snapshot_interval_s)
            self.reap()
            await self._check_stall()
            if self.stopping or self.in_backoff:
                continue
            members = await anyio.to_thread.run_sync(scan, self._target())
            snap = tuple(
                MemberSnap(
                    pid=m.stat.pid,
                    start_ticks=m.stat.start_ticks,
                    ppid=m.stat.ppid,
                    pgid=m.stat.pgid,
                    sid=m.stat.sid,
                    cmd=procfs.read_cmdline(pid)[:300],
                    nets=tuple(sorted(m.nets)),
                )
                for pid, m in sorted(members.items())
                if m.alive
            )
            # Rewrite (and fsync) only when the member set changed: a quiet job costs nothing.
            if {(s.pid, s.start_ticks) for s in snap} != {
                (s.pid, s.start_ticks) for s in self.state.members
            } and not self.stopping:
                self._set(self.state.phase, members=snap, snapshot_at=time.time())

    # ------------------------------------------------------------ stop

    async def stop(
        self,
        grace_s: float,
        *,
        reason: str,
        order: StopOrder | None = None,
        gpu_timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Run the stop sequence once; concurrent callers share its report.

        ``reason`` is "stop" (a user), "main exited" (cleanup after main), or "stalled"
        (the watchdog); only the latter two may lead to a relaunch by the restart policy.
        """
        if self.in_backoff and reason == "stop":
            self.cancel_restart.set()  # a stop during the backoff cancels the restart
        if self.stopping or self.in_backoff:
            await self.stop_done.wait()
            return self.stop_report or {}
        self.stopping = True
        self._set(Phase.STOPPING, durable=False)  # visible at once; no fsync on the hot path
        order = order or StopOrder(self.spec.stop_order)
        self.log.info("stopping", reason=reason, grace_s=grace_s, order=str(order))
        policy = StopPolicy(grace_s=grace_s, kill_wait_s=self.spec.kill_wait_s)
        run = functools.partial(
            stop_and_verify,
            self._target(),
            signal.Signals[self.spec.stop_signal],
            policy,
            leases=self.state.gpus,
            gpu_policy=gpu_policy_of(self.spec, gpu_timeout_s),
            order=order,
            emit=self.log.info,
        )
        with anyio.CancelScope(shield=True):
            report = await anyio.to_thread.run_sync(run)
            with anyio.move_on_after(2):
                await self.main_exited.wait()
        report["reason"] = reason
        code = exit_code_of(self.main_status) if self.main_status is not None else None
        if reason == "stop":
            final = Phase.STOPPED
        else:
            final = Phase.EXITED if code == 0 and reason == "main exited" else Phase.FAILED
        why_not = restart_refusal(
            self.spec, self.state.restarts, code, bool(report.get("ok")), reason
        )
        ended: dict[str, Any] = {
            "exit_code": code,
            "ended_at": time.time(),
            "last_stop": report,
            "members": (),
        }
        if why_not is None:
            # Straight from STOPPING to STARTING: `wait` and `logs -f` must never see a
            # terminal phase for a run that is about to be relaunched.
            self._cleanup(remove_socket=False)
            with anyio.CancelScope(shield=True):
                await self._restart(code, reason, ended)
            return self._finish(self.cancelled or report)
        if why_not:
            self.log.info("not_restarting", why=why_not)
            ended["error"] = why_not
        self._set(final, **ended)
        self._cleanup(remove_socket=False)
        return self._finish(report)

    def _finish(self, report: dict[str, Any]) -> dict[str, Any]:
        if not self.handed_over:
            with contextlib.suppress(FileNotFoundError):
                (self.jdir / control.SOCK_NAME).unlink()
        self.stop_report = report
        self.stop_done.set()
        self.done.set()
        self._check_idle()
        return report

    # ------------------------------------------------------------ restart policy

    async def _restart(self, code: int | None, reason: str, ended: dict[str, Any]) -> None:
        """Wait out the backoff (a stop cancels it), then hand over to a new supervisor."""
        st = self.state
        backoff = backoff_s(self.spec, st.restarts)
        failure = {"run": st.run, "exit_code": code, "at": time.time(), "reason": reason}
        self._set(Phase.STARTING, restart_at=time.time() + backoff, last_failure=failure, **ended)
        self.log.info("restart_scheduled", backoff_s=backoff, restarts=st.restarts, **failure)
        self.in_backoff, self.stopping = True, False
        with anyio.move_on_after(backoff):
            await self.cancel_restart.wait()
        if self.cancel_restart.is_set():
            self.stopping = True
            self._set(Phase.STOPPING)  # STARTING -> STOPPING -> STOPPED: the legal path
            self.cancelled = {
                "ok": True,
                "already_stopped": True,
                "reason": "stop during restart backoff: restart cancelled",
            }
            self._set(Phase.STOPPED, restart_at=None, last_stop=self.cancelled)
            self.log.info("restart_cancelled")
            return
        await self._relaunch(failure)

    async def _relaunch(self, failure: dict[str, Any]) -> None:
        st = self.state
        leases = tuple(await anyio.to_thread.run_sync(fresh_baselines, st.gpus))
        handover = Handover(
            run=st.run + 1,
            marker=uuid.uuid4().hex,
            gpus=leases,
            restarts=st.restarts + 1,
            last_failure=failure,
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
            self._set(Phase.FAILED, restart_at=None, error=f"relaunch failed: {e}")
            self.log.warning("relaunch_failed", error=str(e))
            return
        self.handed_over = True
        self.log.info(
            "relaunched",
            run=handover.run,
            main_pid=reply.get("main_pid"),
            restarts=handover.restarts,
        )

    # ------------------------------------------------------------ stall watchdog

    async def _check_stall(self) -> None:
        timeout = self.spec.stall_timeout_s
        if not timeout or self.stopping or self.in_backoff:
            return
        st = self.state
        progress = self.jdir / "logs" / f"run-{st.run}.progress.jsonl"
        last = max([st.started_at, *(mtime(p) for p in (log_path(self.jdir, st.run), progress))])
        idle = time.time() - last
        if idle < timeout:
            if st.stalled_since is not None:
                self._set(st.phase, stalled_since=None)
                self.log.info("unstalled")
            return
        if st.stalled_since is None:
            self._set(st.phase, stalled_since=last)
            self.log.warning("stalled", idle_s=round(idle, 1), on_stall=self.spec.on_stall)
        if self.spec.on_stall == "restart":
            await self.stop(self.spec.grace_s, reason="stalled")

    # ------------------------------------------------------------ control socket

    async def _serve(self) -> None:
        listener = await anyio.abc.SocketListener.from_socket(self.listener)
        async with listener:
            await listener.serve(self._handle)

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        self.handlers += 1
        try:
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
        except (
            anyio.EndOfStream,
            anyio.IncompleteRead,
            anyio.BrokenResourceError,
            anyio.DelimiterNotFound,
            ValueError,
        ):
            pass
        finally:
            self.handlers -= 1
            self._check_idle()

    def _check_idle(self) -> None:
        if self.done.is_set() and not self.handlers:
            self.idle.set()

    async def _dispatch(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "phase": str(self.state.phase)}
        if op == "stop":
            grace = float(req.get("grace_s", self.spec.grace_s))
            gt = req.get("gpu_timeout_s")
            report = await self.stop(
                grace,
                order=_order_of(req),
                reason="stop",
                gpu_timeout_s=None if gt is None else float(gt),
            )
            return {"ok": True, "report": report, "exit_code": self.state.exit_code}
        return {"ok": False, "error": f"unknown op {op!r}"}

    # ------------------------------------------------------------ main

    async def run(self) -> None:
        """Supervise until the run has ended and every client has its answer."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._reaper)
            tg.start_soon(self._watch_main)
            tg.start_soon(self._snapshots)
            tg.start_soon(self._serve)
            await self.done.wait()
            with anyio.move_on_after(5):
                await self.idle.wait()
            tg.cancel_scope.cancel()

    def _cleanup(self, *, remove_socket: bool = True) -> None:
        if remove_socket:
            with contextlib.suppress(FileNotFoundError):
                (self.jdir / control.SOCK_NAME).unlink()
        if self.cgroup is not None:
            for _ in range(50):
                if cg.remove(self.cgroup) or not self.cgroup.exists():
                    break
                time.sleep(0.02)


def _order_of(req: dict[str, Any]) -> StopOrder | None:
    """The stop order a request asks for (None: the job's own); `main_only` is the old form."""
    raw = req.get("order")
    if raw in tuple(StopOrder):
        return StopOrder(raw)
    return StopOrder.MAIN if req.get("main_only") else None


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
    sup = Supervisor(jdir, spec, state, spawned, cgroup, listener, lock_fd)
    code = 0
    try:
        anyio.run(sup.run)
    except Exception:  # noqa: BLE001  (last resort: record why, the job itself is unharmed)
        sup.log.error("supervisor_crashed", traceback=traceback.format_exc())  # noqa: TRY400
        code = 70
    sup.log.info("supervisor_exit", phase=str(sup.state.phase), handed_over=sup.handed_over)
    # Everything is on disk (state fsynced, events line-buffered). Exiting right here keeps
    # the lock until the process is really gone, and skips an interpreter teardown that
    # `trainctl stop` would otherwise sit through waiting for supervisor.lock.
    del lock_fd
    os._exit(code)
