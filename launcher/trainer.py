"""Helpers for training code that runs under trainctl. Standard library only.

    from trainctl.launcher import trainer

    trainer.install_handlers()              # SIGTERM/SIGINT -> stop; SIGUSR2 -> checkpoint
    for step in range(start, total):
        loss = train_step()
        trainer.report(step=step, loss=loss, tokens_per_s=tps)   # -> status, ETA
        if trainer.checkpoint_requested():  # `trainctl stop --checkpoint` asked for one
            save_checkpoint()
        if trainer.should_stop():           # `trainctl stop` (graceful part)
            save_checkpoint()
            break

Handlers only set flags: the loop acts at a step boundary, never inside a collective.
A process that installs the checkpoint handler is one that `stop --checkpoint` signals;
the others (a torchrun agent, say) are left alone, since the signal would kill them.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

_flags = {"stop": False, "checkpoint": False}


def _on_stop(_sig: int, _frame: object) -> None:
    _flags["stop"] = True


def _on_checkpoint(_sig: int, _frame: object) -> None:
    _flags["checkpoint"] = True


def install_handlers(
    stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
    checkpoint_signal: int | None = signal.SIGUSR2,
) -> None:
    """Install flag-setting handlers for the stop signals and the checkpoint signal."""
    for sig in stop_signals:
        signal.signal(sig, _on_stop)
    if checkpoint_signal is not None:
        signal.signal(checkpoint_signal, _on_checkpoint)


def should_stop() -> bool:
    """True once a stop signal arrived."""
    return _flags["stop"]


def checkpoint_requested() -> bool:
    """True once per checkpoint request (the flag is cleared by reading it)."""
    asked, _flags["checkpoint"] = _flags["checkpoint"], False
    return asked


def report(step: int, **metrics: Any) -> None:
    """Append ``{"step": ..., **metrics, "t": now}`` to $TRAINCTL_PROGRESS (no-op outside)."""
    path = os.environ.get("TRAINCTL_PROGRESS")
    if not path:
        return
    line = json.dumps({"step": step, **metrics, "t": round(time.time(), 3)})
    with open(path, "a") as f:
        f.write(line + "\n")


def run_number() -> int:
    """The run number (1 for the first run, +1 per restart); 0 outside trainctl."""
    return int(os.environ.get("TRAINCTL_RUN", "0"))
