"""Build and start a job's main process: own session, marker env, log fds, cgroup before exec."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from trainctl.supervisor.errors import SpawnError, StateError
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import (
    ERROR_FILE_VAR,
    TRAINCTL_VARS,
    TRANSPORT_VARS,
    error_file,
    open_in,
)
from trainctl.supervisor.records import record

from .terminal import open_pty, take_controlling_tty

# Signals the supervisor may ignore or handle; an exec keeps SIG_IGN, so reset them or the
# job would silently ignore its own stop signal.
_RESET = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCHLD,
    signal.SIGPIPE,
)


@record(frozen=True)
class Spawned:
    """The started main process."""

    proc: subprocess.Popen[bytes] | None  # None: adopted, not our child (exit code unknown)
    pid: int
    pidfd: int  # opened before anything can reap main, so it always refers to it
    pty: int | None = None  # `--tty`: the master of main's terminal (supervisor/tree/terminal.py)


TORCH_STORE_VAR = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def job_env(spec: Spec, jdir: Path, marker: str, run: int, progress: Path) -> dict[str, str]:
    """Return the job's environment: the recorded one plus trainctl's variables.

    ``TORCHELASTIC_ERROR_FILE`` (unless the job sets its own) makes torchrun write the
    failing worker's exception there, which is where the run's cause is read from.

    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (unless the job sets it): torchrun's workers
    then keep their own store instead of sharing the rendezvous store of the agent, where
    a restarted round can read the previous round's addresses (pytorch/pytorch#135712):
    after `torchrun --max-restarts N` restarted the ranks, 2 of 3 new rounds failed with
    "gloo ... Connection refused" here, trainctl or not; 0 of 3 with it.
    """
    # a spec recorded by an older release may still hold the transport variables
    env = {k: v for k, v in spec.env.items() if k not in (*TRAINCTL_VARS, *TRANSPORT_VARS)}
    env.setdefault(ERROR_FILE_VAR, str(error_file(jdir, run)))
    env.setdefault(TORCH_STORE_VAR, "1")
    env.update(
        TRAINCTL_JOB=marker,
        TRAINCTL_NAME=spec.name,
        TRAINCTL_RUN=str(run),
        TRAINCTL_PROGRESS=str(progress),
        PYTHONUNBUFFERED="1",
    )
    return env


def spawn_main(spec: Spec, env: dict[str, str], log: Path, cgroup_procs_fds: list[int]) -> Spawned:
    """Start the main process in a new session; raise SpawnError if it cannot be exec'd."""

    def in_child() -> None:
        # Runs between fork and exec in the child (the supervisor is single-threaded here),
        # after setsid: a --tty job's session takes its pty as its controlling terminal.
        if master is not None:
            take_controlling_tty()
        for sig in _RESET:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        for fd in cgroup_procs_fds:
            # "0" moves the writing process: the job is inside its cgroup(s) (v2, and v1
            # memory on hybrid hosts) before it can fork.
            os.write(fd, b"0")

    try:  # relative to the logs directory's descriptor: no symlink on the way
        log_fd = open_in(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    except StateError as e:
        raise SpawnError(str(e)) from None
    except OSError as e:
        raise SpawnError(f"log file {log}: {e.strerror}") from None
    master, stdin, out = _stdio(spec, log_fd)
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = subprocess.Popen(
            list(spec.argv),
            cwd=spec.cwd,
            env=env,
            stdin=stdin,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            # preexec_fn runs before close_fds, so the CLOEXEC cgroup fd is still open there
            # and never reaches the job.
            preexec_fn=in_child,  # noqa: PLW1509  (single-threaded here: see in_child)
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise _spawn_error(spec, e) from None
    finally:
        os.close(log_fd)
        if master is not None:
            os.close(out)  # the slave: only the job holds it now, so its exit reads as EOF
            if proc is None:
                os.close(master)
    # Nobody has waited for the child yet, so its pid cannot have been recycled.
    return Spawned(proc=proc, pid=proc.pid, pidfd=os.pidfd_open(proc.pid), pty=master)


def _stdio(spec: Spec, log_fd: int) -> tuple[int | None, int, int]:
    """(pty master or None, main's stdin, main's stdout and stderr).

    With --tty, main's stdio is the pty's slave and the supervisor copies the master into
    the log; without it main writes the log itself and reads /dev/null.
    """
    if spec.tty:
        master, slave = open_pty()
        return master, slave, slave
    return None, subprocess.DEVNULL, log_fd


def _spawn_error(spec: Spec, e: OSError | subprocess.SubprocessError) -> SpawnError:
    """Why main could not be started, in one line."""
    if isinstance(e, FileNotFoundError):
        if e.filename == spec.cwd or not os.path.isdir(spec.cwd):
            return SpawnError(f"working directory {spec.cwd} does not exist")
        return SpawnError(f"command not found: {spec.argv[0]}")
    if isinstance(e, PermissionError):
        return SpawnError(f"permission denied executing {spec.argv[0]} (in {spec.cwd})")
    if isinstance(e, OSError):
        return SpawnError(f"cannot execute {spec.argv[0]}: {e.strerror}")
    return SpawnError(f"cannot start {spec.argv[0]}: {e}")


def exit_code_of(status: int) -> int:
    """Return the shell-style exit code: N, or 128+N when killed by signal N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code
