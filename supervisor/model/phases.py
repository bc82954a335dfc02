"""A run's lifecycle phase as state.json records it, and the moves between phases.

A leaf module: the records of a stop (reports.py) and the state (state.py) both name it.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """Lifecycle phase of a job's current run."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"  # stopped by `trainctl stop`
    EXITED = "exited"  # main exited with status 0 on its own
    FAILED = "failed"  # main exited non-zero / by a signal, or never started
    LOST = "lost"  # derived, never stored: supervisor gone while the run was live

    # The one answer to "is the run over?" (issue 55): every reader asks the phase, the
    # recorded one (``st.phase``) or the one its backend sees now (``jobs.current_phase``).
    @property
    def ended(self) -> bool:
        """The run is over: stopped, exited or failed. LOST is not: its processes may live."""
        return self in TERMINAL

    @property
    def live(self) -> bool:
        """The run is on under a live supervisor (or scheduler): neither ended nor lost."""
        return self not in TERMINAL and self is not Phase.LOST


TERMINAL = frozenset({Phase.STOPPED, Phase.EXITED, Phase.FAILED})

# The legal moves. Anything else is a bug and raises.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.RUNNING, Phase.FAILED, Phase.STOPPING}),
    Phase.RUNNING: frozenset({Phase.STOPPING, Phase.EXITED, Phase.FAILED}),
    # STOPPING -> STARTING: the restart policy relaunches after cleaning up a failed run
    # (the run never shows a terminal phase then); STARTING -> STOPPING: stop during backoff
    Phase.STOPPING: frozenset({Phase.STOPPED, Phase.EXITED, Phase.FAILED, Phase.STARTING}),
    Phase.STOPPED: frozenset({Phase.STARTING}),
    Phase.EXITED: frozenset({Phase.STARTING, Phase.STOPPED}),
    Phase.FAILED: frozenset({Phase.STARTING, Phase.STOPPED}),
}
