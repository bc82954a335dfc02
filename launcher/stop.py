"""`trainctl stop`: through the live supervisor, or from state.json when it is gone."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainctl.supervisor import control, state
from trainctl.supervisor.errors import (
    ConfigError,
    JobConflictError,
    JobNotFoundError,
    StateError,
    TrainctlError,
)
from trainctl.supervisor.proctree import target_of
from trainctl.supervisor.spec import Spec, StopOrder, StopPolicy
from trainctl.supervisor.state import Phase

if TYPE_CHECKING:
    from trainctl.supervisor.gpu.verify import GpuPolicy

from . import backends
from .exitcodes import ExitCode
from .jobs import existing_job, live_members


@dataclass(slots=True)
class StopResult:
    """The outcome of `trainctl stop`."""

    name: str
    run: int
    via: str  # "supervisor" | "direct" | "noop"
    report: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None  # the job's main exit code, when known
    message: str = ""
    warnings: list[str] = field(default_factory=list)  # one line each, for stderr

    @property
    def ok(self) -> bool:
        """True when nothing of the job is alive."""
        return bool(self.report.get("ok", True))


def stop_order_of(raw: str | None, *, main_only: bool = False) -> StopOrder | None:
    """Resolve ``--order`` / ``--main-only`` (None: the job's own stop order)."""
    from trainctl.supervisor.forest import parse_order  # noqa: PLC0415

    order = None if raw is None else parse_order(raw, "--order")
    if main_only and order not in (None, StopOrder.MAIN):
        raise ConfigError(f"--main-only means --order main; it contradicts --order {order}")
    return StopOrder.MAIN if main_only else order


def stop_exit_code(res: StopResult) -> int:
    """0 when nothing of the job is alive, 1 when something survived."""
    return ExitCode.OK if res.ok else ExitCode.FAILED


@dataclass(frozen=True, slots=True)
class _Call:
    """One stop request, resolved against the job's spec."""

    grace_s: float
    order: StopOrder
    gpu_timeout_s: float
    budget_s: float  # how long the whole stop may take before the CLI gives up waiting
    force: bool  # end a live but unreachable supervisor, then stop directly
    # --grace as given, else None: a live supervisor keeps the job's own grace (which it
    # holds in memory even when spec.json is unreadable), and a --grace that joins a
    # running stop shortens that stop's remaining grace
    asked_grace: float | None = None
    asked_order: StopOrder | None = None  # --order / --main-only; else the job's own


def stop_job(
    home: Path,
    name: str,
    *,
    grace_s: float | None = None,
    order: StopOrder | None = None,
    gpu_timeout_s: float | None = None,
    lock_held: bool = False,
    force: bool = False,
) -> StopResult:
    """Stop every process of the job's current run (and nothing else); verify its GPUs.

    A stop wins over a start or restart racing it: once the stop is done it waits for any
    such command to let go of the job, and stops the run that command started too.
    """
    jdir = existing_job(home, name)
    st = state.read_state(jdir)  # a corrupt/foreign state raises here: nothing is signalled
    spec, warning = _spec_for_stop(jdir, st)
    grace = spec.stop.grace_s if grace_s is None else grace_s
    done = backends.of(st).stop(jdir, st, spec, grace, None if order is None else str(order))
    if done is not None:
        return _warned(done, warning)
    gpu_wait = spec.gpu.timeout_s if gpu_timeout_s is None else gpu_timeout_s
    call = _Call(
        grace_s=grace,
        order=order or StopOrder(spec.stop.order),
        gpu_timeout_s=gpu_wait,
        budget_s=grace + spec.stop.kill_wait_s + gpu_wait + 60,
        force=force,
        asked_grace=grace_s,
        asked_order=order,
    )
    if lock_held:  # restart: it holds the job lock across its stop and its start
        return _warned(_stop_once(jdir, spec, call, lock_held=True), warning)
    res = _stop_once(jdir, spec, call, lock_held=False)
    for _ in range(3):
        with state.job_lock(jdir, call.budget_s, "a start or restart"):
            newer = state.read_state(jdir)
            if newer.run == res.run or not state.supervisor_alive(jdir, newer):
                return _warned(res, warning)
        # A start, restart or restart policy launched run N+1 while we stopped run N.
        res = _stop_once(jdir, _spec_for_stop(jdir, newer)[0], call, lock_held=False)
    return _warned(res, warning)


def _spec_for_stop(jdir: Path, st: state.JobState) -> tuple[Spec, str]:
    """The job's spec, or, when spec.json is unreadable, the configured stop defaults.

    state.json alone identifies every process of the run; the spec only tunes the stop
    (grace, signal, order). A corrupt spec must not leave a running job unstoppable.
    """
    try:
        return state.read_spec(jdir), ""
    except (StateError, JobNotFoundError) as e:
        from .config import load_config  # noqa: PLC0415

        try:
            cfg = load_config()
            grace, sig, kill, order = cfg.grace_s, cfg.stop_signal, cfg.kill_wait_s, cfg.stop_order
        except TrainctlError:
            grace, sig, kill, order = 60.0, "SIGTERM", 10.0, str(StopOrder.TREE)
        spec = Spec(
            name=st.name,
            argv=("?",),
            cwd="/",
            env={},
            stop=StopPolicy(
                signal=sig if sig.startswith("SIG") else f"SIG{sig}",
                grace_s=grace,
                kill_wait_s=kill,
                order=order,
            ),
        )
        return spec, f"warning: {e}; stopping with the configured defaults ({sig}, {grace:g} s)"


def _warned(res: StopResult, warning: str) -> StopResult:
    if warning:
        res.warnings.insert(0, warning)
    return res


def _stop_once(jdir: Path, spec: Spec, call: _Call, *, lock_held: bool) -> StopResult:
    """Stop the current run once: through its supervisor if it lives, else directly."""
    if supervised(jdir):
        res = _stop_via_supervisor(jdir, call)
        if res is not None:
            return res
    if lock_held:
        return _stop_direct(jdir, spec, call)
    with state.job_lock(jdir, call.budget_s, "another stop"):
        # A start may have held the lock while we waited: its supervisor answers now.
        if supervised(jdir):
            res = _stop_via_supervisor(jdir, call)
            if res is not None:
                return res
        return _stop_direct(jdir, spec, call)


def _stop_via_supervisor(jdir: Path, call: _Call) -> StopResult | None:
    """Ask the live supervisor to stop; None if it is gone (or was ended: --force)."""
    msg: dict[str, Any] = {"op": "stop", "gpu_timeout_s": call.gpu_timeout_s}
    if call.asked_order is not None:
        msg["order"] = str(call.asked_order)
        msg["main_only"] = call.asked_order is StopOrder.MAIN  # read by older supervisors
    if call.asked_grace is not None:
        msg["grace_s"] = call.asked_grace
    reply = _ask_supervisor(jdir, msg, call.budget_s, force=call.force)
    if reply is None:
        return None
    _wait_supervisor_exit(jdir, 5.0)
    st = state.read_state(jdir)
    res = StopResult(jdir.name, st.run, "supervisor", reply["report"], reply.get("exit_code"))
    if reply.get("joined"):
        res.warnings.append("note: a stop of this job was already running; this one joined it")
    if reply["report"].get("persist_error"):
        res.warnings.append(
            f"warning: the stop is not recorded: {reply['report']['persist_error']}"
        )
    return res


def _reverify_gpus(jdir: Path, st: state.JobState, policy: GpuPolicy) -> StopResult:
    """Re-run the GPU release check of an ended run whose last stop found GPUs held."""
    from trainctl.supervisor.gpu.verify import verify_release  # noqa: PLC0415

    gpus = verify_release(st.gpus, st.marker, {}, policy)
    ok = all(g["ok"] for g in gpus)
    last = {**(st.last_stop or {}), "gpus": gpus, "ok": ok, "survivors": []}
    state.write_state(jdir, st.moved(st.phase, last_stop=last))
    msg = f"job {st.name} has no process left; its GPUs are " + (
        "released now" if ok else "still not released"
    )
    report = {"ok": ok, "already_stopped": True, "gpus": gpus}
    return StopResult(st.name, st.run, "noop", report, st.exit_code, msg)


def _ask_supervisor(
    jdir: Path, msg: dict[str, Any], timeout_s: float, *, force: bool = False
) -> dict[str, Any] | None:
    """Send a request to the live supervisor; None if it went away (then stop directly).

    Retries for a few seconds: a supervisor that is handing over to its successor (restart
    policy) or finishing a stop has no socket for a moment while it still holds the lock,
    and one that just handed over answers ``retry`` (its successor owns the job now).
    """
    deadline = time.monotonic() + 5.0
    while True:
        try:
            reply = control.request(jdir, msg, timeout_s=timeout_s)
        except control.ControlUnavailableError as e:
            if not supervised(jdir):
                return None
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            if force:
                _end_supervisor(jdir)
                return None
            # Never run a second stop next to a live (but mute) supervisor unasked.
            raise JobConflictError(
                f"the supervisor of job {jdir.name} is alive but not answering ({e}); "
                f"`trainctl stop {jdir.name} --force` ends it and stops the job directly"
            ) from None
        if reply.get("retry"):
            deadline = time.monotonic() + 5.0
            time.sleep(0.02)
            continue
        if not reply.get("ok"):
            raise TrainctlError(f"supervisor refused: {reply.get('error')}")
        return reply


def _end_supervisor(jdir: Path) -> None:
    """SIGKILL the job's mute supervisor, verified by pid + start time (the job lives on)."""
    from trainctl.supervisor import procfs  # noqa: PLC0415

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
    state.append_event(jdir, "supervisor_ended", job=st.name, pid=sup.pid, why="stop --force")
    _wait_supervisor_exit(jdir, 5.0)


def _wait_supervisor_exit(jdir: Path, timeout_s: float) -> None:
    """Let the supervisor finish its cleanup, so that a returned stop leaves nothing behind."""
    deadline = time.monotonic() + timeout_s
    st = state.read_state(jdir)
    while state.supervisor_alive(jdir, st) and time.monotonic() < deadline:
        time.sleep(0.001)


def supervised(jdir: Path) -> bool:
    """Tell whether the job's current run has a live supervisor (lock, or pid + start).

    An unreadable state.json counts as no supervisor here: the direct stop that follows
    reads it again and refuses with the reason.
    """
    try:
        return state.supervisor_alive(jdir, state.read_state(jdir))
    except TrainctlError:
        return False


def _stop_direct(jdir: Path, spec: Spec, call: _Call) -> StopResult:
    """Stop from state.json and every net, the supervisor being gone.

    Signal first, write after: nothing here needs a writable home. A full or read-only
    disk costs the record of the stop (said in one line), never the stop itself.
    """
    from trainctl.supervisor.gpu.verify import gpu_policy_of  # noqa: PLC0415
    from trainctl.supervisor.stop import run_stop  # noqa: PLC0415

    st = state.read_state(jdir)  # re-read under the lock: a concurrent stop may have finished
    held = [g for g in (st.last_stop or {}).get("gpus", []) if not g.get("ok")]
    if not live_members(st) and held and st.phase in state.TERMINAL:
        # Nothing left to signal, but the last stop could not prove the GPUs free: check again.
        return _reverify_gpus(jdir, st, gpu_policy_of(spec, call.gpu_timeout_s))
    if not live_members(st):
        return _nothing_to_stop(jdir, st)
    failures: list[str] = []

    def emit(event: str, **fields: Any) -> None:
        try:
            state.append_event(jdir, event, job=st.name, via="cli", **fields)
        except OSError as e:
            failures.append(f"cannot write {jdir / 'events.jsonl'}: {e.strerror}")

    emit("stopping", reason="stop", grace_s=call.grace_s, order=str(call.order), supervisor="gone")
    report = run_stop(
        target_of(st),
        spec,
        grace_s=call.grace_s,
        reason="stop",
        order=call.order,
        leases=st.gpus,
        gpu_timeout_s=call.gpu_timeout_s,
        emit=emit,
    )
    if st.phase not in state.TERMINAL:
        st = st.moved(Phase.STOPPING).moved(Phase.STOPPED)
    st = st.moved(
        st.phase, ended_at=st.ended_at or time.time(), last_stop=report.to_doc(), members=()
    )
    report.persist_error = _write_best_effort(jdir, st) or (failures[0] if failures else None)
    res = StopResult(st.name, st.run, "direct", report.to_doc(), st.exit_code)
    if report.persist_error:
        res.warnings.append(f"warning: the stop is not recorded: {report.persist_error}")
    return res


def _write_best_effort(jdir: Path, st: state.JobState) -> str | None:
    """Write state.json; return why it failed (full or read-only disk) instead of raising."""
    try:
        state.write_state(jdir, st)
    except OSError as e:
        return f"cannot write {jdir / 'state.json'}: {e.strerror}"
    return None


def _nothing_to_stop(jdir: Path, st: state.JobState) -> StopResult:
    msg = f"job {st.name} is not running (phase {state.effective_phase(jdir, st)}); nothing to stop"
    if st.phase not in state.TERMINAL:
        st = st.moved(Phase.STOPPING).moved(Phase.STOPPED, ended_at=time.time(), members=())
        _write_best_effort(jdir, st)
    elif st.last_stop is not None and not st.last_stop.get("ok", True):
        # The survivors an earlier stop reported are gone now: say so from here on.
        st = st.moved(st.phase, last_stop={**st.last_stop, "ok": True, "survivors": []})
        _write_best_effort(jdir, st)
    return StopResult(
        st.name, st.run, "noop", {"ok": True, "already_stopped": True}, st.exit_code, msg
    )


def prepare_stop(
    home: Path,
    name: str,
    *,
    checkpoint: bool = False,
    checkpoint_timeout_s: float = 600.0,
    require_within_s: float | None = None,
    force: bool = False,
    say: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Before a stop: show the newest checkpoint, enforce its age, or ask for a new one.

    Everything here happens before any stop signal; a refusal changes nothing.
    """
    from .checkpoint import describe, newest_checkpoint  # noqa: PLC0415
    from .inputs import human_duration  # noqa: PLC0415

    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    try:
        spec = state.read_spec(jdir)
    except (StateError, JobNotFoundError):
        if checkpoint or require_within_s is not None:
            raise
        return {}  # nothing to show; the stop itself still works from state.json
    if not spec.watch.checkpoint:
        if checkpoint or require_within_s is not None:
            raise ConfigError(
                f"job {name} has no `checkpoint` glob in its spec; "
                "--checkpoint and --require-checkpoint-within need one"
            )
        return {}
    ck = newest_checkpoint(spec)
    say(describe(ck, spec))
    if require_within_s is not None and (ck is None or ck.age_s > require_within_s):
        age = "there is none" if ck is None else f"the newest is {human_duration(ck.age_s)} old"
        if not force:
            raise JobConflictError(
                f"not stopping {name}: no checkpoint within "
                f"{human_duration(require_within_s)} ({age}); --force to "
                "stop anyway"
            )
        say(f"no checkpoint within the limit ({age}); going ahead (--force)")
    info: dict[str, Any] = {
        "newest": None if ck is None else {"path": ck.path, "age_s": round(ck.age_s, 1)}
    }
    if checkpoint and (
        new := backends.of(st).checkpoint(jdir, st, spec, checkpoint_timeout_s, say)
    ):
        say(f"checkpoint written: {os.path.relpath(new.path, spec.cwd)} ({new.size} bytes)")
        info["written"] = {"path": new.path, "size": new.size}
    return info
