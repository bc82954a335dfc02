"""Supervisor start-up: the readiness handshake, kept import-light.

The CLI is waiting on the other end of a socketpair, so everything up to the reply imports
only the standard library and trainctl's own small modules; anyio and the service (~100 ms)
are imported after the CLI has been answered.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import gc
import json
import os
import signal
import socket
import time
from pathlib import Path

from trainctl.supervisor.linux.systemd import own_unit
from trainctl.supervisor.model.events import append_event
from trainctl.supervisor.model.layout import DEPLOY_VAR, name_ok
from trainctl.supervisor.model.reports import Guard, Trial
from trainctl.supervisor.model.sections import Adoption
from trainctl.supervisor.model.spec import Spec, spec_from_doc, spec_to_doc
from trainctl.supervisor.model.state import (
    RESUME_VAR,
    SPEC_FILE,
    STATE_FILE,
    SUPERVISOR_LOCK,
    JobDir,
    JobState,
    MemberSnap,
    Phase,
    ProcRef,
    check_not_symlink,
    current_boot_id,
    gpu_env,
    job_dir,
    log_path,
    open_in,
    progress_path,
    read_state,
    write_bytes_atomic,
    write_json_atomic,
    write_state,
)
from trainctl.supervisor.records import JsonObject, asdict, replace
from trainctl.supervisor.tree.launch import AdoptRequest, Handover, Ready
from trainctl.supervisor.tree.spawn import Spawned, job_env, spawn_main
from trainctl.supervisor.watch.drift import code_version

from .errors import SpawnError, StateError, TrainctlError
from .linux import cgroup as cg
from .linux import memory, procfs, systemd
from .model import control, events

PR_SET_CHILD_SUBREAPER = 36


def set_subreaper() -> bool:
    """Make orphans of the job reparent to this process instead of init."""
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def hold_supervisor_lock(jdir: Path) -> int:
    """Take supervisor.lock for this process's whole life; the CLI tests it for liveness."""
    fd = open_in(jdir / SUPERVISOR_LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _reply(sock: socket.socket, msg: JsonObject) -> None:
    sock.sendall(json.dumps(msg).encode() + b"\n")


def _spec_of(req: JsonObject) -> Spec:
    """The job spec the CLI's handshake carries (taken out of it)."""
    doc = req.pop("spec", None)
    if not isinstance(doc, dict):
        raise SpawnError("the CLI's handshake holds no job spec")
    return spec_from_doc(doc)


class _NoSpecError(Exception):
    """The CLI closed the handshake before sending anything: nothing to start."""


def _read_request(sock: socket.socket) -> JsonObject:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1 << 16)
        if not chunk and not buf:
            raise _NoSpecError
        if not chunk:
            raise SpawnError("the CLI went away before sending the job spec")
        buf += chunk
    try:
        doc = json.loads(buf)
    except ValueError:
        raise SpawnError("malformed handshake from the CLI") from None
    if not isinstance(doc, dict):
        raise SpawnError("malformed handshake from the CLI")
    return doc


def _handshake(sock: socket.socket) -> JsonObject | None:
    """The CLI's request; None when there is none to act on: the CLI closed the socket
    before sending anything (a start refused, or not handed to this supervisor), or a
    broken one (answered, where the CLI still listens)."""
    try:
        return _read_request(sock)
    except _NoSpecError:
        return None
    except (SpawnError, OSError) as e:
        with contextlib.suppress(OSError):
            _reply(sock, Ready(error=str(e)).to_doc())
        return None


def launch(jdir: Path, spec: Spec, ho: Handover) -> tuple[JobState, Spawned, Path | None]:
    """Start the job's main process and record it; raise SpawnError if it cannot start.

    Either the run is recorded or nothing of it runs: the run (marker, cgroup, supervisor)
    is on disk, phase `starting`, before main exists, so whoever finds this supervisor dead
    can still find and stop main; and if main cannot then be recorded (a full disk), main
    is killed before the error is answered.
    """
    run, marker = ho.run, ho.marker
    leaf = f"{spec.name}.{run}.{marker[:8]}"
    if ho.adopt is not None:
        return adopt(jdir, spec, ho, leaf)
    ho, kept = _guarded(jdir, spec, ho)
    trial = _trial_of(jdir, spec, ho)
    cgroup = cg.create_job_cgroup(leaf) if spec.isolation.cgroup else None
    before = {n: _read_or_none(jdir / n) for n in (SPEC_FILE, STATE_FILE)}
    mem: Path | None = None
    procs_fds: list[int] = []
    try:
        if spec.memory.wanted:
            mem = memory.place(spec.memory.max_bytes, spec.memory.high_bytes, leaf, cgroup)
        starting = _record_starting(jdir, spec, ho, cgroup, mem, kept, trial)
        procs_fds += [cg.open_procs_fd(g) for g in (cgroup, memory.separate(mem, cgroup)) if g]
    except (OSError, SpawnError):
        _close_all(procs_fds)
        _restore(jdir, before, cgroup, mem)
        raise
    try:
        spawned = spawn_main(spec, _run_env(jdir, spec, ho), log_path(jdir, run), procs_fds)
    except SpawnError:
        _restore(jdir, before, cgroup, mem)  # main never ran: a failed start changes nothing
        raise
    finally:
        _close_all(procs_fds)
    _fault("exit-after-spawn")
    try:
        state = _record_main(jdir, starting, spawned)
    except (OSError, SpawnError) as e:
        _abort_main(spawned, cgroup)
        _restore(jdir, before, cgroup, mem)  # main is gone again: the start changed nothing
        if isinstance(e, SpawnError):
            raise
        raise SpawnError(
            f"cannot record the job in {jdir}: {e.strerror}; nothing was left running"
        ) from None
    with contextlib.suppress(OSError):  # the run is recorded; an event line is a nicety
        append_event(jdir, _started(spec, state, ho))
    return state, spawned, cgroup


def _guarded(jdir: Path, spec: Spec, ho: Handover) -> tuple[Handover, Guard | None]:
    """The run's checkpoint guard (watch/guard.py), its copy kept aside: every start of a
    job with a complete checkpoint hands it (unless --from-scratch) and guards it. Never
    fails the start: a folder that cannot be read costs the run its guard, not its start."""
    if ho.from_scratch:
        return ho, None
    # what the verb handed (a relaunch's pick, a deploy's or a restart's in the spec): the
    # run gets it even when the guard cannot be planned
    handed = ho.resume_from or spec.env.get(RESUME_VAR)
    ho = replace(ho, resume_from=handed)
    if not spec.watch.checkpoint:
        return ho, None
    from trainctl.supervisor.watch import guard  # noqa: PLC0415  (jobs with a glob only)

    try:
        g = guard.plan(jdir, spec, ho.run, handed, _last_started(jdir, ho.run))
    except OSError:
        return ho, None
    if g is None:
        return ho, None
    return replace(ho, resume_from=g.handed), guard.keep_aside(jdir, ho.run, spec, g)


def _trial_of(jdir: Path, spec: Spec, ho: Handover) -> Trial | None:
    """A deploy's new code: the trial its deployer left for it (model/deploys.py), claimed
    by this run; its supervisor judges the gate and probation. A rollback run, or a later
    run of the same code, has none."""
    did = spec.env.get(DEPLOY_VAR)
    if not did or not name_ok(did) or ho.rolled_back is not None:
        return None
    from trainctl.supervisor.model import deploys  # noqa: PLC0415  (a deploy's new code only)

    return deploys.claim_trial(jdir, did, ho.run, time.time())


def _last_started(jdir: Path, run: int) -> float | None:
    """When run ``run - 1`` began, from the state this start is about to replace."""
    try:
        prev = read_state(jdir)
    except (OSError, TrainctlError):
        return None
    return prev.started_at if prev.run == run - 1 else None


def _started(spec: Spec, state: JobState, ho: Handover) -> events.Started:
    """The `started` event."""
    main = state.main.pid if state.main else None
    return events.Started(
        job=spec.name,
        run=state.run,
        main_pid=main,
        argv=list(spec.argv),
        cwd=spec.cwd,
        mode=state.mode,
        cgroup=state.cgroup,
        gpus=[g.index for g in ho.gpus],
        resumed_from=ho.resume_from,
        from_scratch=ho.from_scratch,
        rolled_back=ho.rolled_back,
        prespawned=ho.prespawned,
    )


def _record_main(jdir: Path, starting: JobState, spawned: Spawned) -> JobState:
    """The run with its main process, on disk (OSError: it could not be written)."""
    st = procfs.read_stat(spawned.pid)
    if st is None:  # cannot happen: an unreaped child keeps its /proc entry
        raise SpawnError(f"pid {spawned.pid} vanished right after exec")
    state = starting.moved(
        Phase.RUNNING,
        main=ProcRef(spawned.pid, st.start_ticks),
        pgid=spawned.pid,
        sid=spawned.pid,
    )
    _fault("enospc-recording-main")
    write_state(jdir, state)
    return state


def adopt(jdir: Path, spec: Spec, ho: Handover, leaf: str) -> tuple[JobState, Spawned, Path | None]:
    """Take over running processes trainctl did not start (`trainctl adopt`).

    Each member is named by pid and start time, and checked again here: one that exited
    since is left out; main gone means nothing is adopted. Main is held by a pidfd from
    now on. Where the host allows it (root, or a delegated subtree), every member moves
    into a fresh job cgroup, so what it forks later is a member too; otherwise the run is
    tracked by its tree, session and process group (`adopted, not contained`).
    """
    a = ho.adopt
    if a is None:
        raise SpawnError("nothing to adopt was handed over")
    main = ProcRef(*a.main)
    pidfd = _hold(main)
    refs = [ProcRef(p, t) for p, t in a.members]
    live = [r for r in refs if procfs.is_alive(r.pid, r.start_ticks)]
    kept = Path(a.cgroup) if a.cgroup is not None else None
    if kept is not None and cg.is_ours(kept) and kept.is_dir():
        cgroup: Path | None = kept  # a lost run's own cgroup: its members are still in it
    else:
        cgroup = cg.create_job_cgroup(f"{leaf}.{os.getpid()}") if spec.isolation.cgroup else None
    cgroup, by, why = _contain(cgroup, main, live, spec.isolation.cgroup)
    try:
        starting = _record_starting(jdir, spec, ho, cgroup, None)
        state = _adopted(starting, a, live, cgroup is not None, by, why)
        write_state(jdir, state)
    except (OSError, SpawnError) as e:
        os.close(pidfd)
        if cgroup is not None:  # give the processes back where they were: the root group
            _release(cgroup)
        raise SpawnError(f"cannot record the adopted job in {jdir}: {e}; nothing changed") from None
    with contextlib.suppress(OSError):
        append_event(
            jdir,
            "adopted",
            job=spec.name,
            run=ho.run,
            main_pid=main.pid,
            **asdict(state.adopted or Adoption()),
        )
    return state, Spawned(proc=None, pid=main.pid, pidfd=pidfd), cgroup


def _hold(main: ProcRef) -> int:
    """A pidfd on the main process to adopt, once it is checked to be that very process."""
    gone = f"pid {main.pid} exited before it could be adopted; nothing changed"
    try:
        pidfd = os.pidfd_open(main.pid)
    except OSError:
        raise SpawnError(gone) from None
    st = procfs.read_stat(main.pid)
    if st is None or st.start_ticks != main.start_ticks or st.state == "Z":
        os.close(pidfd)
        raise SpawnError(gone)
    return pidfd


def _adopted(
    starting: JobState,
    a: AdoptRequest,
    live: list[ProcRef],
    contained: bool,
    by: str | None,
    why: str | None,
) -> JobState:
    """The adopted run as it is now: its main, its live members and how it is held."""
    main = ProcRef(*a.main)
    snap = tuple(
        MemberSnap.of(s, ("adopted",))
        for r in live
        if (s := procfs.read_stat(r.pid)) is not None and s.start_ticks == r.start_ticks
    )
    adopted = Adoption(
        how=a.how,
        contained=contained,
        contained_by=by,  # "kernel" (a direct move) or "systemd" (the user's manager)
        why_not=why,
        log_source=a.log_source,
        at=time.time(),
        members=len(snap),
    )
    return starting.moved(
        Phase.RUNNING,
        started_at=min(time.time(), procfs.ticks_to_epoch(main.start_ticks)),  # its age
        main=main,
        pgid=a.pgid,
        sid=a.sid,
        members=snap,
        snapshot_at=time.time(),
        adopted=adopted,
    )


def _contain(
    cgroup: Path | None, main: ProcRef, live: list[ProcRef], wanted: bool
) -> tuple[Path | None, str | None, str | None]:
    """Move the members into ``cgroup``: (the cgroup or None, by whom, why not).

    First directly, which the kernel allows where we may write the common ancestor of
    both cgroups (root; a process already in our delegated subtree). A non-root user's
    login processes sit in ``session-N.scope``, which belongs to root: then the user's own
    systemd manager is asked (AttachProcessesToUnit on this supervisor's delegated scope),
    and it has the system manager move them. Members that exit meanwhile are simply gone.
    """
    if cgroup is None:
        why = "cgroups are off in the config" if not wanted else "no usable cgroup v2 here"
        return None, None, why
    others = [r for r in live if r != main]
    if cg.move(cgroup, main.pid):
        rest = [r for r in others if not cg.move(cgroup, r.pid) and _alive(r)]
        if rest and (unit := own_unit()) is not None:
            systemd.attach(unit, _below(cgroup), [r.pid for r in rest])
        return cgroup, "kernel", None
    denied = f"the kernel refused the move out of {cg.of_pid(main.pid) or '?'}"
    unit = own_unit()
    if unit is None:
        cg.remove(cgroup)
        return None, None, f"{denied}, and no systemd manager can be asked here"
    pids = [main.pid, *(r.pid for r in others if _alive(r))]
    said = systemd.attach(unit, _below(cgroup), pids)
    if said is None and cg.of_pid(main.pid) == cg.relative(cgroup):
        return cgroup, "systemd", None
    cg.remove(cgroup)
    return None, None, f"{denied}, and systemd's manager refused: {said or 'main did not move'}"


def _alive(r: ProcRef) -> bool:
    return procfs.is_alive(r.pid, r.start_ticks)


def _below(cgroup: Path) -> str:
    """The job cgroup as the scope's manager names it: relative to the scope's cgroup."""
    return "/" + "/".join(cgroup.parts[-2:])  # <scope>/trainctl/<leaf>


def _release(cgroup: Path) -> None:
    """Move every process of an adoption that failed back to the hierarchy's root."""
    root = cg.find_mount()
    if root is not None:
        for pid in cg.read_pids(cgroup):
            cg.move(root, pid)
    cg.remove(cgroup)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    fds.clear()


def _run_env(jdir: Path, spec: Spec, ho: Handover) -> dict[str, str]:
    """The job's environment for run ``ho.run``; a restart's checkpoint to resume from."""
    progress = progress_path(jdir, ho.run)
    _create_private(progress)
    env = job_env(spec, jdir, ho.marker, ho.run, progress)
    if ho.gpus:  # this run's GPUs: after a GPU fault (min_gpus), fewer than the spec's
        env.update(gpu_env(ho.gpus))
    env.pop(RESUME_VAR, None)  # never a stale one from the spec; --from-scratch: none
    if ho.resume_from is not None and not ho.from_scratch:
        env[RESUME_VAR] = ho.resume_from
    return env


def _create_private(path: Path) -> None:
    """Create the job's $TRAINCTL_PROGRESS file 0600 before the job first appends to it
    (else the job's umask decides: 0666 under umask 000); best-effort, as progress is."""
    with contextlib.suppress(OSError, StateError):
        os.close(open_in(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND))


def _record_starting(
    jdir: Path,
    spec: Spec,
    ho: Handover,
    cgroup: Path | None,
    mem: Path | None,
    kept: Guard | None = None,
    trial: Trial | None = None,
) -> JobState:
    """Write spec.json and a `starting` state for the run before its main process exists."""
    me = procfs.read_stat(os.getpid())
    if me is None:  # cannot happen: we are reading our own /proc entry
        raise SpawnError("cannot read this supervisor's own /proc entry")
    starting = JobState(
        name=spec.name,
        run=ho.run,
        phase=Phase.STARTING,
        marker=ho.marker,
        started_at=time.time(),
        supervisor=ProcRef(me.pid, me.start_ticks),
        mode="cgroup" if cgroup else "signals",
        cgroup=str(cgroup) if cgroup else None,
        memory_cgroup=str(mem) if mem else None,
        gpus=ho.gpus,
        restarts=ho.restarts,
        last_failure=ho.last_failure,
        restart_history=ho.restart_history,
        resumed_from=None if ho.from_scratch else ho.resume_from,
        from_scratch=ho.from_scratch,
        guard=kept,
        trial=trial,
        rolled_back=ho.rolled_back,
        boot_id=current_boot_id(),
        unit=own_unit(),
        mounts_kept=ho.mounts_kept,
    )
    logs = check_not_symlink(log_path(jdir, ho.run).parent)
    logs.mkdir(mode=0o700, exist_ok=True)
    write_json_atomic(JobDir(jdir).spec, spec_to_doc(spec))
    write_state(jdir, starting)
    return starting


def _fault(point: str) -> None:
    """Fail here on purpose when $TRAINCTL_TEST_FAULT names this point (tests only).

    The start-up races (a supervisor dying, or its disk filling, between spawning main and
    recording it) last microseconds; this hook lets the tests hit them every time, with
    real processes, instead of by luck. Unset in normal use: then it does nothing.
    """
    if os.environ.get("TRAINCTL_TEST_FAULT") != point:
        return
    if point == "exit-after-spawn":
        os._exit(1)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _restore(
    jdir: Path, before: dict[str, bytes | None], cgroup: Path | None, mem: Path | None = None
) -> None:
    """Put spec.json and state.json back as they were before this start (best effort)."""
    sep = memory.separate(mem, cgroup)
    if sep is not None:
        cg.remove(sep)
    if cgroup is not None:
        cg.remove(cgroup)
    for name, data in before.items():
        with contextlib.suppress(OSError):
            if data is None:
                (jdir / name).unlink(missing_ok=True)
            else:
                write_bytes_atomic(jdir / name, data)


def _abort_main(spawned: Spawned, cgroup: Path | None) -> None:
    """Kill main (our own unreaped child: its pid cannot have been reused) and reap it."""
    signal.pidfd_send_signal(spawned.pidfd, signal.SIGKILL)
    if spawned.proc is not None:
        spawned.proc.wait()
    os.close(spawned.pidfd)
    if cgroup is not None:
        cg.kill(cgroup)  # anything it forked in its first moments
        cg.remove_when_empty(cgroup)


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trainctl-supervisor")
    p.add_argument("--home", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--lock-fd", type=int, help="supervisor.lock handed over by our predecessor")
    return p.parse_args(argv)


def _lock(jdir: Path, handed: int | None) -> int:
    if handed is None:
        return hold_supervisor_lock(jdir)
    os.set_inheritable(handed, False)  # already locked: the flock came with the open file
    return handed


def main(argv: list[str]) -> int:
    """Handshake with the CLI, start the job, then supervise it until it ends."""
    args = _args(argv)
    # Meant for the job, not for us (see service._signals); spawn_main resets them for main.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    jdir = job_dir(Path(args.home), args.name)
    # The spec first, then the lock: spawned as `trainctl start` began (prespawn.py),
    # this supervisor may wait while that start is refused, and the lock tells the CLI a
    # job's supervisor is live.
    req = _handshake(sock)
    if req is None:
        return 0
    lock_fd = _lock(jdir, args.lock_fd)
    set_subreaper()
    try:
        spec = _spec_of(req)
        handover = Handover.from_doc(req)
        listener = control.bind(jdir)
        state, spawned, cgroup = launch(jdir, spec, handover)
    except TrainctlError as e:
        _reply(sock, Ready(error=str(e)).to_doc())
        (jdir / control.SOCK_NAME).unlink(missing_ok=True)
        return 1
    except OSError as e:
        _reply(sock, Ready(error=f"supervisor set-up failed: {e}").to_doc())
        (jdir / control.SOCK_NAME).unlink(missing_ok=True)
        return 1
    with contextlib.suppress(OSError):  # the CLI gave up waiting: the job is recorded anyway
        ready = Ready(
            ok=True, main_pid=spawned.pid, run=state.run, mode=state.mode, unit=state.unit
        )
        _reply(sock, ready.to_doc())
    sock.close()
    # After the answer, so `start` does not wait for git: the code is what it was at exec.
    code = code_version(spec, diff_to=jdir / "code" / f"run-{state.run}.diff")
    state = replace(state, code=code)
    with contextlib.suppress(OSError):  # a full disk must not cost the job its supervisor
        write_state(jdir, state)
        # each run's code, for `trainctl history` (state.json holds the current run's only)
        append_event(jdir, events.Code(state.run, spec.cwd, spec.source, code))
    from .service import run_supervisor  # noqa: PLC0415  (heavy: only after the CLI's answer)

    # The collector was off while the modules loaded (__main__.py). What they made lives
    # as long as the supervisor: frozen, no later collection walks it again.
    gc.freeze()
    gc.enable()
    return run_supervisor(jdir, spec, state, spawned, cgroup, listener, lock_fd)
