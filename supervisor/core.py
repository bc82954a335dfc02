"""The run's record, shared by the supervisor's parts: its state and the one writer of it,
the events sent to the lifecycle owner, the hooks it fires, the reaping of its children.

A part, not a base class: the control server (server.py), the watchers (watchers.py) and
the lifecycle owner (service.py) each hold it. The watchers see it through
:class:`RunView`, read-only: they look, and send what they saw.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel

from trainctl.supervisor.model import events
from trainctl.supervisor.model.reports import Cause
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import (
    JobState,
    Phase,
    progress_path,
    write_state,
)
from trainctl.supervisor.records import JsonObject
from trainctl.supervisor.tree.proctree import Target, target_of
from trainctl.supervisor.tree.roster import Roster
from trainctl.supervisor.tree.spawn import Spawned, exit_code_of

from .errors import StateError
from .life import hooks
from .life import lifecycle as lc
from .linux import memory
from .model import steps


def _configure_events(jdir: Path, name: str) -> events.EventLog:
    return events.EventLog(_BestEffortFile(jdir), job=name)


class _BestEffortFile:
    """events.jsonl for the event log: a full or read-only disk loses event lines, never the
    job.

    Each line goes out through the same writer as the CLI's events (one write(2) on an
    O_APPEND descriptor). A failed write is counted and dropped; it never raises into the
    supervisor, which must keep reaping and answering stops (state.json's own write
    failures are reported).
    """

    def __init__(self, jdir: Path) -> None:
        self.failures = 0
        self.fd: int | None = None
        try:
            self.fd = events.open_events(jdir)
        except (OSError, StateError):
            self.failures += 1

    def write(self, text: str) -> None:
        if self.fd is None:
            return
        try:
            events.write_event_line(self.fd, text)
        except OSError:
            self.failures += 1


class RunView(Protocol):
    """What a watcher may see of the run, and how it reports: read-only state, ``send``
    and ``observe`` (the owner records what it is sent)."""

    @property
    def jdir(self) -> Path: ...
    @property
    def spec(self) -> Spec: ...
    @property
    def state(self) -> JobState: ...
    @property
    def stage(self) -> lc.Stage: ...
    @property
    def log(self) -> events.EventLog: ...
    def send(self, ev: lc.Event) -> None: ...
    def observe(
        self, *, add: tuple[tuple[str, tuple[str, ...], int], ...] = (), **put: object
    ) -> None: ...
    def target(self) -> Target: ...
    def roster(self) -> Roster | None: ...
    def memory_group(self) -> Path | None: ...
    def reap(self) -> None: ...
    def fire(
        self, event: str, cause: Cause, *, notify: bool = True, step: float | None = None
    ) -> None: ...


class RunCore:
    """What every part of a supervisor shares: the run's state (written only by
    `set_state`, which only the lifecycle owner calls), its event log, the queue to the
    owner and the control server's waiting answers."""

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
        t = state.trial  # a deploy's new code: held to its gate, then its probation
        self.life = lc.Life(
            restarts=state.restarts,
            run=state.run,
            history=state.restart_history,
            started_at=state.started_at,
            trial=t.stage if t is not None else None,
            trial_rollback=t is not None and t.rollback,
            trial_of=f"deploy {t.id} of {t.to_commit or '?'}" if t is not None else "the deploy",
        )
        self.main_status: int | None = None
        self.main_reaped = anyio.Event()
        self.events_tx, self.events_rx = anyio.create_memory_object_stream[lc.Event](64)
        self.replies: dict[int, anyio.Event] = {}
        self.answers: dict[int, JsonObject] = {}
        self.tokens = itertools.count(1)
        self.persist_error: str | None = None
        self.handlers = 0  # control connections not yet answered
        self._roster: Roster | None = None  # cgroup mode: the run's members, held by pidfd

    def set_state(self, phase: Phase, *, durable: bool = True, **changes: Any) -> None:
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

    @property
    def stage(self) -> lc.Stage:
        """Where the lifecycle is (the owner moves it)."""
        return self.life.stage

    def target(self) -> Target:
        """What a stop or a scan of this run looks for (its marker, cgroup, main)."""
        return target_of(self.state)

    def roster(self) -> Roster | None:
        """The current run's roster (cgroup mode only); a new run gets a new one."""
        t = self.target()
        if t.cgroup is None or t.main is None:
            return None
        r = self._roster
        if r is None or r.target.cgroup != t.cgroup or r.target.main != t.main:
            if r is not None:
                r.close()
            r = self._roster = Roster(t)
        return r

    def memory_group(self) -> Path | None:
        """The run's own memory cgroup, when trainctl made it."""
        group = self.state.memory_cgroup
        return Path(group) if group and memory.is_ours(Path(group)) else None

    def observe(
        self, *, add: tuple[tuple[str, tuple[str, ...], int], ...] = (), **put: object
    ) -> None:
        """A watcher's look, handed to the owner, which records it (lc.Observed)."""
        self.send(lc.Observed(tuple(put.items()), add))

    def send(self, ev: lc.Event) -> None:
        """Queue an event for the lifecycle owner (never blocks: the buffer is generous)."""
        with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
            self.events_tx.send_nowait(ev)

    def fire(
        self, event: str, cause: Cause, *, notify: bool = True, step: float | None = None
    ) -> None:
        """Hand the event to a hook runner, if the job has a hook or a URL for it (``step``:
        the newest progress step the watchers sampled, if any)."""
        if step is None:  # a job that reports through $TRAINCTL_PROGRESS (trainer.report)
            reported = progress_path(self.jdir, self.state.run)
            step = steps.newest_reported(reported)
        if step is not None and step == int(step):
            step = int(step)
        progress: JsonObject | None = (
            None if step is None else {"step": step, "total": self.spec.watch.total_steps}
        )
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
                self.log.info(events.MainExited(pid, exit_code_of(status)))
                self.send(lc.MainExited(exit_code_of(status)))
            else:
                self.log.debug("reaped", pid=pid, exit_code=exit_code_of(status))
