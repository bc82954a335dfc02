"""trainctl's operations as plain functions returning dataclasses (also the Python API).

The CLI is a thin click layer over these. Nothing here prints.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainctl.supervisor import control, state
from trainctl.supervisor.errors import (
    ConfigError,
    JobConflictError,
    JobNotFoundError,
    SpawnError,
    StateError,
    TrainctlError,
)
from trainctl.supervisor.spawn import TRAINCTL_VARS
from trainctl.supervisor.state import JobState, Phase, Spec

from .config import Config
from .jobs import existing_job, live_members, target_of

UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


# ---------------------------------------------------------------- input validation


def parse_signal(name: str) -> str:
    """Return the canonical name ("SIGTERM") of a signal given as TERM, sigterm, SIGTERM or 15."""
    raw = name.strip().upper()
    try:
        sig = (
            signal.Signals(int(raw))
            if raw.isdigit()
            else signal.Signals[raw if raw.startswith("SIG") else "SIG" + raw]
        )
    except (KeyError, ValueError):
        raise ConfigError(f"unknown signal {name!r} (try TERM, INT, HUP, USR2)") from None
    if sig in UNCATCHABLE:
        raise ConfigError(
            f"{sig.name} cannot be caught, so it gives no grace; "
            "SIGKILL is what the stop sequence escalates to after the grace"
        )
    return sig.name


def parse_seconds(value: str | float, what: str) -> float:
    """Parse a non-negative, finite number of seconds."""
    try:
        secs = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a number of seconds, got {value!r}") from None
    if not math.isfinite(secs) or secs < 0:
        raise ConfigError(f"{what} must be a non-negative number of seconds, got {value!r}")
    return secs


def parse_env(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Parse KEY=VAL pairs."""
    out = {}
    for pair in pairs:
        key, sep, val = pair.partition("=")
        if not sep or not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise ConfigError(f"--env expects KEY=VALUE with a valid variable name, got {pair!r}")
        if key in TRAINCTL_VARS:
            raise ConfigError(f"--env cannot set {key}: trainctl sets it for every job")
        out[key] = val
    return out


def _check_command(argv: list[str], cwd: str, env: dict[str, str]) -> None:
    if not argv or not argv[0]:
        raise ConfigError("no command given: put the job's command after `--`")
    if not os.path.isdir(cwd):
        raise SpawnError(f"working directory {cwd} does not exist")
    exe = argv[0]
    if "/" in exe:
        path = os.path.join(cwd, exe)
        if not os.path.isfile(path):
            raise SpawnError(f"command not found: {exe} (in {cwd})")
        if not os.access(path, os.X_OK):
            raise SpawnError(f"permission denied executing {exe} (in {cwd})")
    elif shutil.which(exe, path=env.get("PATH", os.defpath)) is None:
        raise SpawnError(f"command not found: {exe}")


# ---------------------------------------------------------------- start


@dataclass(frozen=True, slots=True)
class StartResult:
    """A started run."""

    name: str
    run: int
    main_pid: int
    mode: str
    log: str
    elapsed_s: float


def build_spec(
    name: str,
    argv: list[str],
    cfg: Config,
    *,
    cwd: str | None = None,
    env: tuple[str, ...] = (),
    grace_s: str | float | None = None,
    stop_signal: str | None = None,
) -> Spec:
    """Validate start inputs and resolve them into a Spec (nothing is touched on disk)."""
    state.check_name(name)
    full_env = {k: v for k, v in os.environ.items() if k not in TRAINCTL_VARS}
    full_env.update(parse_env(env))
    workdir = os.path.abspath(os.path.expanduser(cwd)) if cwd else os.getcwd()
    spec = Spec(
        name=name,
        argv=tuple(argv),
        cwd=workdir,
        env=full_env,
        grace_s=parse_seconds(cfg.grace_s if grace_s is None else grace_s, "--grace"),
        stop_signal=parse_signal(stop_signal or cfg.stop_signal),
        kill_wait_s=cfg.kill_wait_s,
        snapshot_interval_s=cfg.snapshot_interval_s,
        cgroup=cfg.cgroup,
    )
    _check_command(list(argv), workdir, full_env)
    return spec


def start_job(home: Path, spec: Spec, cfg: Config) -> StartResult:
    """Start a run of ``spec`` under a new detached supervisor; return once main has exec'd."""
    state.ensure_home(home)
    jdir = state.job_dir(home, spec.name)
    created = not jdir.exists()
    jdir.mkdir(mode=0o700, exist_ok=True)
    try:
        with state.job_lock(jdir, 10.0):
            return start_locked(home, jdir, spec, cfg)
    except BaseException:
        if created and not (jdir / "state.json").exists():
            shutil.rmtree(jdir, ignore_errors=True)
        raise


def start_locked(home: Path, jdir: Path, spec: Spec, cfg: Config) -> StartResult:
    """Start a run; the caller holds the job lock."""
    t0 = time.monotonic()
    prev = state.read_state(jdir) if (jdir / "state.json").exists() else None
    if prev is not None:
        _refuse_if_live(jdir, prev)
    run = prev.run + 1 if prev else 1
    marker = uuid.uuid4().hex
    reply = _spawn_supervisor(home, jdir, spec, run, marker, cfg.ready_timeout_s)
    return StartResult(
        name=spec.name,
        run=run,
        main_pid=int(reply["main_pid"]),
        mode=str(reply["mode"]),
        log=str(state.log_path(jdir, run)),
        elapsed_s=time.monotonic() - t0,
    )


def _refuse_if_live(jdir: Path, prev: JobState) -> None:
    left = live_members(prev)
    if state.supervisor_alive(jdir) or (left and prev.phase not in state.TERMINAL):
        main = f", main pid {prev.main.pid}" if prev.main else ""
        raise JobConflictError(
            f"job {prev.name} is running (run {prev.run}{main}); "
            "stop it first or choose another name"
        )
    if left:
        raise JobConflictError(
            f"{len(left)} process(es) of job {prev.name} run {prev.run} are still alive "
            f"(pids {', '.join(map(str, sorted(left)[:8]))}); run `trainctl stop {prev.name}`"
        )


def _spawn_supervisor(
    home: Path, jdir: Path, spec: Spec, run: int, marker: str, timeout_s: float
) -> dict[str, Any]:
    """Launch the detached supervisor and complete the readiness handshake."""
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainctl.supervisor",
                "--home",
                str(home),
                "--name",
                spec.name,
                "--fd",
                str(theirs.fileno()),
            ],
            # Fully detached: own session, no tty, stdio on /dev/null and every other fd
            # closed, so `ssh host trainctl start ...` returns as soon as we do.
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            pass_fds=(theirs.fileno(),),
            cwd="/",
        )
        theirs.close()
        ours.settimeout(timeout_s)
        ours.sendall(
            control.encode({"spec": state.spec_to_doc(spec), "run": run, "marker": marker})
        )
        reply = _read_reply(ours)
    finally:
        ours.close()
        theirs.close()
    if reply is None or not reply.get("ok"):
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()  # our own child, not yet reaped: its pid cannot have been reused
            proc.wait()
        if reply is None:
            raise SpawnError(
                f"the supervisor of {spec.name} failed to start (see {jdir / 'events.jsonl'})"
            )
        raise SpawnError(str(reply.get("error")))
    # The supervisor outlives us on purpose; init (or a subreaper) reaps it.
    proc.returncode = 0
    return reply


def _read_reply(sock: socket.socket) -> dict[str, Any] | None:
    buf = b""
    try:
        while not buf.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                return None
            buf += chunk
    except TimeoutError:
        return None
    return control.decode(buf)


# ---------------------------------------------------------------- stop


@dataclass(slots=True)
class StopResult:
    """The outcome of `trainctl stop`."""

    name: str
    run: int
    via: str  # "supervisor" | "direct" | "noop"
    report: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None  # the job's main exit code, when known
    message: str = ""

    @property
    def ok(self) -> bool:
        """True when nothing of the job is alive."""
        return bool(self.report.get("ok", True))


def stop_job(
    home: Path,
    name: str,
    *,
    grace_s: float | None = None,
    main_only: bool = False,
    lock_held: bool = False,
) -> StopResult:
    """Stop every process of the job's current run (and nothing else)."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)  # a corrupt/foreign state raises here: nothing is signalled
    spec = state.read_spec(jdir)
    grace = spec.grace_s if grace_s is None else grace_s
    if state.supervisor_alive(jdir):
        try:
            reply = control.request(
                jdir,
                {"op": "stop", "grace_s": grace, "main_only": main_only},
                timeout_s=grace + spec.kill_wait_s + 60,
            )
        except control.ControlUnavailableError as e:
            if state.supervisor_alive(jdir):
                # Never run a second stop next to a live (but mute) supervisor.
                raise TrainctlError(
                    f"the supervisor of job {name} is alive but not "
                    f"answering ({e}); retry, or check events.jsonl"
                ) from None
        else:
            if not reply.get("ok"):
                raise TrainctlError(f"supervisor refused: {reply.get('error')}")
            _wait_supervisor_exit(jdir, 5.0)
            return StopResult(name, st.run, "supervisor", reply["report"], reply.get("exit_code"))
    if lock_held:
        return _stop_direct(jdir, spec, grace, main_only)
    with state.job_lock(jdir, grace + spec.kill_wait_s + 60, "another stop"):
        return _stop_direct(jdir, spec, grace, main_only)


def _wait_supervisor_exit(jdir: Path, timeout_s: float) -> None:
    """Let the supervisor finish its cleanup, so that a returned stop leaves nothing behind."""
    deadline = time.monotonic() + timeout_s
    while state.supervisor_alive(jdir) and time.monotonic() < deadline:
        time.sleep(0.005)


def _stop_direct(jdir: Path, spec: Spec, grace_s: float, main_only: bool) -> StopResult:
    """Stop from state.json + the marker scan, the supervisor being gone."""
    from trainctl.supervisor.terminate import StopPolicy, stop_tree  # noqa: PLC0415

    st = state.read_state(jdir)  # re-read under the lock: a concurrent stop may have finished
    if not live_members(st):
        msg = (
            f"job {st.name} is not running (phase {state.effective_phase(jdir, st)}); "
            "nothing to stop"
        )
        if st.phase not in state.TERMINAL:
            st = st.moved(Phase.STOPPING).moved(Phase.STOPPED, ended_at=time.time(), members=())
            state.write_state(jdir, st)
        elif st.last_stop is not None and not st.last_stop.get("ok", True):
            # The survivors an earlier stop reported are gone now: say so from here on.
            st = st.moved(st.phase, last_stop={**st.last_stop, "ok": True, "survivors": []})
            state.write_state(jdir, st)
        return StopResult(
            st.name, st.run, "noop", {"ok": True, "already_stopped": True}, st.exit_code, msg
        )

    def emit(event: str, **fields: Any) -> None:
        state.append_event(jdir, event, job=st.name, via="cli", **fields)

    if st.phase not in state.TERMINAL:
        st = st.moved(Phase.STOPPING)
        state.write_state(jdir, st)
    emit("stopping", reason="stop", grace_s=grace_s, supervisor="gone")
    policy = StopPolicy(grace_s=grace_s, kill_wait_s=spec.kill_wait_s)
    report = stop_tree(
        target_of(st), signal.Signals[spec.stop_signal], policy, main_only=main_only, emit=emit
    ).to_doc()
    report["reason"] = "stop"
    final = Phase.STOPPED if st.phase == Phase.STOPPING else st.phase
    st = st.moved(final, ended_at=st.ended_at or time.time(), last_stop=report, members=())
    state.write_state(jdir, st)
    return StopResult(st.name, st.run, "direct", report, st.exit_code)


# ---------------------------------------------------------------- restart, wait, rm


def restart_job(
    home: Path, name: str, cfg: Config, *, grace_s: float | None = None
) -> tuple[StopResult, StartResult]:
    """Stop the job (verified), then start its recorded spec again (new code on disk)."""
    jdir = existing_job(home, name)
    spec = state.read_spec(jdir)
    with state.job_lock(jdir, 30.0):
        stopped = stop_job(home, name, grace_s=grace_s, lock_held=True)
        st = state.read_state(jdir)
        left = live_members(st)
        if not stopped.ok or left:
            raise JobConflictError(
                f"not restarting {name}: {len(left)} process(es) of run {st.run} survived "
                f"the stop (pids {', '.join(map(str, sorted(left)[:8]))})"
            )
        started = start_locked(home, jdir, spec, cfg)
    return stopped, started


def wait_job(home: Path, name: str, timeout_s: float | None) -> JobState:
    """Block until the job's current run has ended; return its final state."""
    jdir = existing_job(home, name)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        st = state.read_state(jdir)
        phase = state.effective_phase(jdir, st)
        if phase in state.TERMINAL and not state.is_locked(jdir, "lock"):
            return st
        if phase == Phase.LOST:
            raise StateError(f"job {name}: the supervisor is gone, so the exit code is unknown")
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"job {name} still {phase} after {timeout_s:g} s")
        time.sleep(0.05)


def remove_job(home: Path, name: str, *, force: bool = False) -> Path:
    """Delete a finished job's directory (logs included)."""
    jdir = state.job_dir(home, name)
    if not jdir.exists():
        raise JobNotFoundError(f"no job named {name!r} (in {home})")
    with state.job_lock(jdir, 10.0):
        try:
            st = state.read_state(jdir)
        except (StateError, JobNotFoundError):
            if not force:
                raise
            st = None
        if st is not None:
            phase = state.effective_phase(jdir, st)
            if phase not in state.TERMINAL or live_members(st):
                raise JobConflictError(f"job {name} is {phase}: stop it before removing it")
        shutil.rmtree(jdir)
    return jdir
