"""The records every layer of the launcher returns: the bottom of launcher/.

Operations and backends return these; ``render`` turns them into text and JSON; the
Python API hands them to programs. Nothing here imports any other launcher module, and
nothing here prints. A dict appears only where a JSON document is read or written:
``from_doc`` builders check every field against its annotation (supervisor/model/schema.py).
"""

from __future__ import annotations

import time

from trainctl.supervisor.gpu import PERSISTENCE_OFF, DriverInfo
from trainctl.supervisor.model.reports import (
    Cause,
    Failure,
    GpuHolder,
    GpuRelease,
    Guard,
    NamedProc,
    NodeStop,
    RestartEntry,
    SlurmStopReport,
    SlurmVerdict,
    StopReport,
    Survivor,
)
from trainctl.supervisor.model.sections import Adoption, CodeRecord
from trainctl.supervisor.model.state import Phase
from trainctl.supervisor.records import JsonObject, asdict, field, record

__all__ = [
    "Cause",
    "Checkpoint",
    "CheckpointInfo",
    "CheckpointSeen",
    "EndedAtOnce",
    "Failure",
    "Frame",
    "GpuInventory",
    "GpuRelease",
    "GpuRequest",
    "GpuView",
    "MemoryView",
    "NamedProc",
    "NodeStop",
    "PlannedProc",
    "Progress",
    "PsRow",
    "QueueView",
    "Queued",
    "RestartEntry",
    "Seen",
    "Skipped",
    "SlurmAgent",
    "SlurmStopReport",
    "SlurmVerdict",
    "SlurmView",
    "StackGroup",
    "StackReport",
    "StackThread",
    "StartResult",
    "Status",
    "StopPlan",
    "StopReport",
    "StopResult",
    "Survivor",
]


@record(frozen=True)
class Checkpoint:
    """A checkpoint file (or directory marker) on disk."""

    path: str
    mtime: float
    size: int
    step: float | None = None  # from its name, else the progress step when it was written
    why: str = ""  # what says it is complete (or not): "DCP .metadata", "size held", ...
    step_estimated: bool = False  # the step is the progress lookup's (shown with ≈)

    @property
    def age_s(self) -> float:
        """Seconds since it was written."""
        return max(0.0, time.time() - self.mtime)


# The states of a run that is over (as `status` names them): no live numbers for these.
ENDED_STATES = ("exited", "failed", "stopped", "lost")


@record()
class Progress:
    """What `status` says about training progress."""

    step: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    steps_per_s: float | None = None
    total_steps: int | None = None
    eta_s: float | None = None
    main_metric: str | None = None
    history: list[float] = field(default_factory=list)

    def to_doc(self) -> JsonObject:
        """Return the JSON form (numbers stay numbers)."""
        return asdict(self)


@record(frozen=True)
class PlannedProc:
    """One member, as `stop --dry-run` plans its stop."""

    pid: int
    ppid: int
    cmd: str
    role: str  # first | after parent | launcher: WHY (supervisor/tree/forest.py)
    gpu: bool = False  # has a GPU open (a GPU holder)


@record(frozen=True)
class StopPlan:
    """What `trainctl stop NAME` would do now; nothing is signalled to find it out."""

    name: str
    run: int
    state: str
    order: str  # tree | all | main
    signal: str  # the first signal
    grace_s: float
    kill_wait_s: float
    members: list[PlannedProc]
    first: list[int]  # signalled at once
    launchers: list[int]  # signalled once their workers are gone
    gpus: list[int]  # leased: the stop waits until they are released
    checkpoint_glob: str | None = None
    checkpoint: str | None = None  # the newest one, its path
    checkpoint_age_s: float | None = None
    queued: bool = False  # the job (or its next run) is queued: the stop dequeues it
    dooms: list[str] = field(default_factory=list)  # queued jobs after it that would fail
    # --at: what this job can do ("now", "checkpoint", "next-checkpoint"), and why not
    can_at: list[str] = field(default_factory=lambda: ["now"])
    cannot_at: dict[str, str] = field(default_factory=dict)
    checkpoint_step: float | None = None

    def to_doc(self) -> JsonObject:
        """The JSON form."""
        return asdict(self)


@record(frozen=True)
class Queued:
    """`start` put the job in the queue: its place, and what it waits for."""

    name: str
    position: int
    waits_for: list[str]
    waiter_pid: int | None
    state: str = "queued"

    def to_doc(self) -> JsonObject:
        """The JSON form."""
        return asdict(self)


@record(frozen=True)
class Dequeued:
    """`stop` took a queued run of the job out of the queue: nothing of it starts."""

    name: str
    run: int  # the run that never started
    live: bool  # the job also has a live run, which the stop goes on to stop

    def to_doc(self) -> JsonObject:
        """The JSON form (when it is all the stop did)."""
        return {"name": self.name, "run": self.run, "state": "dequeued", "ok": True}


@record(frozen=True)
class QueueView:
    """A queued job, as `status` shows it: its place and what it waits for."""

    position: int  # 1: the first queued in this home
    queued_at: float
    waits_for: list[str]  # in words: "GPUs 2 and 5 held by train", "after train:ok"
    gpus: str | None = None  # --gpus as asked
    after: list[str] = field(default_factory=list)  # "train:ok", ...
    singleton: str | None = None  # "name" or "spec"
    backfill: bool = False
    waiter_alive: bool = True  # False after a reboot: `trainctl queue resume`


@record(frozen=True)
class CheckpointSeen:
    """The newest checkpoint as `status` shows it."""

    path: str
    age_s: float
    size: int
    step: float | None = None  # the step it holds (its name, else progress when written)
    partial: str | None = None  # a newer checkpoint that is not complete (never resumed)
    partial_why: str | None = None  # what says so: "zip without its end record", ...
    step_estimated: bool = False  # ``step`` is the progress lookup's lower bound (≈)


@record(frozen=True)
class MemoryView:
    """The job's memory group now: use against its cap, and the OOM kills so far."""

    used_bytes: int | None = None
    max_bytes: int | None = None
    high_bytes: int | None = None
    oom_kills: int = 0


@record(frozen=True)
class CheckpointInfo:
    """What `stop` and `restart` saw of checkpoints before the first signal."""

    watched: bool = False  # the spec names a checkpoint glob
    newest: Checkpoint | None = None
    written: Checkpoint | None = None  # --checkpoint: the one the job wrote when asked

    def to_doc(self) -> JsonObject | None:
        """The JSON form (None when the job names no checkpoint glob)."""
        if not self.watched:
            return None
        doc: JsonObject = {"newest": None}
        if self.newest is not None:
            doc["newest"] = {"path": self.newest.path, "age_s": round(self.newest.age_s, 1)}
        if self.written is not None:
            doc["written"] = {"path": self.written.path, "size": self.written.size}
        return doc


@record(frozen=True)
class GpuRequest:
    """`--gpus SPEC [--share] [--force]`: a request string, or exact indices (restart)."""

    spec: str | list[int]
    share: bool = False
    force: bool = False
    asked: str | None = None  # a restart on fewer GPUs: the ones it grows back to (min_gpus)


@record(frozen=True)
class SlurmAgent:
    """One node agent of a Slurm job, as it last published itself."""

    node: str
    host: str | None
    rank: str | None
    members: int
    age_s: float
    stale: bool  # stopped publishing while the run is live
    stopped: bool  # published its stop report


@record(frozen=True)
class Seen:
    """A job's run as its backend sees it now."""

    phase: Phase
    exit_code: int | None
    mode: str  # how its processes are tracked: "cgroup", "signals" or "slurm"
    # the scheduler has ended the run or no longer knows it: nothing of it is scheduled
    ended: bool
    # members found on this host are the whole job (so an escape from its group is news)
    whole_job_here: bool = True
    # the scheduler's own view, for `status` (Slurm: state, reason, nodes, job id, agents)
    slurm: SlurmView | None = None
    # live processes counted by the backend where they run (Slurm: by the node agents);
    # None: count them here
    members: int | None = None
    # every live process, as the node agents published them (for `ps`); None: scan here
    processes: list[PsRow] | None = None


@record(frozen=True)
class SlurmView:
    """What Slurm and the node agents say about a Slurm job now."""

    job_id: str | None
    state: str
    reason: str | None = None
    nodes: str | None = None
    exit_code: int | None = None
    agents: list[SlurmAgent] = field(default_factory=list)


@record()
class StopResult:
    """The outcome of `trainctl stop`."""

    name: str
    run: int
    via: str  # "supervisor" | "direct" | "noop" | "slurm"
    report: StopReport | SlurmStopReport
    exit_code: int | None = None  # the job's main exit code, when known
    message: str = ""  # a no-op's one line
    warnings: list[str] = field(default_factory=list)  # one line each, for stderr

    @property
    def ok(self) -> bool:
        """True only when the report proves nothing of the job alive (fails closed)."""
        return self.report.ok

    @property
    def held_gpus(self) -> list[GpuRelease]:
        """The GPUs the stop could not prove released."""
        return [g for g in getattr(self.report, "gpus", []) if not g.ok]


@record(frozen=True)
class EndedAtOnce:
    """A run that ended within `start`'s first look (or by the end of `start -f`)."""

    name: str
    run: int
    state: str  # exited | failed | stopped | restarting
    cause: str
    exit_code: int | None
    failed: bool
    last_lines: list[str]


@record(frozen=True)
class StartResult:
    """A started run."""

    name: str
    run: int
    main_pid: int | None  # None: a scheduler (Slurm) starts main later, on its nodes
    mode: str
    log: str
    elapsed_s: float
    gpus: str | None = None  # the bound GPU indices, e.g. "0,3"
    slurm_job_id: str | None = None
    unit: str | None = None  # the run's systemd scope, on systemd hosts
    warnings: list[str] = field(default_factory=list)
    guard: Guard | None = None  # the checkpoint handed, its step, the kept copy, the floor
    from_scratch: bool = False  # `--from-scratch`: nothing handed, no guard


@record(frozen=True)
class JobSettings:
    """What the spec says about how the job runs and stops, for `status`."""

    grace_s: float
    stop_signal: str
    stop_order: str
    restart: str  # "never", or "on-failure (max 3, backoff 5s)"
    checkpoint: str | None = None  # the glob, relative to cwd
    checkpoint_matches: bool = False  # whether anything matches it yet
    tty: bool = False  # main runs on a terminal `trainctl attach` connects to


@record()
class Status:
    """What `trainctl status NAME` shows (and `--json` emits)."""

    name: str
    state: str
    run: int
    main_pid: int | None
    pgid: int | None
    supervisor_pid: int | None
    supervisor_alive: bool
    exit_code: int | None
    members: int
    escaped: int
    mode: str
    cgroup: str | None
    started_at: float
    ended_at: float | None
    uptime_s: float
    log: str
    last_log_line: str
    argv: list[str] = field(default_factory=list)
    cwd: str | None = None  # the job's working directory (spec), for shorter commands
    spec_file: str | None = None  # the spec file it was started from
    last_stop: StopReport | SlurmStopReport | None = None
    error: str | None = None
    previous_boot: bool = False  # recorded before the machine last booted
    unit: str | None = None  # the run's systemd scope
    gpus: list[int] = field(default_factory=list)
    gpu_labels: list[str] = field(default_factory=list)  # "3", or "0/1" for a MIG instance
    # "running on 3 of 4 GPUs (GPU 2 unhealthy since 03:12)": a run a GPU fault shrank
    gpus_note: str | None = None
    gpu_faults: list[str] = field(default_factory=list)  # Xid events, ECC errors, lost GPUs
    handed_off: list[str] = field(default_factory=list)  # work given to a foreign tmux
    mounts_not_kept: list[str] = field(default_factory=list)  # see supervisor/tree/mounts.py
    restarts: int = 0
    last_failure: Failure | None = None
    restart_in_s: float | None = None
    stalled_for_s: float | None = None
    stall_stacks: str | None = None  # the stacks read when the stall was first seen
    checkpoint: CheckpointSeen | None = None  # the newest one
    progress: Progress | None = None
    code_changed: list[str] = field(default_factory=list)
    probation: str | None = None  # a deploy holds the run to its probation: until when
    # state.json of a newer trainctl: what this one shows is what it knows of it
    newer: str | None = None
    stall_deadline_s: float | None = None  # stall_timeout = "auto": the learned deadline
    source: str | None = None  # the run executes from a snapshot of this directory
    never_ran: bool = False  # recorded, but nothing of it ever ran (a doomed dependent)
    code: CodeRecord | None = None  # the code the run started with (and where it runs from)
    spec_changed: list[str] = field(default_factory=list)  # spec file keys edited since start
    slurm: SlurmView | None = None  # Slurm backend: state, reason, nodes, job id, agents
    cause: Cause | None = None  # why the run ended (None while it runs)
    restart_history: list[RestartEntry] = field(default_factory=list)
    memory: MemoryView | None = None  # memory_max/memory_high jobs
    stop_since: float | None = None  # while a stop is on: when it began (epoch)
    grace_left_s: float | None = None  # ... and how much of its grace is left now
    stop_by: str | None = None  # ... and why it began ("stop", "restart", "SIGTERM", ...)
    settings: JobSettings | None = None  # how the job is set up to run and stop (spec)
    adopted: Adoption | None = None  # `adopt`: how, containment, log source, when
    # queued (state "queued"), or the next run queued behind a live one (--singleton)
    queue: QueueView | None = None
    guard: Guard | None = None  # the checkpoint guard: handed, kept aside, first step
    from_scratch: bool = False  # the run was started with --from-scratch
    rolled_back: str | None = None  # back on the code a deploy replaced: why

    def to_doc(self) -> JsonObject:
        """Return the JSON form."""
        return asdict(self)


@record(frozen=True)
class Frame:
    """One frame of a Python stack, innermost first in a list."""

    name: str
    filename: str
    line: int | None = None


@record(frozen=True)
class StackThread:
    """One thread whose stack a group holds: its process, rank and command."""

    pid: int
    thread: str  # its name, else its id
    cmd: str
    rank: str | None = None  # RANK / LOCAL_RANK from its environment, where set
    local_rank: str | None = None


@record()
class StackGroup:
    """Threads that stand at the very same stack (compared frame by frame)."""

    frames: list[Frame]
    threads: list[StackThread] = field(default_factory=list)


@record(frozen=True)
class Skipped:
    """A member whose stack could not be read, and why."""

    pid: int
    cmd: str
    why: str


@record()
class StackReport:
    """`trainctl stack NAME`: every Python stack of the job, grouped."""

    name: str
    run: int
    groups: list[StackGroup] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    elapsed_s: float = 0.0

    def to_doc(self) -> JsonObject:
        """Return the JSON form."""
        return asdict(self)


@record(frozen=True)
class PsRow:
    """One process of a job, for `trainctl ps`."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    cpu_percent: float
    rss_bytes: int
    escaped: bool
    nets: list[str]
    cmd: str
    depth: int
    gpu_holder: bool = False  # has a GPU open
    gpu_bytes: int | None = None  # its GPU memory, when the driver reports it
    stop_role: str = ""  # first | after parent | launcher: WHY (see supervisor/tree/forest.py)
    unit: str | None = None  # the run's systemd scope (the same for every row)
    node: str | None = None  # Slurm: the node it runs on, as its agent published it

    def to_doc(self) -> JsonObject:
        """Return the JSON form."""
        return asdict(self)


@record()
class GpuView:
    """One GPU (or MIG instance) as `trainctl gpus` shows it."""

    index: int
    name: str
    uuid: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_pct: int | None
    leased_by: str | None
    processes: list[GpuHolder] = field(default_factory=list)
    label: str = ""
    mig: int | None = None
    mig_mode: bool | None = None
    persistence: bool | None = None
    ecc_uncorrected: int | None = None
    error: str | None = None  # this GPU could not be read (lost, a failing call)
    unhealthy: str | None = None  # "unhealthy: Xid 79 at 03:12 (reboot needed)"
    # "last fault: Xid 13 at 03:12 (restart the application; no run held it)"
    last_fault: str | None = None

    def to_doc(self) -> JsonObject:
        """Return the JSON form (each process without its marker)."""
        doc = asdict(self)
        doc["processes"] = [p.to_view() for p in self.processes]
        return doc


@record()
class GpuInventory:
    """`trainctl gpus`: the driver, then every GPU."""

    driver: DriverInfo
    views: list[GpuView]

    @property
    def warnings(self) -> list[str]:
        """What the user should know: persistence mode off, a driver without calls."""
        off = [v.label for v in self.views if v.persistence is False]
        out = []
        if off:
            out.append(f"persistence mode is off on GPU(s) {', '.join(off)}: {PERSISTENCE_OFF}")
        if self.driver.note:
            out.append(self.driver.note)
        return out

    def to_doc(self) -> list[JsonObject]:
        """The JSON form of `gpus --json`: a GPU a row, each with the driver's versions."""
        versions: JsonObject = {
            "driver_version": self.driver.driver_version,
            "nvml_version": self.driver.nvml_version,
        }
        return [v.to_doc() | versions for v in self.views]
