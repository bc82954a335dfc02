"""Launching a job's detached supervisor, with the readiness handshake.

Used by `trainctl start` and by a supervisor that relaunches its job after a failure
(restart policy): the old supervisor hands its ``supervisor.lock`` over by passing the fd
(an flock belongs to the open file, so the lock never drops during the handover).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from trainctl.supervisor.errors import SpawnError
from trainctl.supervisor.linux import systemd
from trainctl.supervisor.model import control, layout
from trainctl.supervisor.model.reports import Failure, RestartEntry
from trainctl.supervisor.model.schema import build_document
from trainctl.supervisor.model.spec import Spec, spec_to_doc
from trainctl.supervisor.model.state import GpuLease
from trainctl.supervisor.records import JsonObject, asdict, record, replace

from .mounts import written_dirs


@record(frozen=True)
class AdoptRequest:
    """`trainctl adopt`'s handover: the processes of a run trainctl did not start, each
    named by pid and start time (boot.adopt checks every one again before it adopts)."""

    how: str  # "--pid 123", "--tmux train:0"
    main: tuple[int, int]  # (pid, start ticks)
    members: tuple[tuple[int, int], ...] = ()
    pgid: int | None = None  # recorded only when the whole process group is adopted
    sid: int | None = None  # ... and the whole session
    log_source: str | None = None  # a regular file behind main's stdout
    cgroup: str | None = None  # a lost run's own cgroup, which still holds its members


@record(frozen=True)
class Handover:
    """What a new supervisor needs besides the spec: which run, and its history."""

    run: int
    marker: str
    gpus: tuple[GpuLease, ...] = ()
    restarts: int = 0
    last_failure: Failure | None = None
    restart_history: tuple[RestartEntry, ...] = ()
    # `trainctl adopt`: the processes of a run trainctl did not start (see boot.adopt)
    adopt: AdoptRequest | None = None
    # what the run's scope keeps mounted until it has stopped (RequiresMountsFor=)
    mounts_kept: tuple[str, ...] = ()
    # a restart: the newest complete checkpoint ($TRAINCTL_RESUME_FROM of the new run only;
    # the spec is not changed, so a later start or restart never hands a stale one)
    resume_from: str | None = None
    # `--from-scratch`: start over on purpose: nothing is handed and no guard is armed
    # (watch/guard.py); otherwise every start hands the newest complete checkpoint
    from_scratch: bool = False
    # a relaunch back to the code a deploy replaced (its new code kept failing): why
    rolled_back: str | None = None
    # handed to a supervisor spawned as `trainctl start` began (launcher/prespawn.py)
    prespawned: bool = False

    def to_doc(self) -> JsonObject:
        """Return the JSON form sent over the handshake socket."""
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: Any) -> Handover:
        """Read the handover off the handshake socket, checked field by field."""
        return build_document(cls, doc, "the supervisor's handover")


@record(frozen=True)
class Ready:
    """The new supervisor's answer once main has exec'd (or why it could not start)."""

    ok: bool = False
    main_pid: int | None = None
    run: int | None = None
    mode: str = "signals"
    unit: str | None = None
    error: str | None = None
    warning: str | None = None  # added here: what systemd detection had to say

    def to_doc(self) -> JsonObject:
        """Return the JSON form sent back over the handshake socket."""
        return asdict(self)


def launch_supervisor(
    home: Path,
    jdir: Path,
    spec: Spec,
    handover: Handover,
    timeout_s: float,
    lock_fd: int | None = None,
    standby: tuple[int, int] | None = None,
) -> Ready:
    """Start a detached supervisor for ``spec`` and wait until main has exec'd.

    ``standby``: (socket fd, pid) of a supervisor with this very command line spawned
    before the CLI had the spec (launcher/prespawn.py), our own child: it is handed the
    spec instead of a new one being spawned, unless the launch needs a systemd scope or
    hands a lock over (then its socket is closed and it exits)."""
    sd = systemd.detect() if spec.isolation.systemd else None
    unit = systemd.unit_name(spec.name, handover.run, handover.marker)
    keep = written_dirs(home, jdir, spec)
    if sd is not None and not sd.user:  # recorded: `status` names what is not kept
        handover = replace(handover, mounts_kept=tuple(systemd.mounts_for(keep)))
    doc = {"spec": spec_to_doc(spec), **handover.to_doc()}
    handed = None
    if standby is not None and sd is None and lock_fd is None:
        msg = control.encode({**doc, "prespawned": True})
        handed = _hand(socket.socket(fileno=standby[0]), standby[1], msg, timeout_s)
    elif standby is not None:
        os.close(standby[0])
    if handed is None:  # spawned now: the standby was not usable, or gone before the spec
        scope = systemd.scope_argv(sd, unit, _stop_budget(spec), keep_mounted=keep) if sd else []
        ours, pid = _spawn(scope, home, spec, lock_fd)
        handed = _hand(ours, pid, control.encode(doc), timeout_s) or (pid, None)
    pid, reply = handed
    if reply is None or not reply.ok or reply.main_pid is None:
        _refused(pid, reply, f"the supervisor of {spec.name} failed to start", jdir)
    if sd is not None and sd.warning:
        reply = replace(reply, warning=sd.warning)
    return reply


def _spawn(
    scope: list[str], home: Path, spec: Spec, lock_fd: int | None
) -> tuple[socket.socket, int]:
    """Spawn the supervisor; return our end of its handshake socket and its pid."""
    ours, theirs = socket.socketpair()
    argv = [*scope, *_supervisor_argv(home, spec, theirs.fileno(), lock_fd)]
    pass_fds = [theirs.fileno(), *([lock_fd] if lock_fd is not None else [])]
    try:
        proc = subprocess.Popen(
            argv,
            # Fully detached: own session, no tty, stdio on /dev/null and every other fd
            # closed, so `ssh host trainctl start ...` returns as soon as we do.
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(pass_fds),
            cwd="/",
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    # The supervisor outlives us on purpose; init (or a subreaper) reaps it. Popen never
    # waits for it: _refused reaps the one that failed.
    proc.returncode = 0
    return ours, proc.pid


def _hand(
    sock: socket.socket, pid: int, msg: bytes, timeout_s: float
) -> tuple[int, Ready | None] | None:
    """Send the spec to supervisor ``pid`` and read its answer (None: no answer); None
    when it was gone before it took the spec (a standby that did not come up)."""
    try:
        sock.settimeout(timeout_s)
        try:
            sock.sendall(msg)
        except OSError:
            _reap(pid, 0.0)
            return None
        return pid, _read_reply(sock)
    finally:
        sock.close()


def _supervisor_argv(home: Path, spec: Spec, fd: int, lock_fd: int | None) -> list[str]:
    """The supervisor's command line (its handshake socket, the lock it is handed)."""
    argv = [sys.executable, *layout.supervisor_args(str(home), spec.name), "--fd", str(fd)]
    return argv + (["--lock-fd", str(lock_fd)] if lock_fd is not None else [])


def _refused(pid: int, reply: Ready | None, what: str, jdir: Path) -> NoReturn:
    """The supervisor did not start main: reap it (our own child) and say why."""
    _reap(pid, 5.0)
    if reply is None:
        raise SpawnError(f"{what} (see {jdir / 'events.jsonl'})")
    raise SpawnError(str(reply.error))


def _reap(pid: int, within_s: float) -> None:
    """Wait up to ``within_s`` for our own child ``pid`` to end, then kill it; not yet
    reaped, its pid cannot have been reused."""
    deadline = time.monotonic() + within_s
    try:
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            time.sleep(0.02)
    except ChildProcessError:
        pass  # reaped already


def _stop_budget(spec: Spec) -> float:
    """What the job's own stop may take at a shutdown: grace, kill wait, GPU check, slack."""
    return spec.stop.grace_s + spec.stop.kill_wait_s + spec.gpu.timeout_s + systemd.STOP_SLACK_S


def _read_reply(sock: socket.socket) -> Ready | None:
    buf = b""
    try:
        while not buf.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                return None
            buf += chunk
    except TimeoutError:
        return None
    return build_document(Ready, control.decode(buf), "the supervisor's start reply")
