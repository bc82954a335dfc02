"""The records of the verbs off the status and stop paths: `restart`'s health window,
`adopt`'s plan and result, `doctor`'s checks.

In the records layer with the rest of ``results`` (they import nothing of the launcher
above them), but in a module of their own: `status` and `stop` import ``results``
alone, and each record defined there costs their start-up (issue 34 §4).
"""

from __future__ import annotations

from typing import Any

from trainctl.supervisor.model.reports import Cause
from trainctl.supervisor.model.sections import Adoption, CodeRecord
from trainctl.supervisor.model.state import JobState, MemberSnap
from trainctl.supervisor.records import JsonObject, asdict, field, record


@record(frozen=True)
class Check:
    """One line of the report: what was looked at, what was found, and whether it is fine."""

    name: str
    value: str
    ok: bool
    hint: str = ""


@record(frozen=True)
class Health:
    """What the new run did in its first seconds: ``died`` with its cause, or it lives."""

    window_s: float
    died: bool = False
    cause: Cause | None = None
    last_lines: list[str] = field(default_factory=list)
    superseded_by: int | None = None  # another restart (or start) replaced it: that run

    @property
    def ok(self) -> bool:
        """Alive at the end of the window, ended cleanly within it, or ended by trainctl
        (another restart replaced it, a user stopped it): none of which is a failure."""
        if not self.died or self.superseded_by is not None:
            return True
        return self.cause is not None and self.cause.kind in ("clean", "stopped")


# One process to adopt: its identity (pid + start time), parent, group, session, command,
# and how it was found ("root", "session", "descendant"; a lost job's: its nets), the
# same record as a member of the job's snapshot.
Found = MemberSnap


@record(frozen=True)
class Plan:
    """What `adopt` would take over, before anything is changed."""

    how: str  # "--pid 123", "--tmux train:0"
    main: Found  # the oldest root: the run's main process (session leader where taken)
    members: list[Found]
    pgid: int | None  # recorded only when the whole process group is adopted
    sid: int | None  # ... and the whole session
    log_source: str | None  # a regular file behind main's stdout, read from adoption on
    panes: list[str] = field(default_factory=list)  # tmux pane ids, for pipe-pane
    tmux: list[str] = field(default_factory=list)  # the tmux command (socket) for them

    def to_doc(self) -> dict[str, object]:
        """The JSON form (`adopt --json`, `--dry-run`)."""
        return {
            "how": self.how,
            "main": self.main.pid,
            "members": [
                {"pid": m.pid, "ppid": m.ppid, "cmd": m.cmd, "how": "+".join(m.nets)}
                for m in self.members
            ],
            "process_group": self.pgid,
            "session": self.sid,
            "log_source": self.log_source,
            "panes": self.panes,
        }


@record(frozen=True)
class AdoptResult:
    """What `adopt` did: the run, its main, how many members, whether it is contained."""

    name: str
    run: int
    main_pid: int
    members: int
    mode: str
    contained: bool
    containment: str  # in words: contained (by whom), or not and why
    log_from: str | None  # where the run's log is copied from (None: nothing to copy)

    @classmethod
    def of(cls, st: JobState, plan: Plan, mode: str, log_from: str | None) -> AdoptResult:
        """The result, read back from the state the new supervisor wrote."""
        a = st.adopted or Adoption()
        return cls(
            st.name, st.run, plan.main.pid, len(plan.members), mode,
            a.contained, a.containment(), log_from,
        )  # fmt: skip

    def to_doc(self) -> dict[str, object]:
        """The JSON form."""
        return asdict(self)


@record(frozen=True)
class RestartPlan:
    """What `restart` would do (`--dry-run`): stop run N, start run N+1 handed this
    checkpoint, kept aside so, guarded by this floor. Nothing is touched."""

    name: str
    run: int
    state: str
    checkpoint_glob: str | None = None
    checkpoint: str | None = None  # the newest complete checkpoint: the one handed
    checkpoint_step: float | None = None
    step_estimated: bool = False  # the step is the timed log's estimate
    keep: str | None = None  # how it would be kept aside: reflink or copy, link, or why not
    floor: float | None = None  # the new run's first step must reach this (None: no guard)
    from_scratch: bool = False
    warning: str | None = None  # the command line says it starts over: the guard would trip


@record(frozen=True)
class CodeCheck:
    """What a deploy's look at the new code found before anything stopped
    (launcher/codecheck.py): problems refuse the deploy; ``unchecked`` says what it
    could not look at, and why."""

    python: str | None = None  # the job's interpreter that looked
    version: str = ""
    entry: str | None = None  # the script or module the job's command runs
    files: int = 0  # the job's Python files compiled
    imports: int = 0  # module-level imports placed
    problems: list[str] = field(default_factory=list)
    unchecked: str | None = None


@record(frozen=True)
class DeployPlan:
    """What `deploy` will do, decided and checked before anything is touched."""

    id: str  # this deploy's own id (its files under <job>/deploys/)
    name: str
    from_run: int
    from_code: CodeRecord | None
    to_code: CodeRecord | None
    changes: list[str]  # what changed, in words (drift's lines)
    at: str  # "checkpoint" (ask by signal, wait) | "next-checkpoint" (the trainer's own) | "now"
    checkpoint_glob: str | None = None
    checkpoint_signal: str = "SIGUSR2"
    newest_checkpoint: str | None = None
    newest_age_s: float | None = None
    checkpoint_timeout_s: float = 300.0
    main_pid: int | None = None
    members: int = 0
    gpus: list[str] = field(default_factory=list)
    health_s: float = 600.0  # the gate's limit
    rollback: str = "auto"  # auto | never
    rollback_to: str | None = None  # the previous run's snapshot (None: no way back)
    no_rollback_why: str | None = None
    snapshot: str = "none"
    reload: bool = False
    grace_s: float | None = None
    newest_step: float | None = None  # the newest complete checkpoint's step, now
    resume_tolerance: float = 2.0  # the gate: first step >= the checkpoint's step - this
    probation_s: float = 1800.0  # after the gate: until the first checkpoint, at most this
    keep_max: int = 4 << 30  # the handed checkpoint is kept aside up to this size
    can_at: list[str] = field(default_factory=lambda: ["now"])
    code_check: CodeCheck | None = None  # None: --no-check

    def to_doc(self) -> JsonObject:
        """The JSON form (`deploy --dry-run --json`, the plan file)."""
        return asdict(self)


@record(frozen=True)
class HistoryRow:
    """One run of a job, for `trainctl history`."""

    run: int
    started_at: float | None = None
    ended_at: float | None = None
    duration_s: float | None = None
    code: str | None = None  # the commit (or the entry script's hash), dirty, snapshot
    commit: str | None = None
    dirty: bool | None = None
    snapshot: str | None = None
    phase: str | None = None  # how it ended (None: it runs)
    cause: str | None = None
    steps: float | None = None  # the newest step it reported
    checkpoint: str | None = None  # the checkpoint a deploy took at its end
    marks: list[str] = field(default_factory=list)  # "deploy 3f2a9c1e -> 9b1c...", "rollback"

    def to_doc(self) -> JsonObject:
        """The JSON form."""
        return asdict(self)


@record(frozen=True)
class HostAnswer:
    """One host's answer to a verb run over every host of hosts.toml (`--all-hosts`)."""

    host: str
    doc: Any = None  # the verb's --json document (None: the host did not answer)
    error: str | None = None  # why not, in one line: unreachable, auth, no trainctl, ...
    seconds: float = 0.0

    def to_doc(self) -> JsonObject:
        """The JSON form."""
        return asdict(self)


@record(frozen=True)
class ProgressPoint:
    """One progress report of a run, as the trainer wrote it (every line, not a sample):
    its step, its time when it said one, and its other numbers (loss, lr, ...)."""

    run: int
    step: float
    t: float | None
    values: dict[str, float]


@record(frozen=True)
class CheckpointFile:
    """One checkpoint on disk, for the job page's time axis."""

    path: str
    at: float  # its mtime
    size: int


@record(frozen=True)
class TimelineEntry:
    """One moment of a stop: seconds after its request, what happened, to whom."""

    at_s: float
    kind: str  # request | signal | exit | kill | gone | gpu | verdict
    text: str
    pid: int | None = None


@record(frozen=True)
class StopTimeline:
    """A stop, second by second: the request, each signal and exit, the SIGKILLs, the GPUs'
    release, the verdict (from the stop report and the run's events)."""

    name: str
    run: int
    started_at: float | None
    total_s: float
    ok: bool
    verdict: str
    entries: list[TimelineEntry] = field(default_factory=list)

    def to_doc(self) -> JsonObject:
        """The JSON form."""
        return asdict(self)


@record(frozen=True)
class LogTail:
    """The end of a run's log from an offset on (the web page's tail that follows)."""

    log: str
    offset: int  # where the next read starts
    lines: list[str] = field(default_factory=list)
    # the last line while it has no newline yet (a progress bar's latest frame): shown in
    # place, each look, until the line ends and comes in `lines`
    partial: str = ""


@record(frozen=True)
class Interruption:
    """One end of a run that cost time: when, why, and what it cost."""

    run: int
    at: float
    cause: str
    lost_s: float  # the steps redone, the time down, the next run's restore
    steps_lost: float
    # where its time went, from the run's last step to the next run's first (None: not
    # known, e.g. no progress): each part's seconds; detect + stop + down + restore from
    # the last step, plus the steps redone (redo), is what the interruption cost
    parts: InterruptionParts | None = None


@record(frozen=True)
class InterruptionParts:
    """One interruption, part by part (seconds): ``detect``, the last step to the first
    move (main's exit, the stall watchdog's mark, a stop's start; 0 when the job stepped
    on after it; for a stall, the quiet it saw); ``stop``, that (or the last step) to the
    run's recorded end (the job's exit on the signal, the stop, the release proof, the
    cleanup); ``down``, that to the start of the next run that stepped (the restart's
    backoff, ``backoff`` of it, and its launch; a run between that never stepped, a
    deploy's code that failed at import, with its rollback's launch); ``restore``, that to
    its first step (interpreter, imports, rendezvous, checkpoint load); ``redo``, the
    steps done again (at the typical step time)."""

    detect: float
    stop: float
    down: float
    backoff: float
    restore: float
    redo: float


@record(frozen=True)
class Goodput:
    """`trainctl report NAME`: productive time against wall time, and the lost time by
    bucket (launcher/ops/goodput.py says how each is measured)."""

    name: str
    wall_s: float
    productive_s: float | None  # None: the job reports no progress
    goodput: float | None  # productive_s / wall_s, 0-1
    lost_s: dict[str, float]
    steps_lost: float | None
    interruptions: list[Interruption]
    runs: int
    typical_step_s: float | None = None
    needs_progress: list[str] = field(default_factory=list)  # figures that need progress
    running: bool = False
    # the time between a stop you asked for and the next start: its own line, outside the
    # goodput's denominator (wall_s counts it; goodput is productive / (wall - this))
    stopped_s: float = 0.0

    def to_doc(self) -> JsonObject:
        """The JSON form (`report --json`, MCP)."""
        return asdict(self)
