"""Here, under trainctl's own supervisor: start, undo a failed start, stop, checkpoint.

The start (:mod:`.start`), the stop (:mod:`.stop`; without a supervisor,
:mod:`.direct`), the checkpoint asked by signal (:mod:`.signalled`) and the watch of a
run's events (:mod:`.follow`) are loaded when used, so `status` reads a job without
importing them. The checkpoint signal (SIGUSR2 by
default) goes only to job processes that *catch* it, as read from the SigCgt mask in
/proc/<pid>/status: a process whose default action for it is to terminate (a torchrun
agent, for one) must never receive it. If no process catches it, the request is refused
before anything is signalled.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trainctl.launcher.backends import (
    Asked,
    Capabilities,
    RunWatch,
    StartRequest,
    StopRequest,
)
from trainctl.launcher.results import Checkpoint, Seen, StartResult, StopResult
from trainctl.supervisor.errors import ConfigError
from trainctl.supervisor.model import state
from trainctl.supervisor.model.spec import SLURM_KEYS, Spec
from trainctl.supervisor.model.state import JobState

from .record import record

if TYPE_CHECKING:  # the spec file reader (tomllib): only for the type
    from trainctl.launcher.specfile import SpecDraft


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
        from .follow import EventWatch  # noqa: PLC0415  (the events: ~0.5 ms, not for status)

        return EventWatch(jdir, run)

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
        from .signalled import checkpoint  # noqa: PLC0415  (the control socket: not for status)

        return checkpoint(jdir, st, spec, timeout_s, asked)

    def record(self, jdir: Path, st: JobState) -> None:
        """Write state.json where no supervisor does (record.py)."""
        record(jdir, st)


BACKEND = Local()
