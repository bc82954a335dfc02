"""Supervisor start-up: the readiness handshake, kept import-light.

The CLI is waiting on the other end of a socketpair, so everything up to the reply imports
only the standard library and trainctl's own small modules; anyio and structlog (~120 ms)
are imported after the CLI has been answered.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from . import cgroup as cg
from . import control, procfs
from .drift import code_version
from .errors import SpawnError, TrainctlError
from .launch import Handover
from .spawn import Spawned, job_env, spawn_main
from .state import (
    GpuLease,
    JobState,
    Phase,
    ProcRef,
    Spec,
    append_event,
    job_dir,
    log_path,
    spec_from_doc,
    spec_to_doc,
    write_json_atomic,
    write_state,
)

PR_SET_CHILD_SUBREAPER = 36


def set_subreaper() -> bool:
    """Make orphans of the job reparent to this process instead of init."""
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def hold_supervisor_lock(jdir: Path) -> int:
    """Take supervisor.lock for this process's whole life; the CLI tests it for liveness."""
    fd = os.open(jdir / "supervisor.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _reply(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.sendall(json.dumps(msg).encode() + b"\n")


def _read_request(sock: socket.socket) -> dict[str, Any]:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise SpawnError("the CLI went away before sending the job spec")
        buf += chunk
    doc = json.loads(buf)
    if not isinstance(doc, dict):
        raise SpawnError("malformed handshake from the CLI")
    return doc


def launch(jdir: Path, spec: Spec, ho: Handover) -> tuple[JobState, Spawned, Path | None]:
    """Start the job's main process and record it; raise SpawnError if it cannot start."""
    run, marker, gpus = ho.run, ho.marker, ho.gpus
    cgroup = cg.create_job_cgroup(f"{spec.name}.{run}.{marker[:8]}") if spec.cgroup else None
    procs_fd = cg.open_procs_fd(cgroup) if cgroup else None
    log = log_path(jdir, run)
    log.parent.mkdir(mode=0o700, exist_ok=True)
    progress = jdir / "logs" / f"run-{run}.progress.jsonl"
    try:
        spawned = spawn_main(spec, job_env(spec, marker, run, progress), log, procs_fd)
    except SpawnError:
        if cgroup:
            cg.remove(cgroup)
        raise
    finally:
        if procs_fd is not None:
            os.close(procs_fd)
    st = procfs.read_stat(spawned.pid)
    me = procfs.read_stat(os.getpid())
    if st is None or me is None:  # cannot happen: an unreaped child keeps its /proc entry
        raise SpawnError(f"{spec.argv[0]} vanished right after exec")
    state = JobState(
        name=spec.name,
        run=run,
        phase=Phase.RUNNING,
        marker=marker,
        started_at=time.time(),
        supervisor=ProcRef(me.pid, me.start_ticks),
        main=ProcRef(spawned.pid, st.start_ticks),
        pgid=spawned.pid,
        sid=spawned.pid,
        mode="cgroup" if cgroup else "signals",
        cgroup=str(cgroup) if cgroup else None,
        gpus=gpus,
        restarts=ho.restarts,
        last_failure=ho.last_failure,
    )
    write_json_atomic(jdir / "spec.json", spec_to_doc(spec))
    write_state(jdir, state)
    append_event(
        jdir,
        "started",
        job=spec.name,
        run=run,
        main_pid=spawned.pid,
        argv=list(spec.argv),
        cwd=spec.cwd,
        mode=state.mode,
        cgroup=state.cgroup,
        gpus=[g.index for g in gpus],
    )
    return state, spawned, cgroup


def main(argv: list[str]) -> int:
    """Handshake with the CLI, start the job, then supervise it until it ends."""
    p = argparse.ArgumentParser(prog="trainctl-supervisor")
    p.add_argument("--home", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--lock-fd", type=int, help="supervisor.lock handed over by our predecessor")
    args = p.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    jdir = job_dir(Path(args.home), args.name)
    if args.lock_fd is not None:
        lock_fd = args.lock_fd  # already locked: the flock came with the open file
        os.set_inheritable(lock_fd, False)
    else:
        lock_fd = hold_supervisor_lock(jdir)
    set_subreaper()
    try:
        req = _read_request(sock)
        spec = spec_from_doc(req.pop("spec"))
        listener = control.bind(jdir)
        req["gpus"] = tuple(GpuLease(**g) for g in req.get("gpus", ()))
        state, spawned, cgroup = launch(jdir, spec, Handover(**req))
    except TrainctlError as e:
        _reply(sock, {"ok": False, "error": str(e)})
        (jdir / control.SOCK_NAME).unlink(missing_ok=True)
        return 1
    except OSError as e:
        _reply(sock, {"ok": False, "error": f"supervisor set-up failed: {e}"})
        (jdir / control.SOCK_NAME).unlink(missing_ok=True)
        return 1
    _reply(sock, {"ok": True, "main_pid": spawned.pid, "run": state.run, "mode": state.mode})
    sock.close()
    # After the answer, so `start` does not wait for git: the code is what it was at exec.
    state = dataclasses.replace(state, code=code_version(spec))
    write_state(jdir, state)
    from .service import run_supervisor  # noqa: PLC0415  (heavy: only after the CLI's answer)

    return run_supervisor(jdir, spec, state, spawned, cgroup, listener, lock_fd)
