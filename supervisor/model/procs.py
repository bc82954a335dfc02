"""A process as trainctl names it, and the marks in a job's environment.

A member is known by its pid *and* its start time (ProcRef): a recycled pid is never
taken for it. The environment names below are what trainctl sets in every job (and in
its own helpers, which no membership net may take for members). Low in the layers: the
process tree (tree/proctree.py) needs these, not the whole state file.
"""

from __future__ import annotations

from trainctl.supervisor.linux import procfs
from trainctl.supervisor.records import record

# Set by trainctl in every job's environment (DESIGN.md "Job environment"); never user-set.
TRAINCTL_VARS = (
    "TRAINCTL_JOB", "TRAINCTL_NAME", "TRAINCTL_RUN", "TRAINCTL_PROGRESS", "TRAINCTL_NODE",
    "TRAINCTL_GPU_COUNT",
)  # fmt: skip
# How many GPUs the run has (CUDA_VISIBLE_DEVICES's count): a process count can follow it.
GPU_COUNT_VAR = "TRAINCTL_GPU_COUNT"
# Set by a Slurm node agent to its node's name: what it stops is its own node's.
NODE_VAR = "TRAINCTL_NODE"
# Set by `--host` on the remote side for one call; never part of a job's environment.
TRANSPORT_VARS = ("TCV", "TRAINCTL_CLIENT_VERSION")
# In the environment of the supervisor's own helpers (hook runners, py-spy), set to the
# run's marker: no membership net takes them for members of the job (proctree.py).
HELPER_VAR = "TRAINCTL_HELPER"
# torchrun writes the first failing worker's exception to this file (see causes.py)
ERROR_FILE_VAR = "TORCHELASTIC_ERROR_FILE"


@record(frozen=True, compiled=True)
class ProcRef:
    """A process as trainctl trusts it: pid plus start time (clock ticks since boot)."""

    pid: int
    start_ticks: int


@record(frozen=True, compiled=True)
class MemberSnap:
    """One member of the job's process tree as last seen."""

    pid: int
    start_ticks: int
    ppid: int
    pgid: int
    sid: int
    cmd: str
    nets: tuple[str, ...]

    @classmethod
    def of(cls, st: procfs.Stat, nets: tuple[str, ...]) -> MemberSnap:
        """The member as a snapshot records it, from its stat (command cut to 300)."""
        cmd = procfs.read_cmdline(st.pid)[:300]
        return cls(st.pid, st.start_ticks, st.ppid, st.pgid, st.sid, cmd, nets)
