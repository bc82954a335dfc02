"""`trainctl stop`: through the live supervisor, or from state.json when it is gone."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainctl.supervisor import control, state
from trainctl.supervisor.errors import ConfigError, JobConflictError, TrainctlError
from trainctl.supervisor.proctree import target_of
from trainctl.supervisor.state import Phase, Spec, StopOrder

if TYPE_CHECKING:
    from trainctl.supervisor.gpu.verify import GpuPolicy

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


def stop_job(
    home: Path,
    name: str,
    *,
    grace_s: float | None = None,
    order: StopOrder | None = None,
    gpu_timeout_s: float | None = None,
    lock_held: bool = False,
) -> StopResult:
    """Stop every process of the job's current run (and nothing else); verify its GPUs."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)  # a corrupt/foreign state raises here: nothing is signalled
    spec = state.read_spec(jdir)
    grace = spec.grace_s if grace_s is None else grace_s
    if st.backend == "slurm":
        return _stop_slurm(jdir, st, spec, grace)
    gpu_wait = spec.gpu_timeout_s if gpu_timeout_s is None else gpu_timeout_s
    budget = grace + spec.kill_wait_s + gpu_wait + 60
    order = order or StopOrder(spec.stop_order)
    if state.supervisor_alive(jdir):
        msg = {
            "op": "stop",
            "grace_s": grace,
            "order": str(order),
            "main_only": order is StopOrder.MAIN,  # what a supervisor of an older release reads
            "gpu_timeout_s": gpu_wait,
        }
        reply = _ask_supervisor(jdir, msg, budget)
        if reply is not None:
            _wait_supervisor_exit(jdir, 5.0)
            st = state.read_state(jdir)
            return StopResult(name, st.run, "supervisor", reply["report"], reply.get("exit_code"))
    if lock_held:
        return _stop_direct(jdir, spec, grace, order, gpu_wait)
    with state.job_lock(jdir, budget, "another stop"):
        return _stop_direct(jdir, spec, grace, order, gpu_wait)


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


def _stop_slurm(jdir: Path, st: state.JobState, spec: Spec, grace_s: float) -> StopResult:
    from . import slurm  # noqa: PLC0415

    report = slurm.stop(jdir, st, spec, grace_s)
    if report.get("already_stopped"):
        msg = f"job {st.name} is not running (Slurm: {report['slurm']['state']}); nothing to stop"
        return StopResult(st.name, st.run, "noop", report, report["slurm"]["exit_code"], msg)
    final = report["slurm"]
    new = dataclasses.replace(
        st,
        phase=Phase.STOPPED,
        exit_code=final["exit_code"],
        ended_at=time.time(),
        last_stop=report,
    )
    state.write_state(jdir, new)
    return StopResult(st.name, st.run, "slurm", report, final["exit_code"])


def _ask_supervisor(jdir: Path, msg: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
    """Send a request to the live supervisor; None if it went away (then stop directly).

    Retries for a few seconds: a supervisor that is handing over to its successor (restart
    policy) or finishing a stop has no socket for a moment while it still holds the lock.
    """
    deadline = time.monotonic() + 5.0
    while True:
        try:
            reply = control.request(jdir, msg, timeout_s=timeout_s)
        except control.ControlUnavailableError as e:
            if not state.supervisor_alive(jdir):
                return None
            if time.monotonic() >= deadline:
                # Never run a second stop next to a live (but mute) supervisor.
                raise TrainctlError(
                    f"the supervisor of job {jdir.name} is alive but not answering ({e}); "
                    "retry, or check events.jsonl"
                ) from None
            time.sleep(0.05)
            continue
        if not reply.get("ok"):
            raise TrainctlError(f"supervisor refused: {reply.get('error')}")
        return reply


def _wait_supervisor_exit(jdir: Path, timeout_s: float) -> None:
    """Let the supervisor finish its cleanup, so that a returned stop leaves nothing behind."""
    deadline = time.monotonic() + timeout_s
    while state.supervisor_alive(jdir) and time.monotonic() < deadline:
        time.sleep(0.001)


def _stop_direct(
    jdir: Path, spec: Spec, grace_s: float, order: StopOrder, gpu_timeout_s: float
) -> StopResult:
    """Stop from state.json + the marker scan, the supervisor being gone."""
    from trainctl.supervisor.gpu.verify import gpu_policy_of  # noqa: PLC0415
    from trainctl.supervisor.terminate import StopPolicy, stop_and_verify  # noqa: PLC0415

    st = state.read_state(jdir)  # re-read under the lock: a concurrent stop may have finished
    held = [g for g in (st.last_stop or {}).get("gpus", []) if not g.get("ok")]
    if not live_members(st) and held and st.phase in state.TERMINAL:
        # Nothing left to signal, but the last stop could not prove the GPUs free: check again.
        return _reverify_gpus(jdir, st, gpu_policy_of(spec, gpu_timeout_s))
    if not live_members(st):
        msg = (
            f"job {st.name} is not running (phase {state.effective_phase(jdir, st)}); "
            "nothing to stop"
        )
        if st.phase not in state.TERMINAL:
            st = st.moved(Phase.STOPPING).moved(Phase.STOPPED, ended_at=time.time(), members=())
            state.write_state(jdir, st)
        elif st.last_stop is not None and not st.last_stop.get("ok", True):
            # The survivors an earlier stop reported are gone now: say so from here on.
            st = st.moved(st.phase, last_stop={**st.last_stop, "ok": True, "survivors": []})
            state.write_state(jdir, st)
        return StopResult(
            st.name, st.run, "noop", {"ok": True, "already_stopped": True}, st.exit_code, msg
        )

    def emit(event: str, **fields: Any) -> None:
        state.append_event(jdir, event, job=st.name, via="cli", **fields)

    if st.phase not in state.TERMINAL:
        st = st.moved(Phase.STOPPING)
        state.write_state(jdir, st)
    emit("stopping", reason="stop", grace_s=grace_s, order=str(order), supervisor="gone")
    policy = StopPolicy(grace_s=grace_s, kill_wait_s=spec.kill_wait_s)
    report = stop_and_verify(
        target_of(st),
        signal.Signals[spec.stop_signal],
        policy,
        leases=st.gpus,
        gpu_policy=gpu_policy_of(spec, gpu_timeout_s),
        order=order,
        emit=emit,
    )
    report["reason"] = "stop"
    final = Phase.STOPPED if st.phase == Phase.STOPPING else st.phase
    st = st.moved(final, ended_at=st.ended_at or time.time(), last_stop=report, members=())
    state.write_state(jdir, st)
    return StopResult(st.name, st.run, "direct", report, st.exit_code)


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
    from .checkpoint import describe, newest_checkpoint, request_checkpoint  # noqa: PLC0415

    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    spec = state.read_spec(jdir)
    if not spec.checkpoint:
        if checkpoint or require_within_s is not None:
            raise ConfigError(
                f"job {name} has no `checkpoint` glob in its spec; "
                "--checkpoint and --require-checkpoint-within need one"
            )
        return {}
    ck = newest_checkpoint(spec)
    say(describe(ck, spec))
    if require_within_s is not None and (ck is None or ck.age_s > require_within_s):
        age = "there is none" if ck is None else f"the newest is {ck.age_s / 60:.1f} min old"
        if not force:
            raise JobConflictError(
                f"not stopping {name}: no checkpoint within "
                f"{require_within_s / 60:.1f} min ({age}); --force to "
                "stop anyway"
            )
        say(f"no checkpoint within the limit ({age}); going ahead (--force)")
    info: dict[str, Any] = {
        "newest": None if ck is None else {"path": ck.path, "age_s": round(ck.age_s, 1)}
    }
    if checkpoint and st.backend == "slurm":
        say(f"asking every node for a checkpoint ({spec.checkpoint_signal}) ...")
        new = _slurm_checkpoint(jdir, spec, checkpoint_timeout_s)
        say(f"checkpoint written: {os.path.relpath(new.path, spec.cwd)} ({new.size} bytes)")
        info["written"] = {"path": new.path, "size": new.size}
    elif checkpoint and live_members(st):
        say(f"asking for a checkpoint ({spec.checkpoint_signal}) ...")
        new = request_checkpoint(st, spec, checkpoint_timeout_s)
        say(f"checkpoint written: {os.path.relpath(new.path, spec.cwd)} ({new.size} bytes)")
        info["written"] = {"path": new.path, "size": new.size}
    return info


def _slurm_checkpoint(jdir: Path, spec: Spec, timeout_s: float) -> Any:
    """Ask the node agents (through the job directory) and wait for a new checkpoint."""
    from . import slurm  # noqa: PLC0415
    from .checkpoint import wait_new_checkpoint  # noqa: PLC0415

    asked_at = slurm.request_checkpoint(jdir)
    return wait_new_checkpoint(spec, asked_at, timeout_s)
