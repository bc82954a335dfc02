"""Status of one job and of every job. Import-light: `status` must stay fast."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from trainctl.launcher import backends, early
from trainctl.launcher.checkpoint import checkpoint_view
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import human_duration
from trainctl.launcher.progress import read_progress
from trainctl.launcher.results import (
    ENDED_STATES,
    Cause,
    CheckpointSeen,
    JobSettings,
    MemoryView,
    Progress,
    Status,
)
from trainctl.supervisor.errors import ConfigError, JobNotFoundError, StateError
from trainctl.supervisor.linux import memory
from trainctl.supervisor.model import layout, state
from trainctl.supervisor.model.reports import GATE, MembersReply
from trainctl.supervisor.model.schema import build_document
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import JobState, Phase
from trainctl.supervisor.model.tail import last_line
from trainctl.supervisor.records import field, record, replace
from trainctl.supervisor.tree import mounts
from trainctl.supervisor.tree.proctree import scan_counted, target_of

from .jobs import existing_job, stop_under_way

if TYPE_CHECKING:
    from trainctl.supervisor.tree.proctree import Member

    from .queue import Queued

RUNNING_PHASES = frozenset({Phase.STARTING, Phase.RUNNING, Phase.STOPPING})


def status_exit_code(s: Status) -> int:
    """0 while the run is live, 3 once it has ended, 4 when its supervisor is lost."""
    if s.state == Phase.LOST:
        return ExitCode.STATE_UNKNOWN
    return ExitCode.OK if s.state in RUNNING_PHASES or s.state == "queued" else ExitCode.NOT_RUNNING


def _gpus_note(home: Path, spec: Spec | None, st: JobState) -> str | None:
    """A run on fewer GPUs than its job was given (a GPU fault and ``min_gpus``): which
    are missing and why; one healthy again says how to grow the run back."""
    if spec is None or not st.gpus:
        return None
    asked = [t for t in (spec.gpu.asked or spec.gpu.indices or "").split(",") if t]
    have = {g.token for g in st.gpus}
    missing = [t for t in asked if t not in have]
    if not missing:
        return None
    from trainctl.supervisor.gpu import health  # noqa: PLC0415  (a run short of its GPUs only)

    sick = health.unhealthy(home)
    why = []
    for t in missing:
        bad = sick.get(int(t)) if t.isdigit() else None
        when = time.strftime("%H:%M", time.localtime(bad.at)) if bad else ""
        why.append(
            f"GPU {t} unhealthy since {when}"
            if bad
            else f"GPU {t} left out, healthy now: `trainctl restart {spec.name}` grows the run back"
        )
    verb = "running on" if not st.phase.ended else "ran on"
    return f"{verb} {len(have)} of {len(asked)} GPUs ({'; '.join(why)})"


def job_status(home: Path, name: str, *, brief: bool = False) -> Status:
    """Return the status of a job, with a live member count.

    ``brief`` (the `list` table): without what comes from the spec (argv, cwd) and the
    training view (checkpoint, progress, drift), which the table does not show.
    """
    queued = _queued(home, name)
    try:
        jdir = existing_job(home, name)
    except JobNotFoundError:
        if queued is None:
            raise
        return queued_status(queued)
    st = state.read_state(jdir)
    if queued is not None and st.phase.ended:
        return queued_status(queued)  # its next run is queued: that is what it is now
    spec: Spec | None = None
    if not brief:
        with contextlib.suppress(StateError, JobNotFoundError):
            spec = state.read_spec(jdir)
    seen = backends.of(st).seen(jdir, st)
    st = replace(st, exit_code=seen.exit_code)
    phase = seen.phase
    sup_alive = phase.live
    # cgroup.procs is cheap and complete unless root moved a process out; `status` counts
    # by it (scan_counted), while `ps` and `stop` walk every net.
    last = st.last_stop
    counted = _counted_by_supervisor(jdir) if sup_alive and seen.members is None else None
    members = (
        scan_counted(target_of(st))  # the nets of 241 members: only when counted here
        if counted is None
        and seen.members is None
        and (not phase.ended or last is None or not last.ok)
        else {}
    )
    live = [m for m in members.values() if m.alive]
    if counted is not None:
        seen = replace(seen, members=counted.members)
    now = time.time()
    end = st.ended_at or now
    log = state.log_path(jdir, st.run)
    training = _training_view(jdir, st, spec, live=not phase.ended)
    going = stop_under_way(jdir) if phase == Phase.STOPPING else None
    return Status(
        name=st.name,
        state=str(phase),
        run=st.run,
        main_pid=st.main.pid if st.main else None,
        pgid=st.pgid,
        supervisor_pid=st.supervisor.pid if st.supervisor else None,
        supervisor_alive=sup_alive,
        exit_code=st.exit_code,
        members=len(live) if seen.members is None else seen.members,
        escaped=_escaped(live, counted) if seen.whole_job_here else 0,
        mode=seen.mode,
        cgroup=st.cgroup,
        started_at=st.started_at,
        ended_at=st.ended_at,
        uptime_s=round(end - st.started_at, 3),
        log=str(log),
        last_log_line=last_line(log),
        argv=list(spec.argv) if spec else [],
        cwd=spec.cwd if spec else None,
        source=spec.source if spec else None,
        spec_file=spec.spec_file if spec else None,
        last_stop=last,
        error=st.error,
        previous_boot=st.from_other_boot(),
        unit=st.unit,
        gpus=[g.index for g in st.gpus],
        gpu_labels=[g.label for g in st.gpus],
        gpus_note=_gpus_note(home, spec, st),
        gpu_faults=list(st.gpu_faults),
        handed_off=list(st.handed_off),
        mounts_not_kept=_mounts_not_kept(home, jdir, st, spec, live=sup_alive),
        restarts=st.restarts,
        last_failure=st.last_failure,
        restart_in_s=None if st.restart_at is None else round(max(0.0, st.restart_at - now), 1),
        stalled_for_s=None if st.stalled_since is None else round(now - st.stalled_since, 1),
        stall_stacks=_stall_stacks(jdir, st),
        stall_deadline_s=st.stall_deadline_s,
        slurm=seen.slurm,
        checkpoint=training.checkpoint,
        progress=training.progress,
        code_changed=training.code_changed,
        probation=_probation(st),
        newer=state.newer_line("state", st.schema) if st.schema > state.SCHEMA else None,
        code=st.code,
        never_ran=st.main is None and st.supervisor is None and phase.ended,
        spec_changed=training.spec_changed,
        cause=cause_of(st, phase),
        restart_history=list(st.restart_history[-10:]),
        memory=_memory_view(st, spec, live=not phase.ended),
        stop_since=going.since if going else None,
        grace_left_s=round(max(0.0, going.grace_left_s), 1) if going else None,
        stop_by=going.reason if going else None,
        settings=None if spec is None else _settings(spec, training.checkpoint is not None),
        adopted=st.adopted,
        queue=None if queued is None else queued.view,
        guard=st.guard,
        from_scratch=st.from_scratch,
        rolled_back=st.rolled_back,
    )


def _queued(home: Path, name: str) -> Queued | None:
    """The job's queue entry, if a next run of it is queued. Without one (the common
    case) one lstat says so: the queue's policy loads the GPU code and threads."""
    if not os.path.lexists(layout.queue_entry(str(home), name)):
        return None
    from . import queue  # noqa: PLC0415  (its policy: the GPU code, threads; a queued job only)

    entry = queue.read_entry(home, name)
    return None if entry is None else queue.queued_of(home, entry)


def _counted_by_supervisor(jdir: Path) -> MembersReply | None:
    """The live supervisor's count of the members, asked before the imports (early.py);
    None when it was not asked or did not answer in time, or answered what is not a count."""
    raw = early.members_answer(str(jdir))
    if raw is None:
        return None
    try:
        reply = build_document(MembersReply, json.loads(raw), "the supervisor's members reply")
    except (StateError, ValueError):
        return None  # an older supervisor ("unknown op"), or a reply not to trust: count
    return reply if reply.ok else None


def _escaped(live: list[Member], counted: MembersReply | None) -> int:
    return counted.escaped if counted is not None else sum(1 for m in live if m.escaped)


def queued_status(q: Queued) -> Status:
    """A queued job: no run yet, only its place in the queue and what it waits for."""
    e = q.entry
    argv = e.spec.get("argv")
    cwd = e.spec.get("cwd")
    spec_file = e.spec.get("spec_file")
    now = time.time()
    return Status(
        name=e.name,
        state="queued",
        run=q.next_run,
        main_pid=None,
        pgid=None,
        supervisor_pid=None,
        supervisor_alive=False,
        exit_code=None,
        members=0,
        escaped=0,
        mode="-",
        cgroup=None,
        started_at=e.queued_at,
        ended_at=None,
        uptime_s=round(now - e.queued_at, 3),
        log="",
        last_log_line="",
        argv=[str(a) for a in argv] if isinstance(argv, list) else [],
        cwd=cwd if isinstance(cwd, str) else None,
        spec_file=spec_file if isinstance(spec_file, str) else None,
        queue=q.view,
    )


def _settings(spec: Spec, matched: bool) -> JobSettings:
    r = spec.restart
    restart = r.mode
    if r.mode != "never":
        restart += f" (max {r.max_restarts}, backoff {human_duration(r.backoff_s)})"
    return JobSettings(
        grace_s=spec.stop.grace_s,
        stop_signal=spec.stop.signal,
        stop_order=str(spec.stop.order),
        restart=restart,
        checkpoint=spec.watch.checkpoint,
        checkpoint_matches=matched,
        tty=spec.tty,
    )


LOST = Cause(
    kind="lost",
    summary="lost: its supervisor is gone; `trainctl stop` still stops it from the state file",
)


def cause_of(st: state.JobState, phase: Phase) -> Cause | None:
    """The run's recorded cause; `lost` for a live-looking run without its supervisor."""
    if phase == Phase.LOST:
        return LOST
    if st.cause is None or not phase.ended:
        return None
    return st.cause


def _memory_view(st: state.JobState, spec: Spec | None, *, live: bool) -> MemoryView | None:
    """Use against the cap while the run lives (two small reads); the kills when it ended."""
    if st.memory_cgroup is None:
        return None
    group = Path(st.memory_cgroup)
    if not live or not memory.is_ours(group) or not group.is_dir():
        cap = spec.memory if spec is not None else None
        return MemoryView(
            max_bytes=cap.max_bytes if cap else None,
            high_bytes=cap.high_bytes if cap else None,
            oom_kills=st.oom_kills,
        )
    u = memory.usage(group)
    return MemoryView(u.used_bytes, u.max_bytes, u.high_bytes, max(u.oom_kills, st.oom_kills))


@record(frozen=True)
class _Training:
    checkpoint: CheckpointSeen | None = None
    progress: Progress | None = None
    code_changed: list[str] = field(default_factory=list)
    spec_changed: list[str] = field(default_factory=list)


def _probation(st: state.JobState) -> str | None:
    """The deploy trial the run's supervisor holds it to now, in words."""
    t = st.trial
    if t is None or st.phase.ended:
        return None
    when = time.strftime("%H:%M:%S", time.localtime(t.until))
    if t.stage == GATE:
        return f"deploy {t.id}: at its gate until {when} (a step past its first, or a checkpoint)"
    return (
        f"deploy {t.id}: on probation until {when} or its first complete checkpoint; "
        "a crash or stall rolls back"
    )


def _training_view(jdir: Path, st: state.JobState, spec: Spec | None, *, live: bool) -> _Training:
    """Checkpoint, progress and code drift for `status` (cheap: tails and one git diff)."""
    if spec is None:
        return _Training()
    ck, partial = checkpoint_view(spec, jdir, st.run)
    seen = None
    if ck is not None or partial is not None:
        seen = CheckpointSeen(
            ck.path if ck else "",
            round(ck.age_s, 1) if ck else 0.0,
            ck.size if ck else 0,
            ck.step if ck else None,
            partial=partial.path if partial else None,
            partial_why=partial.why if partial else None,
            step_estimated=bool(ck and ck.step_estimated),
        )
    code, spec_keys = _changes(st, spec, live=live)
    prog = read_progress(jdir, st, spec)
    if prog is not None and not live:  # an ended run has no rate and no ETA: only its end
        prog = replace(prog, steps_per_s=None, eta_s=None)
    return _Training(seen, prog, code, spec_keys)


def _mounts_not_kept(
    home: Path, jdir: Path, st: state.JobState, spec: Spec | None, *, live: bool
) -> list[str]:
    """The mounts the live run writes to that its systemd scope does not keep mounted:
    a host shutdown may take them away while the job saves (a run from an older
    trainctl, a user manager's scope, a path with white space)."""
    if not live or st.unit is None or spec is None:
        return []
    return mounts.uncovered(mounts.written_dirs(home, jdir, spec), st.mounts_kept)


def spec_file_touched(spec: Spec) -> bool:
    """The spec file's mtime moved since its keys were read (one stat)."""
    if not spec.spec_file or spec.file_keys is None:
        return False
    return state.mtime(Path(spec.spec_file)) != spec.file_mtime


def _changes(st: state.JobState, spec: Spec, *, live: bool) -> tuple[list[str], list[str]]:
    """(code changes, spec file keys changed): the supervisor's record, or a fresh look
    when a stat says the disk moved since (an older supervisor, one that has not looked
    yet, an `scp` a moment ago, an edited spec file)."""
    # nothing recorded at start (no git, no entry script): nothing to compare
    # a copy snapshot's code is its whole tree: an imported module's edit touches nothing
    # the supervisor's fingerprint watches, so status looks (a stat per file)
    tree = st.code is not None and st.code.tree_sha is not None
    fresh_code = (
        bool(st.code) and live and (st.drift_checked_at is None or tree or _entry_edited_since(st))
    )
    fresh_spec = spec_file_touched(spec)
    code = list(st.code_drift) if live and not fresh_code else []
    if not (fresh_code or fresh_spec):
        return code, []
    from trainctl.launcher.ops import changes  # noqa: PLC0415  (git, tomllib: on a change only)

    return (
        changes.code_changes(st, spec) if fresh_code else code,
        changes.spec_changes(spec) if fresh_spec else [],
    )


def _entry_edited_since(st: state.JobState) -> bool:
    """The entry script changed after the supervisor last compared (`scp` a moment ago)."""
    entry = st.code.entry if st.code is not None else None
    if entry is None or st.drift_checked_at is None:
        return False
    return state.mtime(Path(entry)) > st.drift_checked_at


def _stall_stacks(jdir: Path, st: state.JobState) -> str | None:
    """The stacks the supervisor read when it saw this run stall, while it is stalled."""
    if st.stalled_since is None:
        return None
    path = state.stacks_path(jdir, st.run, "stall")
    return str(path) if path.exists() else None


def all_statuses(home: Path, *, brief: bool = False) -> list[Status | tuple[str, str]]:
    """Return the status of every job; an untrusted one becomes (name, error)."""
    out: list[Status | tuple[str, str]] = []
    from .queue import queued_names  # noqa: PLC0415  (the queue's policy: not for one status)

    names = set(state.list_jobs(home)) | set(queued_names(home))
    for name in sorted(names):
        try:
            out.append(job_status(home, name, brief=brief))
        except (StateError, ConfigError) as e:
            out.append((name, str(e)))
        except FileNotFoundError:
            continue
    return sorted(out, key=_live_first)


def _live_first(s: Status | tuple[str, str]) -> tuple[int, float, str]:
    """Live jobs first (by name), then finished ones, the latest ended first; unreadable
    ones last: what an operator looks for is what runs now."""
    if isinstance(s, tuple):
        return (2, 0.0, s[0])
    if s.state not in ENDED_STATES:
        return (0, 0.0, s.name)
    return (1, -(s.ended_at or s.started_at), s.name)
