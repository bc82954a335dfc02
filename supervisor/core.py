"""The supervisor's core: one run's state and its one writer, the events sent to the
lifecycle owner, the hooks it fires, the reaping of its children.

The control server (server.py), the watchers (watchers.py) and the lifecycle owner
(service.py) are built on it, in that order.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import socket
from pathlib import Path
from typing import Any, TextIO, cast

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import structlog

from trainctl.supervisor.gpu.watch import GpuWatch
from trainctl.supervisor.model.reports import Cause
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import (
    JobState,
    Phase,
    ProcRef,
    log_path,
    open_events,
    progress_path,
    write_event_line,
    write_state,
)
from trainctl.supervisor.tree.proctree import Target, target_of
from trainctl.supervisor.tree.roster import Roster
from trainctl.supervisor.tree.spawn import Spawned, exit_code_of
from trainctl.supervisor.tree.terminal import Terminal
from trainctl.supervisor.tree.terminate import Grace
from trainctl.supervisor.watch.logtimes import LogStamper
from trainctl.supervisor.watch.stall import CheckpointWatch, StallLearner

from .errors import StateError
from .life import hooks
from .life import lifecycle as lc
from .linux import memory
from .logcopy import LogCopy
from .model import control, steps


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


class SupervisorCore:
    """What every part of a supervisor shares: the run's state (written only by `_set`, which
    only the lifecycle owner calls), its event log, and the queue to the owner."""

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
        self.jdir, self.spec, self.state = jdir, spec, state
        self.spawned, self.cgroup = spawned, cgroup
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
        self._sampled_at = 0.0  # progress samples for the ETA (see supervisor/model/steps.py)
        self._sampled_step: tuple[int, float] | None = None  # (run, step)
        self._roster: Roster | None = None  # cgroup mode: the run's members, held by pidfd
        self._stopping = False  # a stop sequence is running (see _reaper)
        self._reap_on_signal: anyio.CancelScope | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._gpu: GpuWatch | None = None  # the run's GPUs, looked at (see _watch_gpus)
        self._exe_checked: set[ProcRef] = set()  # members whose executable was read
        self._log_copy: LogCopy | None = None  # an adopted run's own file, into its log
        self._terminal: Terminal | None = None  # `--tty`: main's pty (see service.run)
        self._stamper = LogStamper(log_path(jdir, state.run))  # when the log grew
        self._stall_learner = StallLearner()  # stall_timeout = "auto" (stall.py)
        self._ckpt_watch: CheckpointWatch | None = None  # its look at the checkpoints
        try:  # the socket this supervisor serves; a different file there is not ours
            self._sock_ino: int | None = os.stat(jdir / control.SOCK_NAME).st_ino
        except OSError:
            self._sock_ino = None
        self._stale_checked = 0.0  # when the checkpoint's age was last looked at
        self._stale_fired = False  # on_checkpoint_stale fired; re-armed by a newer checkpoint

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

    def _memory_group(self) -> Path | None:
        group = self.state.memory_cgroup
        return Path(group) if group and memory.is_ours(Path(group)) else None

    def _observe(
        self, *, add: tuple[tuple[str, tuple[str, ...], int], ...] = (), **put: object
    ) -> None:
        """A watcher's look, handed to the owner, which records it (lc.Observed)."""
        self.send(lc.Observed(tuple(put.items()), add))

    def send(self, ev: lc.Event) -> None:
        """Queue an event for the lifecycle owner (never blocks: the buffer is generous)."""
        with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
            self.events_tx.send_nowait(ev)

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
