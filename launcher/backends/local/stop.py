"""The local stop: through the job's live supervisor, else directly from state.json.

A stop wins over a start or restart racing it: once the stop is done it waits for any
such command to let go of the job, and stops the run that command started too.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from trainctl.launcher import early
from trainctl.launcher.backends import StopRequest, spec_for_stop
from trainctl.launcher.results import StopResult
from trainctl.supervisor.errors import JobConflictError, TrainctlError
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.linux.poll import poll_until
from trainctl.supervisor.model import control, events, state
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.records import replace

# How long a supervisor may have no socket while it still holds its lock (handing over
# to its successor, finishing a stop) before the CLI calls it mute.
MUTE_AFTER_S = 5.0


def stop_run(jdir: Path, spec: Spec, req: StopRequest) -> StopResult:
    """Stop the run, and any run a racing start or restart launched meanwhile."""
    if req.lock_held:  # restart: it holds the job lock across its stop and its start
        return stop_once(jdir, spec, req)
    res = stop_once(jdir, spec, req)
    for _ in range(3):
        with state.job_lock(jdir, req.budget_s, "a start or restart"):
            newer = state.read_state(jdir)
            if newer.run == res.run or not state.supervisor_alive(jdir, newer):
                return res
        # A start, restart or restart policy launched run N+1 while we stopped run N.
        res = stop_once(jdir, spec_for_stop(jdir, newer)[0], req)
    return res


def stop_once(jdir: Path, spec: Spec, req: StopRequest) -> StopResult:
    """Stop the current run once: through its supervisor if it lives, else directly."""
    # A stop the entry already sent is read first: by now its supervisor may have finished
    # it and exited, which must not read as "nothing to stop".
    asked = early.pending(str(jdir)) or state.supervised(jdir)
    began = time.monotonic()
    if asked and (res := _stop_via_supervisor(jdir, req)) is not None:
        return res
    from .direct import stop_direct  # noqa: PLC0415  (the stop algorithm: when no supervisor)

    if req.lock_held:
        return _finish(stop_direct(jdir, spec, _rest_of(req, began)), asked and not req.force)
    with state.job_lock(jdir, req.budget_s, "another stop"):
        # A start may have held the lock while we waited: its supervisor answers now.
        if state.supervised(jdir) and (res := _stop_via_supervisor(jdir, req)) is not None:
            return res
        return _finish(stop_direct(jdir, spec, _rest_of(req, began)), asked and not req.force)


def _rest_of(req: StopRequest, began: float) -> StopRequest:
    """The request a takeover finishes: the grace the supervisor had left, not a new one.

    A supervisor that died (SIGKILL, OOM) while its stop waited out the grace leaves the
    job to this command; the job has had ``now - began`` of its grace already.
    """
    spent = time.monotonic() - began
    return replace(req, grace_s=max(0.0, req.grace_s - spent))


def _finish(res: StopResult, took_over: bool) -> StopResult:
    """Say once that this command finished a stop its supervisor began and died in."""
    if took_over and res.via == "direct":
        res.warnings.append(
            "note: the job's supervisor died during the stop; this command finished it"
        )
    return res


def _stop_via_supervisor(jdir: Path, req: StopRequest) -> StopResult | None:
    """Ask the live supervisor to stop; None if it is gone (or was ended: --force)."""
    msg = control.StopAsk(
        gpu_timeout_s=req.gpu_timeout_s,
        order=None if req.asked_order is None else str(req.asked_order),
        grace_s=req.asked_grace_s,
        verb=req.verb,
    )
    reply = _ask_supervisor(jdir, msg, req.budget_s, force=req.force)
    if reply is None:
        return None
    _wait_supervisor_exit(jdir, 5.0)
    st = state.read_state(jdir)
    report = reply.report
    res = StopResult(jdir.name, st.run, "supervisor", report, reply.exit_code)
    if reply.joined:
        res.warnings.append("note: a stop of this job was already running; this one joined it")
    if report.persist_error:
        res.warnings.append(f"warning: the stop is not recorded: {report.persist_error}")
    return res


def _ask_supervisor(
    jdir: Path, msg: control.StopAsk, timeout_s: float, *, force: bool = False
) -> control.StopReply | None:
    """Send a stop to the live supervisor; None if it went away (then stop directly).

    Retries for a few seconds: a supervisor that is handing over to its successor (restart
    policy) or finishing a stop has no socket for a moment while it still holds the lock,
    and one that just handed over answers ``retry`` (its successor owns the job now).
    """
    deadline = time.monotonic() + MUTE_AFTER_S
    poked = False
    sent = early.claim(str(jdir), msg.order, msg.grace_s) if msg.verb == "stop" else None
    while True:
        try:
            if sent is not None:  # the entry sent this very stop before it imported us
                # read once: read_stop_reply closes it, and a supervisor that died while
                # we waited must send the next round to a fresh connect, not this fd
                first, sent = sent, None
                reply = control.read_stop_reply(first, timeout_s, jdir)
            else:
                reply = control.ask_stop(jdir, msg, timeout_s, watch=True)
        except control.ControlUnavailableError as e:
            if not state.supervised(jdir):
                return None  # gone (or died after taking the stop): stop directly
            # no socket for a moment (a hand-over): retry; one that took the stop and then
            # stopped answering (MuteError) is mute at once
            if not isinstance(e, control.MuteError):
                if not poked:
                    poked = _ask_rebind(jdir)
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
            _past_a_mute(jdir, e, force=force)
            return None
        if reply.retry:
            deadline = time.monotonic() + MUTE_AFTER_S
            time.sleep(0.02)
            continue
        if reply.error is not None:
            raise TrainctlError(f"supervisor refused: {reply.error}")
        return reply


def _past_a_mute(jdir: Path, why: Exception, *, force: bool) -> None:
    """A supervisor alive but not answering: end it (--force; the job is then stopped
    directly), or refuse: never a second stop next to a live one unasked."""
    if force:
        _end_supervisor(jdir)
        return
    raise JobConflictError(
        f"the supervisor of job {jdir.name} is alive but not answering ({why}); "
        f"`trainctl stop {jdir.name} --force` ends it and stops the job directly"
    )


def _ask_rebind(jdir: Path) -> bool:
    """The socket file is gone but the supervisor lives: ask it to bind again (SIGUSR1).

    Sent only to the recorded supervisor (pid + start time) and only if it handles
    SIGUSR1 (a supervisor from before this release would die of it). True once sent.
    """
    if (jdir / control.SOCK_NAME).exists():
        return False
    sup = state.read_state(jdir).supervisor
    if sup is None or not procfs.is_supervisor(sup.pid, sup.start_ticks):
        return False
    if not procfs.catches(sup.pid, signal.SIGUSR1):
        return False
    return procfs.send_signal(sup.pid, sup.start_ticks, signal.SIGUSR1)


def _end_supervisor(jdir: Path) -> None:
    """SIGKILL the job's mute supervisor, verified by pid + start time (the job lives on)."""
    st = state.read_state(jdir)
    sup = st.supervisor
    if (
        sup is None
        or not procfs.is_supervisor(sup.pid, sup.start_ticks)
        or not procfs.send_signal(sup.pid, sup.start_ticks, signal.SIGKILL)
    ):
        raise JobConflictError(
            f"job {jdir.name}: the process holding supervisor.lock is not the recorded "
            "supervisor; not signalling it"
        )
    events.append_event(jdir, "supervisor_ended", job=st.name, pid=sup.pid, why="stop --force")
    _wait_supervisor_exit(jdir, 5.0)


def _wait_supervisor_exit(jdir: Path, timeout_s: float) -> None:
    """Let the supervisor finish its cleanup, so that a returned stop leaves nothing behind."""
    st = state.read_state(jdir)
    poll_until(lambda: None if state.supervisor_alive(jdir, st) else True, timeout_s, 0.001)
