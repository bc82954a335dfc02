"""A checkpoint asked by signal (`stop --at checkpoint`, `deploy --at checkpoint`).

Through the run's live supervisor, which signals the processes of its roster that catch
the signal (issue 55); else, with no supervisor answering or an older one, from here, by
pid and start time. Apart from the backend's module so that `status` does not load the
control socket's client (socket, selectors) to read a job.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from trainctl.launcher.backends import Asked
from trainctl.launcher.checkpoint import wait_new_checkpoint
from trainctl.launcher.results import Checkpoint
from trainctl.supervisor.errors import JobConflictError, ProcessTreeError, StateError
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model import control
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import JobState
from trainctl.supervisor.tree.proctree import alive, scan, target_of


def checkpoint(
    jdir: Path, st: JobState, spec: Spec, timeout_s: float, asked: Asked
) -> Checkpoint | None:
    """Signal the job's processes that catch the checkpoint signal; wait for the file."""
    members = alive(scan(target_of(st)))
    if not members:
        return None
    if not spec.watch.checkpoint:
        raise JobConflictError(
            f"job {st.name} has no `checkpoint` glob in its spec; "
            "cannot tell when a checkpoint is written"
        )
    sig = signal.Signals[spec.watch.checkpoint_signal]
    through = _through_supervisor(jdir, st, sig, asked)
    if through is not None:  # the supervisor holds the run: it signals (issue 55)
        return wait_new_checkpoint(spec, through, timeout_s)
    # no supervisor answers (lost), or an older one: the processes, by pid and start time
    targets = [m for m in members.values() if procfs.catches(m.stat.pid, sig)]
    if not targets:
        raise JobConflictError(
            f"no process of job {st.name} catches {sig.name} ({len(members)} checked); "
            "refusing: nothing was signalled (--at next-checkpoint waits for the "
            "trainer's own next save instead)"
        )
    asked()
    asked_at = time.time()
    sent = sum(procfs.send_signal(m.stat.pid, m.stat.start_ticks, sig) for m in targets)
    if not sent:
        raise ProcessTreeError(f"the {sig.name} catchers of job {st.name} are gone")
    return wait_new_checkpoint(spec, asked_at, timeout_s)


def _through_supervisor(
    jdir: Path, st: JobState, sig: signal.Signals, asked: Asked
) -> float | None:
    """Ask the run's live supervisor to send ``sig`` to the processes that catch it; when
    it was asked, the time. None: no supervisor answers, or it speaks an older protocol
    (the CLI signals them itself, as before). JobConflictError: none catches it."""
    if st.supervisor is None:
        return None
    try:
        reply = control.ask_checkpoint(jdir, sig.name, ASK_S)
    except (control.ControlUnavailableError, StateError, OSError):
        return None
    if reply.code == "none-catches":
        raise JobConflictError(
            f"no process of job {st.name} catches {sig.name} ({reply.checked} checked); "
            "refusing: nothing was signalled (--at next-checkpoint waits for the "
            "trainer's own next save instead)"
        )
    if not reply.ok:
        raise ProcessTreeError(f"job {st.name}: {reply.error or 'the checkpoint was not asked'}")
    asked()
    return reply.asked_at


ASK_S = 5.0  # the supervisor's answer to a checkpoint request (a scan and the signals)
