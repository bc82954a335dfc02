"""The records of how a run ended and what a stop did and proved: a light module, read by
every reader.

The supervisor, the CLI's direct stop and a Slurm node agent write a :class:`StopReport`
(through :mod:`.terminate` and :mod:`.stop`); `status` and `stop` read one back from
state.json or a supervisor's reply with :meth:`StopReport.from_doc`, checked field by
field. Kept apart from the stop algorithm so that reading a report imports none of it.
"""

from __future__ import annotations

import signal
from typing import Any

from trainctl.supervisor.records import JsonObject, asdict, field, record

from .phases import Phase
from .schema import build_document


@record(frozen=True)
class Cause:
    """Why one run ended (state.json ``cause``; in status, list, wait, events, reports)."""

    kind: str
    summary: str  # one line for people
    exit_code: int | None = None
    signal: str | None = None  # e.g. "SIGKILL": what main died of
    signal_from: str | None = None  # "trainctl" (its stop's escalation) | "outside"
    by: str | None = None  # stopped: the verb, or "stall watchdog"
    reason: str | None = None  # from the job: its exception, or a matched log line
    reason_class: str | None = None  # the pattern class of the reason
    rank: int | None = None  # the failing rank, where the job says
    source: str | None = None  # where the reason came from: torchelastic | log
    at: float | None = None  # when the job recorded its failure (torchelastic)
    oom_pid: int | None = None
    oom_cmd: str | None = None
    oom_kills: int | None = None
    cap_bytes: int | None = None  # the memory cap in force, if any
    restarts: int | None = None  # restarts-exhausted / crash-loop: how many were made
    last: str | None = None  # ... and the final run's own cause, as a line
    leftovers: int | None = None  # processes that outlived main, stopped by the cleanup
    gpu: str | None = None  # a GPU fault during the run (an Xid, ECC errors): why it died

    def to_doc(self) -> JsonObject:
        """The JSON form (state.json, events, --json)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@record(frozen=True)
class Failure:
    """The run whose failure the restart policy answered (state.json ``last_failure``)."""

    run: int | None = None
    exit_code: int | None = None
    at: float | None = None
    reason: str | None = None  # why its stop ran: main exited | stalled
    cause: Cause | None = None

    def to_doc(self) -> JsonObject:
        """The JSON form (events, the handover to the next run's supervisor)."""
        doc = asdict(self)
        doc["cause"] = None if self.cause is None else self.cause.to_doc()
        return doc


@record(frozen=True)
class RestartEntry:
    """One automatic restart: the run that failed, when, and why (state.json history)."""

    run: int | None = None
    at: float | None = None
    cause: str | None = None  # the failed run's cause, as a line
    kind: str | None = None
    matched: str | None = None  # the restart_on entry it met
    ckpt_step: float | None = None  # the newest complete checkpoint's step when it failed
    resumed_from: str | None = None  # the checkpoint the failed run was handed
    resumed_step: float | None = None  # ... and its step (a rewritten-in-place file keeps
    # its path: "failed right after resuming from it" is judged by step, not by path)


# the reason of the stop the checkpoint guard sends (lifecycle, tree/stop.py)
STARTED_OVER = "started over"


@record(frozen=True)
class Guard:
    """The checkpoint guard of one run (supervisor/watch/guard.py): the job's checkpoint
    high-water mark when the run started, the step its first report must reach, and the
    copy kept aside in case it starts over anyway (state.json ``guard``)."""

    path: str  # the newest complete checkpoint when the run started (the high-water mark)
    mtime: float  # ... its identity then: a later change is a new save, or an overwrite
    size: int
    step: float | None = None  # its step (None: unknown, the guard is not armed)
    estimated: bool = False  # the step is the timed log's, not the trainer's own record
    floor: float | None = None  # the run's first reported step must be at least this
    handed: str | None = None  # what $TRAINCTL_RESUME_FROM named
    handed_step: float | None = None  # ... and its step
    kept: str | None = None  # the copy kept aside (put back if the run overwrote the file)
    kept_how: str | None = None  # reflink | link | copy
    not_kept: str | None = None  # why no copy was kept
    first_step: float | None = None  # the run's first reported step, once seen
    tripped: str | None = None  # the guard stopped the run: why, in a line

    def step_text(self) -> str:
        """``step 1050``, or ``step ≈1050`` when the step is the log's estimate."""
        if self.step is None:
            return "an unknown step"
        return f"step {'≈' if self.estimated else ''}{self.step:g}"


GATE = "gate"
PROBATION = "probation"


@record(frozen=True)
class Trial:
    """What a deploy's new run is held to, and where it stands (state.json ``trial``).

    Written by the deployer before the new code starts (``ID.trial.json``); claimed by
    the new run's supervisor, which then judges it: the gate (a step past its first one,
    or a checkpoint, within ``health_s``), then the probation (no crash or stall until its
    first complete checkpoint, at most ``probation_s``)."""

    id: str
    name: str
    from_run: int
    health_s: float
    probation_s: float
    resume_tolerance: float = 2.0
    rollback: bool = False  # --rollback auto and the previous run's snapshot is there
    no_rollback_why: str | None = None
    from_commit: str | None = None
    to_commit: str | None = None
    checkpoint: str | None = None  # the checkpoint handed to the new code
    checkpoint_step: float | None = None
    checkpoint_mtime: float | None = None
    checkpoint_size: int = 0
    cwd: str = ""  # where the checkpoint glob is read: the replaced run's folder
    checkpoint_glob: str | None = None
    kept: str | None = None  # the deploy's own copy of it (keepsafe.keep)
    started_at: float = 0.0  # when the deploy began
    run: int | None = None  # the run that claimed it (the new code's first run)
    stage: str = GATE  # gate | probation (a trial that passed leaves the state)
    since: float = 0.0  # when the stage began
    until: float = 0.0  # when it ends by itself (the gate fails, the probation passes)
    first_step: float | None = None  # the new run's first reported step

    def behind(self, step: float, what: str) -> str | None:
        """Why the new run did not resume (``step`` is behind the handed checkpoint's
        beyond the tolerance); None when it is not, or the handed step is unknown."""
        ck = self.checkpoint_step
        if ck is None or step >= ck - self.resume_tolerance:
            return None
        given = f"the checkpoint it was given is at step {ck:g}"
        return f"did not resume: {what} step {step:g}, {given}"


def signal_name(num: int) -> str:
    """``9`` -> ``SIGKILL`` (``signal 77`` for numbers without a name)."""
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


@record(frozen=True)
class NamedProc:
    """A process a report names: its pid and command (and, for the stop signal, when)."""

    pid: int
    cmd: str = ""
    at_s: float | None = None  # the stop signal, seconds after the stop began
    exit_s: float | None = None  # its exit, seconds after its signal (None: not seen gone)
    killed: bool = False  # it needed SIGKILL
    why: str | None = None  # a launcher: why it was taken for one


@record(frozen=True)
class Survivor:
    """A process that outlived the stop: enough to see why (state, wchan, owner)."""

    pid: int
    state: str = "?"
    wchan: str | None = None
    cmd: str = ""
    why: str | None = None


@record(frozen=True)
class Zombie:
    """A member that has exited and waits for its parent to reap it (harmless)."""

    pid: int
    ppid: int = 0


@record()
class GpuHolder:
    """A process on a GPU: from NVML's list, the fd scan, or both."""

    pid: int
    used_bytes: int | None = None  # its GPU memory, when the driver reports it
    seen: str = "fd"  # fd | nvml+fd | nvml (why it is not confirmed)
    marker: str | None = None  # its TRAINCTL_JOB, read only for a confirmed local process
    cmd: str | None = None  # None: never read (NVML could not confirm the process here)
    owner: str | None = None  # whose it is, as the reader classified it

    def to_view(self) -> JsonObject:
        """The JSON form `trainctl gpus` shows: no marker, no command it never read."""
        doc: JsonObject = {"pid": self.pid, "used_bytes": self.used_bytes, "seen": self.seen}
        if self.cmd is not None:
            doc["cmd"] = self.cmd
        doc["owner"] = self.owner
        return doc


@record()
class GpuRelease:
    """The proof (or disproof) that one leased GPU was released by a stop.

    ``ok`` defaults to False: a record that does not say the GPU is free does not prove it.
    """

    index: int
    ok: bool = False
    uuid: str | None = None
    mig: int | None = None  # a MIG instance of GPU ``index``
    used_bytes: int | None = None
    baseline_bytes: int | None = None
    released_bytes: int | None = None
    excess_bytes: int | None = None  # above the baseline, when held
    seconds: float | None = None  # until it was seen released
    error: str | None = None  # why it could not be checked at all: not verified
    note: str | None = None
    job_holders: list[GpuHolder] = field(default_factory=list)
    holders: list[GpuHolder] = field(default_factory=list)  # everyone on it, when held

    @property
    def label(self) -> str:
        """Return ``3``, or ``3/1`` for MIG device 1 of GPU 3."""
        return f"{self.index}" if self.mig is None else f"{self.index}/{self.mig}"


@record()
class StopReport:
    """What a stop did and proved; rendered by the CLI and kept in state.json."""

    # empty in the short report of a stop that found nothing to do (already_stopped)
    signal: str = ""
    grace_s: float = 0.0
    order: str = ""
    mode: str = ""
    found: int = 0
    held: int = 0  # members the supervisor already held by pidfd when the stop began
    by_net: dict[str, int] = field(default_factory=dict)
    escaped: int = 0
    late_joiners: int = 0
    signalled: int = 0  # members that got the stop signal
    exited_on_signal: int = 0  # ... and exited on it within the grace
    exited_unsignalled: int = 0  # exited within the grace without it (a parent shut them down)
    exit_s: dict[str, float] = field(default_factory=dict)  # signal -> exit: first/median/last
    killed: int = 0
    launchers: list[NamedProc] = field(default_factory=list)  # pid, cmd, why
    # per process, up to REPORT_NAMED each: pid, cmd, at_s (since the stop began), exit_s
    sent: list[NamedProc] = field(default_factory=list)
    # the members that left without a signal of the stop's (a rank's loaders, shut down by
    # it), each with when it was seen gone (at_s), up to REPORT_NAMED
    unsignalled: list[NamedProc] = field(default_factory=list)
    killed_procs: list[NamedProc] = field(default_factory=list)  # pid, cmd
    survivors: list[Survivor] = field(default_factory=list)
    zombies: list[Zombie] = field(default_factory=list)
    total_s: float = 0.0
    gone_s: float | None = None  # from the stop's start until its last member was seen gone
    ok: bool = False
    already_stopped: bool = False
    gpus: list[GpuRelease] = field(default_factory=list)  # the release proof, per GPU
    reason: str = "stop"  # stop | main exited | stalled
    persist_error: str | None = None  # the stop happened, but could not be recorded
    stacks: str | None = None  # where the stacks of what outlived the grace were written
    cause: Cause | None = None  # why the run ended (supervisor/life/causes.py)
    # what this stop could not check, when it cannot prove that nothing of the job is left
    # (no cgroup and no supervisor: an escaper that shed every net since the last
    # snapshot cannot be found). ``ok`` then means "all that was found is gone".
    unproven: str | None = None
    # how long the stop waited, before its first signal, for a checkpoint being written to
    # be whole (tree/stop.py: await_save); None when no save was under way
    save_waited_s: float | None = None

    def to_doc(self) -> JsonObject:
        """Return the JSON form."""
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: Any, where: str) -> StopReport:
        """Read a report back (state.json, a supervisor's reply), checked field by field."""
        return build_document(cls, doc, where)

    @property
    def held_gpus(self) -> list[GpuRelease]:
        """The GPUs this stop found still held (not those it could not check)."""
        return [g for g in self.gpus if not g.ok and g.error is None]

    def held_line(self) -> str | None:
        """The GPUs this stop found still held, each with what holds it (None: none)."""
        parts = []
        for g in self.held_gpus:
            who = ", ".join(
                f"pid {h.pid}" + (f" ({h.cmd[:40]})" if h.cmd else "") for h in g.holders
            )
            gib = f"{(g.excess_bytes or 0) / (1 << 30):.1f} GiB" if g.excess_bytes else "memory"
            parts.append(f"GPU {g.label} still holds {gib}" + (f": {who}" if who else ""))
        return "; ".join(parts) or None

    @property
    def unverified_gpus(self) -> list[GpuRelease]:
        """The GPUs whose release could not be checked (the driver could not say)."""
        return [g for g in self.gpus if not g.ok and g.error is not None]

    def verdict(self) -> str:
        """What the stop proved, in words (`stop`, `attach`, the web page's timeline)."""
        if self.survivors:
            return f"{len(self.survivors)} process(es) SURVIVED"
        if self.unproven:
            return f"all it found is gone, NOT PROVEN complete: {self.unproven}"
        held = [g.label for g in self.held_gpus]
        if held:
            return f"nothing of the job is alive, but GPU(s) {', '.join(held)} NOT released"
        unverified = [g.label for g in self.unverified_gpus]
        if unverified:
            return (
                f"nothing of the job is alive; GPU(s) {', '.join(unverified)} not verified "
                "(the driver could not say)"
            )
        return "nothing of the job is alive" + (", GPUs released" if self.gpus else "")


@record()
class NodeStop:
    """How one node of a Slurm job was proven stopped (or not)."""

    node: str
    ok: bool = False
    found: int | None = None
    killed: int | None = None
    survivors: list[Survivor] = field(default_factory=list)
    by: str | None = None  # its agent, a sweep job, or this host's sweep


@record(frozen=True)
class SlurmVerdict:
    """Slurm's answer about one job: its state, why, where, and how it ended."""

    state: str
    phase: Phase
    reason: str | None = None
    nodes: str | None = None
    exit_code: int | None = None


@record()
class SlurmStopReport:
    """What a stop of a Slurm job did: the node agents' stops, Slurm's verdict, sweeps."""

    slurm: SlurmVerdict
    signal: str = ""
    grace_s: float = 0.0
    nodes: list[NodeStop] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    cancelled_after_grace: bool = False
    local_leftovers: int = 0
    sweep_jobs: list[str] = field(default_factory=list)
    survivors: list[Survivor] = field(default_factory=list)
    total_s: float = 0.0
    ok: bool = False  # fails closed: only a report that proves the job gone says True
    already_stopped: bool = False
    mode: str = "slurm"
    reason: str = "stop"
    killed: int = 0  # the verdict line of `status` reads it from every kind of report
    killed_procs: list[NamedProc] = field(default_factory=list)

    def to_doc(self) -> JsonObject:
        """Return the JSON form."""
        return asdict(self)


@record(frozen=True)
class MembersReply:
    """The supervisor's answer to ``{"op": "members"}`` (control.py): the run's live
    processes now, and how many of them left main's tree. What `status` shows; early.py
    asks it while the CLI imports the rest, so a big job is not read process by process
    again. Here, not in control.py, so that `status` reads it without the socket module."""

    ok: bool = True
    members: int = 0
    escaped: int = 0

    def to_doc(self) -> JsonObject:
        """The reply on the wire."""
        return asdict(self)
