"""Stop: resolve the request against the job's spec, look at its checkpoints, dispatch.

Everything before the first signal (the newest checkpoint, its age, a checkpoint asked
for) happens in :func:`check_checkpoint` and :func:`ask_checkpoint`, so a refusal
changes nothing. The stop itself is the job's backend's (backends/local/ through the
supervisor or directly, backends/slurm/ through the node agents).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trainctl.launcher import backends, early
from trainctl.launcher.backends import StopRequest, spec_for_stop
from trainctl.launcher.checkpoint import newest_checkpoint
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import human_duration
from trainctl.launcher.results import Checkpoint, CheckpointInfo, Dequeued, StopResult
from trainctl.supervisor.errors import ConfigError, JobConflictError, JobNotFoundError, StateError
from trainctl.supervisor.model import control, state
from trainctl.supervisor.model.reports import StopReport
from trainctl.supervisor.model.spec import Spec, StopOrder, parse_order

from . import queue
from .jobs import existing_job


def stop_order_of(raw: str | None, *, main_only: bool = False) -> StopOrder | None:
    """Resolve ``--order`` / ``--main-only`` (None: the job's own stop order)."""
    order = None if raw is None else parse_order(raw, "--order")
    if main_only and order not in (None, StopOrder.MAIN):
        raise ConfigError(f"--main-only means --order main; it contradicts --order {order}")
    return StopOrder.MAIN if main_only else order


def stop_exit_code(res: StopResult) -> int:
    """0 when the report proves nothing of the job alive; 6 when all that was found is
    gone but nothing proves it was all (no cgroup, no supervisor); 1 otherwise."""
    if not res.ok:
        return ExitCode.FAILED
    return ExitCode.NOT_PROVEN if getattr(res.report, "unproven", None) else ExitCode.OK


def stop_job(
    home: Path,
    name: str,
    *,
    grace_s: float | None = None,
    order: StopOrder | None = None,
    gpu_timeout_s: float | None = None,
    lock_held: bool = False,
    force: bool = False,
    verb: str = "stop",
) -> StopResult:
    """Stop every process of the job's current run (and nothing else); verify its GPUs."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)  # a corrupt/foreign state raises here: nothing is signalled
    spec, warning = spec_for_stop(jdir, st)
    req = StopRequest(
        grace_s=spec.stop.grace_s if grace_s is None else grace_s,
        order=order or StopOrder(spec.stop.order),
        gpu_timeout_s=spec.gpu.timeout_s if gpu_timeout_s is None else gpu_timeout_s,
        kill_wait_s=spec.stop.kill_wait_s,
        force=force,
        verb=verb,
        asked_grace_s=grace_s,
        asked_order=order,
        lock_held=lock_held,
    )
    res = backends.of(st).stop(jdir, st, spec, req)
    if warning:
        res.warnings.insert(0, warning)
    _handed_off(jdir, res)
    return res


def dequeue(home: Path, name: str) -> Dequeued | None:
    """Take a queued run of ``name`` out of the queue, first (a stop that freed GPUs must
    not let it start); None when none was queued."""
    entry = queue.dequeue(home, name)
    if entry is None:
        return None
    return Dequeued(name, queue.next_run(home, name), queue.has_live_run(home, name))


def finish_unclaimed(*, wait: bool) -> list[str]:
    """The stops launcher/early.py sent that the verb failed before reading: each runs
    anyway (the supervisor owns it once asked). Wait for each and say, a line each, how
    it ended; with ``wait`` False (after a Ctrl-C) leave them to the supervisor."""
    out = []
    for jdir, sock in early.unclaimed():
        if not wait:
            sock.close()
            continue
        try:
            report = control.read_stop_reply(sock, None, Path(jdir)).report
        except (control.ControlUnavailableError, StateError) as e:
            said = f"no report ({e})"
        else:
            ok = report.ok
            said = "nothing of it is left" if ok else "it did not prove the job gone; see `status`"
        out.append(f"the stop sent to {Path(jdir).name}'s supervisor ran: {said}")
    return out


def _handed_off(jdir: Path, res: StopResult) -> None:
    """Work the run handed to a tmux server outside it is not stopped with it: the stop
    must never say it proved the job gone (exit 6, and the report says what was left)."""
    try:
        lines = state.read_state(jdir).handed_off
    except (StateError, OSError):
        return
    report = res.report
    if lines and isinstance(report, StopReport) and report.unproven is None:
        report.unproven = lines[-1]


def _checkpoint_spec(jdir: Path, name: str, needed: bool) -> Spec | None:
    """The spec whose glob finds checkpoints; None when there is nothing to look at."""
    try:
        spec = state.read_spec(jdir)
    except (StateError, JobNotFoundError):
        if needed:
            raise
        return None  # nothing to show; the stop itself still works from state.json
    if not spec.watch.checkpoint:
        if needed:
            raise ConfigError(
                f"job {name} has no `checkpoint` glob in its spec; "
                "--at checkpoint|next-checkpoint and --require-checkpoint-within need one"
            )
        return None
    return spec


def check_checkpoint(
    home: Path,
    name: str,
    *,
    require_within_s: float | None = None,
    ask: bool = False,
    force: bool = False,
) -> tuple[CheckpointInfo, Spec | None, str | None]:
    """The newest checkpoint before a stop; refuse if it is older than ``require_within_s``.

    Returns what was seen, the spec whose glob was read (None: the job names no glob),
    and, when ``force`` overrode the age limit, why the limit was not met.
    """
    jdir = existing_job(home, name)
    st = state.read_state(jdir)  # an untrusted state refuses here, before anything else
    spec = _checkpoint_spec(jdir, name, needed=ask or require_within_s is not None)
    if spec is None:
        return CheckpointInfo(), None, None
    ck = newest_checkpoint(spec, jdir, st.run)
    overridden = None
    if require_within_s is not None and (ck is None or ck.age_s > require_within_s):
        age = "there is none" if ck is None else f"the newest is {human_duration(ck.age_s)} old"
        if not force:
            raise JobConflictError(
                f"not stopping {name}: no checkpoint within "
                f"{human_duration(require_within_s)} ({age}); --force to stop anyway"
            )
        overridden = age
    return CheckpointInfo(watched=True, newest=ck), spec, overridden


def ask_checkpoint(
    home: Path, name: str, spec: Spec, timeout_s: float, asked: Callable[[], None]
) -> Checkpoint | None:
    """Ask the running job for a checkpoint and wait for it (None: nothing runs to ask)."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    return backends.of(st).checkpoint(jdir, st, spec, timeout_s, asked)
