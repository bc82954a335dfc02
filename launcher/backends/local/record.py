"""The local backend's writer of state.json on the CLI's side: where no supervisor lives
(a start that failed, a stop without a supervisor, a queued start that failed). A live
run's state is its supervisor's to write (supervisor/core.py; supervisor/boot.py before
the run's owner exists): tests/architecture names every writer."""

from __future__ import annotations

from pathlib import Path

from trainctl.supervisor.model import state
from trainctl.supervisor.model.state import JobState


def record(jdir: Path, st: JobState) -> None:
    """Replace the job's state.json with ``st`` (atomically; OSError: it could not)."""
    state.write_state(jdir, st)
