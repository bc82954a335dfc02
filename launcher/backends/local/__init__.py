"""Here, under trainctl's own supervisor: start, undo a failed start, stop, checkpoint.

The start (:mod:`.start`) and the stop (:mod:`.stop`; without a supervisor,
:mod:`.direct`) are loaded when used, so `status` reads a job without importing them. The checkpoint
signal (SIGUSR2 by default) goes only to job processes that *catch* it, as read from the
SigCgt mask in /proc/<pid>/status: a process whose default action for it is to terminate
(a torchrun agent, for one) must never receive it. If no process catches it, the request
is refused before anything is signalled.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from trainctl.launcher.backends import (
    Asked,
    Capabilities,
    RunWatch,
    StartRequest,
    StopRequest,
)
from trainctl.launcher.checkpoint import wait_new_checkpoint
from trainctl.launcher.results import Checkpoint, Seen, StartResult, StopResult
from trainctl.supervisor.errors import (
    ConfigError,
    JobConflictError,
    ProcessTreeError,
    StateError,
)
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model import control, events, state
from trainctl.supervisor.model.spec import SLURM_KEYS, Spec
from trainctl.supervisor.model.state import JobState
from trainctl.supervisor.tree.proctree import alive, scan, target_of

from .record import record

if TYPE_CHECKING:  # the spec file reader (tomllib): only for the type
    from trainctl.launcher.specfile import SpecDraft


class _EventWatch:
    """A local run followed by its supervisor's events (``events.Follow``): over at its
    ``ended`` or ``restart_scheduled`` event, or a later run's ``started``. state.json is
    read once, after the follow began, for a run that ended before it. A supervisor that
    dies writes nothing more: its run is lost, not over (as `status` says), and the
    watch's caller waits out its time."""

    def __init__(self, jdir: Path, run: int) -> None:
        self.run = run
        self.follow = events.Follow(jdir)  # first: nothing after this look is missed
        st = state.read_state(jdir)
        relaunch = st.run != run or st.restart_at is not None
        self.done = relaunch or st.phase.ended
        self.ended = st.run == run and st.phase.ended and st.restart_at is None

    def over(self) -> bool:
        if self.done:
            return True
        for ev in self.follow.new():
            ended = isinstance(ev, events.Ended) and ev.run == self.run
            relaunch = isinstance(ev, events.RestartScheduled) and ev.run == self.run
            later = isinstance(ev, events.Started) and ev.run > self.run
            self.ended = self.ended or ended
            self.done = self.done or ended or relaunch or later
        return self.done

    def final(self) -> bool:
        return self.over() and self.ended


class Local:
    """Here, under trainctl's own supervisor."""

    kind = "local"
    title = "local"
    can = Capabilities(
        deploy=True, terminal=True, local_stacks=True, memory_caps=True, gpu_healing=True
    )
    queues_here = True

    def check_values(self, draft: SpecDraft) -> None:
        """Slurm's keys only make sense with --backend slurm."""
        if keys := SLURM_KEYS & set(draft.given()):
            raise ConfigError(f"{', '.join(sorted(keys))}: only with --backend slurm")

    def seen(self, jdir: Path, st: JobState) -> Seen:
        """The recorded phase, or LOST when the supervisor of a live run is gone."""
        phase = state.effective_phase(jdir, st)
        return Seen(phase, st.exit_code, st.mode, ended=phase.ended)

    def watch_run(self, jdir: Path, run: int) -> RunWatch:
        """The run's supervisor's events: its end, a relaunch, a later run's start."""
        return _EventWatch(jdir, run)

    def refuse_if_live(self, jdir: Path, prev: JobState) -> None:
        """Nothing beyond the supervisor and member checks every backend gets."""

    def start(self, req: StartRequest) -> StartResult:
        """Hand the run to a new supervisor; undo everything if that fails."""
        from .start import start_run  # noqa: PLC0415  (subprocess etc.: status never pays)

        return start_run(req)

    def stop(self, jdir: Path, st: JobState, spec: Spec, req: StopRequest) -> StopResult:
        """Stop the run; a start or restart racing the stop loses to it.

        Through the live supervisor, else directly from state.json (see local/stop.py).
        """
        from .stop import stop_run  # noqa: PLC0415  (the stop machinery: not for status)

        return stop_run(jdir, spec, req)

    def checkpoint(
        self, jdir: Path, st: JobState, spec: Spec, timeout_s: float, asked: Asked
    ) -> Checkpoint | None:
        """Signal the job's processes that catch the checkpoint signal; wait for the file."""
        members = alive(scan(target_of(st)))
        if not members:
            return None
        if not spec.watch.checkpoint:
            raise JobConflictError(
                f"job {st.name} has no `checkpoint` glob in its spec; "
                "cannot tell when a checkpoint is written"
            )
        sig = signal.Signals[spec.watch.checkpoint_signal]
        through = _through_supervisor(jdir, st, sig, asked)
        if through is not None:  # the supervisor holds the run: it signals (issue 55)
            return wait_new_checkpoint(spec, through, timeout_s)
        # no supervisor answers (lost), or an older one: the processes, by pid and start time
        targets = [m for m in members.values() if procfs.catches(m.stat.pid, sig)]
        if not targets:
            raise JobConflictError(
                f"no process of job {st.name} catches {sig.name} ({len(members)} checked); "
                "refusing: nothing was signalled (--at next-checkpoint waits for the "
                "trainer's own next save instead)"
            )
        asked()
        asked_at = time.time()
        sent = sum(procfs.send_signal(m.stat.pid, m.stat.start_ticks, sig) for m in targets)
        if not sent:
            raise ProcessTreeError(f"the {sig.name} catchers of job {st.name} are gone")
        return wait_new_checkpoint(spec, asked_at, timeout_s)

    def record(self, jdir: Path, st: JobState) -> None:
        """Write state.json where no supervisor does (record.py)."""
        record(jdir, st)


def _through_supervisor(
    jdir: Path, st: JobState, sig: signal.Signals, asked: Asked
) -> float | None:
    """Ask the run's live supervisor to send ``sig`` to the processes that catch it; when
    it was asked, the time. None: no supervisor answers, or it speaks an older protocol
    (the CLI signals them itself, as before). JobConflictError: none catches it."""
    if st.supervisor is None:
        return None
    try:
        reply = control.ask_checkpoint(jdir, sig.name, ASK_S)
    except (control.ControlUnavailableError, StateError, OSError):
        return None
    if reply.code == "none-catches":
        raise JobConflictError(
            f"no process of job {st.name} catches {sig.name} ({reply.checked} checked); "
            "refusing: nothing was signalled (--at next-checkpoint waits for the "
            "trainer's own next save instead)"
        )
    if not reply.ok:
        raise ProcessTreeError(f"job {st.name}: {reply.error or 'the checkpoint was not asked'}")
    asked()
    return reply.asked_at


ASK_S = 5.0  # the supervisor's answer to a checkpoint request (a scan and the signals)


BACKEND = Local()
