"""Finding a job and its live processes: the light helpers every verb shares."""

from __future__ import annotations

from pathlib import Path

from trainctl.supervisor import state
from trainctl.supervisor.errors import JobNotFoundError
from trainctl.supervisor.proctree import Member, Target, alive, scan
from trainctl.supervisor.state import JobState


def existing_job(home: Path, name: str) -> Path:
    """Return the job's directory, or raise JobNotFoundError."""
    jdir = state.job_dir(home, name)
    if not (jdir / "state.json").exists() and not (jdir / "spec.json").exists():
        raise JobNotFoundError(f"no job named {name!r} (in {home})")
    state.check_owner(jdir)
    return jdir


def target_of(st: JobState) -> Target:
    """Build the scan target of a recorded run."""
    return Target(
        marker=st.marker,
        main=st.main,
        supervisor=st.supervisor,
        pgid=st.pgid,
        sid=st.sid,
        cgroup=Path(st.cgroup) if st.cgroup else None,
    )


def live_members(st: JobState) -> dict[int, Member]:
    """Return the members of the recorded run that are still running."""
    return alive(scan(target_of(st)))
