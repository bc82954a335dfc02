"""The restart policy as pure decisions (unit-tested; the supervisor acts on them)."""

from __future__ import annotations

from trainctl.supervisor.model.reports import Cause, RestartEntry
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.records import record

from .causes import matches


@record(frozen=True)
class Verdict:
    """Relaunch, or why not; ``gave_up`` names a policy end (restarts-exhausted, crash-loop)."""

    relaunch: bool
    why: str = ""  # '' when the policy never applied (a clean exit, a user's stop)
    gave_up: str | None = None
    matched: str | None = None  # the restart_on entry the failure met


def decide(
    spec: Spec,
    *,
    restarts: int,
    cause: Cause,
    cleaned_up: bool,
    reason: str,
    history: tuple[RestartEntry, ...] = (),
    now: float = 0.0,
    ckpt_step: float | None = None,
    no_checkpoint: bool = False,
    healthy_gpus: int | None = None,
    held: str | None = None,
) -> Verdict:
    """Whether to relaunch after a run ended with ``cause``.

    ``reason``: "stop" (a user stopped it: never restarted), "main exited" (main ended on
    its own), "stalled" (the watchdog stopped it because ``on_stall = "restart"``).
    ``history``: the restarts made so far (when each was made, and the newest complete
    checkpoint's step at each failure), for ``restart_window`` and the breaker on progress.
    ``ckpt_step``: the newest complete checkpoint's step now (None: unknown).
    ``no_checkpoint``: the job names a checkpoint glob and none is complete (a run killed
    in its first save, whose own resume picks the torn one, loops without one).
    ``healthy_gpus``: after a GPU fault (reason "gpu fault"), the run's GPUs left healthy.
    ``held``: the GPUs the stop found still held and by what (for the refusal's words).
    """
    if reason == "gpu fault":
        return _heal(spec, healthy_gpus or 0, cleaned_up)
    # the restarts a GPU fault made are the hardware's, not the code's: no breaker counts them
    healed = sum(1 for h in history if h.kind == "gpu")
    history, restarts = tuple(h for h in history if h.kind != "gpu"), max(0, restarts - healed)
    matched = _restartable(spec, cause, reason)
    if isinstance(matched, Verdict):
        return matched
    over = _no_progress(spec, history, ckpt_step, no_checkpoint) or _over_budget(
        spec, restarts, history, now
    )
    if over is not None:
        return over
    if not cleaned_up:
        if held:
            return Verdict(False, f"not relaunching onto a held GPU: {held}")
        return Verdict(False, "the failed run left processes or GPU memory behind; not relaunching")
    return Verdict(True, matched=matched)


def _restartable(spec: Spec, cause: Cause, reason: str) -> str | Verdict:
    """The restart_on entry (or "stalled") a run's end meets, or the verdict that it is
    not one to restart."""
    if reason == "stalled":
        return "stalled" if spec.watch.on_stall == "restart" else Verdict(False)
    if (
        reason != "main exited"
        or spec.restart.mode != "on-failure"
        or cause.kind
        in (
            "clean",
            "stopped",
            "unknown",  # an adopted main: nobody knows whether it failed
        )
    ):
        return Verdict(False)
    matched = _matched(spec, cause)
    return Verdict(False, _not_listed(spec, cause)) if matched is None else matched


def _heal(spec: Spec, healthy: int, cleaned_up: bool) -> Verdict:
    """After a GPU fault: go on on the healthy GPUs left when ``min_gpus`` allows. Neither
    breaker counts it (the hardware failed, not the code); each fault takes a GPU away,
    so the healthy count ends any loop."""
    need = spec.gpu.min_gpus
    if need is None:
        return Verdict(False)  # the cause says how to go on on fewer GPUs
    if healthy < need:
        why = f"{healthy} healthy GPU(s) left, fewer than min_gpus {need}"
        return Verdict(False, why, gave_up="too-few-gpus")
    if not cleaned_up:
        return Verdict(False, "the run left processes or GPU memory behind; not relaunching")
    return Verdict(True, matched="gpu")


def _no_progress(
    spec: Spec,
    history: tuple[RestartEntry, ...],
    ckpt_step: float | None,
    no_checkpoint: bool = False,
) -> Verdict | None:
    """The breaker on progress: the last ``no_progress`` restarts all failed with the same
    newest complete checkpoint as the failure before them: they are looping on it; or,
    with none complete, all failed without one."""
    k = spec.restart.no_progress
    if not k or len(history) < k:
        return None
    if no_checkpoint:
        if any(h.ckpt_step is not None for h in history[-k:]):
            return None
        return Verdict(
            False,
            f"no-progress: {k} restarts, no complete checkpoint (restart_no_progress)",
            gave_up="no-progress",
        )
    if ckpt_step is None:
        return None
    if any(h.ckpt_step != ckpt_step for h in history[-k:]):
        return None
    return Verdict(
        False,
        f"no progress: {k} restarts, all from step {ckpt_step:g} (restart_no_progress)",
        gave_up="no-progress",
    )


def _over_budget(
    spec: Spec, restarts: int, history: tuple[RestartEntry, ...], now: float
) -> Verdict | None:
    """The crash-loop breaker (with restart_window), else the lifetime max_restarts."""
    r = spec.restart
    if r.window_s is not None:
        recent = [h for h in history if now - (h.at or 0.0) <= r.window_s]
        if len(recent) < r.max_restarts:
            return None
        return Verdict(
            False,
            f"crash loop: {len(recent) + 1} failures within {_span(r.window_s)} "
            f"(restart_window; at most {r.max_restarts} restarts in it)",
            gave_up="crash-loop",
        )
    if restarts < r.max_restarts:
        return None
    return Verdict(
        False, f"restarts exhausted ({restarts} of {r.max_restarts})", "restarts-exhausted"
    )


def _matched(spec: Spec, cause: Cause) -> str | None:
    codes = spec.restart.exit_codes
    if codes is not None:  # restart_exit_codes: the older spelling of exit:N entries
        code = cause.exit_code
        words = [w for w in spec.restart.on if w != "failure"]
        hit = matches(cause, words) if words else None
        return hit or (f"exit:{code}" if cause.kind == "exit" and code in codes else None)
    return matches(cause, spec.restart.on)


def _not_listed(spec: Spec, cause: Cause) -> str:
    codes = spec.restart.exit_codes
    if codes is not None and cause.kind == "exit":
        return f"exit code {cause.exit_code} is not in restart_exit_codes {list(codes)}"
    what = cause.reason_class or cause.kind
    return f"{cause.summary or what}: not in restart_on {list(spec.restart.on)}"


def _span(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


# A run that ran this long, with no restart counted in the window, had a healthy stretch:
# its failure is relaunched without backoff (lifecycle._schedule_relaunch).
HEALTHY_STRETCH_S = 30.0


def backoff_s(spec: Spec, restarts: int) -> float:
    """Exponential backoff before relaunch number ``restarts + 1``, capped."""
    return float(min(spec.restart.backoff_s * 2**restarts, spec.restart.backoff_max_s))


def count_in_window(spec: Spec, history: tuple[RestartEntry, ...], now: float) -> int:
    """How many of the restarts made so far count against the budget now."""
    w = spec.restart.window_s
    history = tuple(h for h in history if h.kind != "gpu")  # a GPU fault's restart is free
    if w is None:
        return len(history)
    return sum(1 for h in history if now - (h.at or 0.0) <= w)
