"""Helpers for training code that runs under trainctl. Standard library only.

    from trainctl.launcher import trainer

    trainer.install_handlers()              # SIGTERM/SIGINT -> stop; SIGUSR2 -> checkpoint
    start = load(trainer.resume_from())     # the checkpoint a `trainctl deploy` resumes from
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

trainctl's default stop order already keeps a rank's DataLoader workers out of the stop
signal until the rank has exited. Under Slurm, `--order all`, or any launcher that
signals every process at once, pass ``worker_init_fn=trainer.loader_worker_init`` to the
DataLoader: its workers then ignore SIGTERM and SIGINT, so the rank can finish its step
and checkpoint; they still exit when the rank shuts them down or dies.
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


def loader_worker_init(_worker_id: int = 0) -> None:
    """Make a DataLoader worker ignore SIGTERM and SIGINT (``worker_init_fn=``).

    Safe because a worker never outlives its rank: PyTorch's workers check that their
    parent is alive and exit when it is gone, and the rank shuts them down on exit.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


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


def mark_complete(path: str, step: int | None = None) -> None:
    """Say that the checkpoint at ``path`` (a file or a folder) is complete:
    ``<path>.complete`` beside a file, or ``.complete`` inside a folder. Call it after
    the checkpoint is written; trainctl then never takes a half-written one for it.
    ``step``: the step it holds, written into the marker (``{"step": N}``): trainctl then
    knows it exactly, where a name without it leaves an estimate from the log."""
    target = os.path.join(path, ".complete") if os.path.isdir(path) else path + ".complete"
    with open(target, "w") as f:
        if step is not None:
            f.write(json.dumps({"step": step}))


def run_number() -> int:
    """The run number (1 for the first run, +1 per restart); 0 outside trainctl."""
    return int(os.environ.get("TRAINCTL_RUN", "0"))


def resume_from() -> str | None:
    """The checkpoint this run should resume from, when `trainctl deploy` started it
    (``$TRAINCTL_RESUME_FROM``: the checkpoint the deploy waited for); else None."""
    return os.environ.get("TRAINCTL_RESUME_FROM") or None
