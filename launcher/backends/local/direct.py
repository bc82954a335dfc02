"""The stop without a supervisor: from state.json and every net, straight from the CLI.

Used by the local backend when the job's supervisor is gone (or was ended by
``stop --force``), and by a failed start's undo. Signal first, write after: nothing here
needs a writable home. A full or read-only disk costs the record of the stop (said in
one line), never the stop itself.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trainctl.launcher.backends import StopRequest
from trainctl.launcher.results import StopResult
from trainctl.supervisor.gpu.verify import gpu_policy_of, verify_release
from trainctl.supervisor.life.causes import stopped
from trainctl.supervisor.linux import memory
from trainctl.supervisor.model import events, state
from trainctl.supervisor.model.reports import Cause, StopReport
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import JobState, Phase
from trainctl.supervisor.records import replace
from trainctl.supervisor.tree.proctree import alive, scan, target_of
from trainctl.supervisor.tree.stacks import before_kill_writer
from trainctl.supervisor.tree.stop import run_stop

from .record import record


def stop_direct(jdir: Path, spec: Spec, req: StopRequest) -> StopResult:
    """Stop the run recorded in state.json; the caller holds the job lock."""
    st = state.read_state(jdir)  # re-read under the lock: a concurrent stop may have finished
    last = st.last_stop
    held = [g for g in getattr(last, "gpus", []) if not g.ok]
    if not alive(scan(target_of(st))):
        if held and st.phase.ended:
            # Nothing left to signal, but the last stop could not prove the GPUs free.
            return _reverify_gpus(jdir, st, spec, req)
        return _nothing_to_stop(jdir, st, spec)
    unproven = unprovable(st)
    failures: list[str] = []

    def emit(event: str | events.Event, **fields: Any) -> None:
        try:
            events.append_event(jdir, event, job=st.name, via="cli", **fields)
        except OSError as e:
            failures.append(f"cannot write {jdir / 'events.jsonl'}: {e.strerror}")

    emit(events.Stopping("stop", req.grace_s, str(req.order), supervisor="gone"))
    report = run_stop(
        target_of(st),
        spec,
        grace_s=req.grace_s,
        reason="stop",
        order=req.order,
        leases=st.gpus,
        gpu_timeout_s=req.gpu_timeout_s,
        emit=emit,
        before_kill=before_kill_writer(jdir, st.run, st.marker),
    )
    report.unproven = unproven
    # the run's v1 memory group (memory_max on a hybrid host), once empty
    memory.remove(Path(st.memory_cgroup) if st.memory_cgroup else None, target_of(st).cgroup)
    st = _stopped_state(st, report, req.verb)
    report.persist_error = write_best_effort(jdir, st) or (failures[0] if failures else None)
    res = StopResult(st.name, st.run, "direct", report, st.exit_code)
    if report.persist_error:
        res.warnings.append(f"warning: the stop is not recorded: {report.persist_error}")
    return res


def _stopped_state(st: JobState, report: StopReport, verb: str) -> JobState:
    """The state a stop without a supervisor leaves: stopped (if the run had not ended),
    its report, no members, and no restart to come."""
    changes: dict[str, object] = {}
    if not st.phase.ended:
        st = st.moved(Phase.STOPPING).moved(Phase.STOPPED)
        cause = stopped(verb, st.exit_code)
        cause = replace(cause, summary=f"{cause.summary} (its supervisor was gone)")
        report.cause = cause
        changes["cause"] = cause
    return st.moved(
        st.phase,
        ended_at=st.ended_at or time.time(),
        last_stop=report,
        members=(),
        restart_at=None,  # a backoff the dead supervisor was waiting out: no restart comes
        **changes,
    )


def _noop_report(st: JobState, spec: Spec, **fields: Any) -> StopReport:
    """The report of a stop that found nothing to signal (proven: nothing is alive)."""
    return StopReport(
        signal=spec.stop.signal,
        grace_s=spec.stop.grace_s,
        order=spec.stop.order,
        mode=st.mode,
        ok=True,
        already_stopped=True,
        **fields,
    )


def _reverify_gpus(jdir: Path, st: JobState, spec: Spec, req: StopRequest) -> StopResult:
    """Re-run the GPU release check of an ended run whose last stop found GPUs held."""
    gpus = verify_release(st.gpus, st.marker, {}, gpu_policy_of(spec, req.gpu_timeout_s))
    ok = all(g.ok for g in gpus)
    was = st.last_stop if isinstance(st.last_stop, StopReport) else StopReport()
    last = replace(was, gpus=list(gpus), ok=ok, survivors=[])
    record(jdir, st.moved(st.phase, last_stop=last))
    msg = f"job {st.name} has no process left; its GPUs are " + (
        "released now" if ok else "still not released"
    )
    report = _noop_report(st, spec, gpus=gpus)
    report.ok = ok
    return StopResult(st.name, st.run, "noop", report, st.exit_code, msg)


def unprovable(st: JobState) -> str | None:
    """What a stop of ``st`` without its supervisor cannot check (None: it can prove).

    With a cgroup, every process of the run is in it, however it escaped. Without one,
    the marker, the process group and session and the tree find all but a process that
    left them all and shed its TRAINCTL_JOB; only the supervisor (the orphans' subreaper)
    and its member snapshot saw those, and a dead supervisor saw nothing since its last.
    """
    if st.cgroup is not None or st.from_other_boot():  # a reboot ended every process of it
        return None
    seen = (
        f"its last member snapshot ({time.strftime('%H:%M:%S', time.localtime(st.snapshot_at))})"
        if st.snapshot_at
        else "any member snapshot"
    )
    return (
        "no cgroup and no supervisor: a process that left the job's tree, session and "
        "process group and dropped its TRAINCTL_JOB marker after "
        f"{seen} cannot be found (check `trainctl ps {st.name}`, or start jobs with a cgroup)"
    )


def _nothing_to_stop(jdir: Path, st: JobState, spec: Spec) -> StopResult:
    msg = f"job {st.name} is not running (phase {state.effective_phase(jdir, st)}); nothing to stop"
    unproven = unprovable(st) if not st.phase.ended else None
    if not st.phase.ended:
        found = "it could find " if unproven else ""
        lost = Cause(
            kind="lost",
            summary=f"lost: its supervisor and every process of the run {found}were gone when seen",
        )
        st = st.moved(Phase.STOPPING).moved(
            Phase.STOPPED, ended_at=time.time(), members=(), cause=lost, restart_at=None
        )
        write_best_effort(jdir, st)
    elif st.last_stop is not None and not st.last_stop.ok:
        # The survivors an earlier stop reported are gone now: say so from here on.
        last = replace(st.last_stop, ok=True, survivors=[])
        st = st.moved(st.phase, last_stop=last)
        write_best_effort(jdir, st)
    if unproven:
        msg = f"job {st.name}: nothing of its run was found (phase lost); {unproven}"
    report = _noop_report(st, spec)
    report.unproven = unproven
    return StopResult(st.name, st.run, "noop", report, st.exit_code, msg)


def write_best_effort(jdir: Path, st: JobState) -> str | None:
    """Write state.json; return why it failed (full or read-only disk) instead of raising."""
    try:
        record(jdir, st)
    except OSError as e:
        return f"cannot write {jdir / 'state.json'}: {e.strerror}"
    return None
