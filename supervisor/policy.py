"""The restart policy as pure decisions (unit-tested; the supervisor acts on them)."""

from __future__ import annotations

from .spec import Spec


def restart_refusal(
    spec: Spec, restarts: int, code: int | None, cleaned_up: bool, reason: str
) -> str | None:
    """Return None to relaunch the job; otherwise why not ('' when it never applied).

    ``reason``: "stop" (a user stopped it: never restarted), "main exited" (main ended on
    its own), "stalled" (the watchdog stopped it because ``on_stall = "restart"``).
    """
    applies = (reason == "main exited" and code != 0 and spec.restart.mode == "on-failure") or (
        reason == "stalled" and spec.watch.on_stall == "restart"
    )
    if not applies:
        return ""
    codes = spec.restart.exit_codes
    if reason == "main exited" and codes is not None and code not in codes:
        return f"exit code {code} is not in restart_exit_codes {list(codes)}"
    if restarts >= spec.restart.max_restarts:
        return f"restarts exhausted ({restarts} of {spec.restart.max_restarts})"
    if not cleaned_up:
        return "the failed run left processes or GPU memory behind; not relaunching"
    return None


def backoff_s(spec: Spec, restarts: int) -> float:
    """Exponential backoff before relaunch number ``restarts + 1``, capped."""
    return float(min(spec.restart.backoff_s * 2**restarts, spec.restart.backoff_max_s))
