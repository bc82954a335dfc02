"""Start and restart: validate the spec, refuse a busy name, hand the run to its backend."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import TypeVar

from trainctl.launcher import backends
from trainctl.launcher.config import Config
from trainctl.launcher.inputs import parse_env, parse_seconds, parse_signal
from trainctl.launcher.results import GpuRequest, StartResult, StopResult
from trainctl.launcher.specfile import SpecDraft
from trainctl.supervisor import state
from trainctl.supervisor.errors import ConfigError, JobConflictError, SpawnError
from trainctl.supervisor.spec import (
    SLURM_KEYS,
    GpuBinding,
    Isolation,
    LogPolicy,
    RestartPolicy,
    Spec,
    StopPolicy,
    Watch,
)
from trainctl.supervisor.state import TRAINCTL_VARS, TRANSPORT_VARS, JobState

from .jobs import existing_job, live_members
from .stop import stop_job

T = TypeVar("T")


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
    """Validate start flags and resolve them into a Spec (nothing is touched on disk)."""
    draft = SpecDraft(
        name=name,
        argv=list(argv),
        env=parse_env(env),
        cwd=os.path.abspath(os.path.expanduser(cwd)) if cwd else None,
        grace=None if grace_s is None else parse_seconds(grace_s, "--grace"),
        stop_signal=parse_signal(stop_signal) if stop_signal else None,
    )
    return resolve_spec(draft, cfg)


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


def resolve_spec(d: SpecDraft, cfg: Config, spec_file: str | None = None) -> Spec:
    """Turn a merged draft (file < --set < flags) into a Spec, the config filling the rest."""
    if not d.name:
        raise ConfigError("no job name: give --name or set name in the job spec")
    state.check_name(d.name)
    argv = list(d.argv or [])
    inherited = (*TRAINCTL_VARS, *TRANSPORT_VARS)
    full_env = {k: v for k, v in os.environ.items() if k not in inherited}
    full_env.update(d.env or {})
    workdir = d.cwd or os.getcwd()
    backoff = _or(d.restart_backoff, 5.0)
    given = d.given()
    spec = Spec(
        name=d.name,
        argv=tuple(argv),
        cwd=workdir,
        env=full_env,
        stop=StopPolicy(
            signal=d.stop_signal or parse_signal(cfg.stop_signal),
            grace_s=_or(d.grace, cfg.grace_s),
            kill_wait_s=_or(d.kill_wait, cfg.kill_wait_s),
            order=_or(d.stop_order, cfg.stop_order),
        ),
        restart=RestartPolicy(
            mode=_or(d.restart, "never"),
            max_restarts=_or(d.max_restarts, 3),
            backoff_s=backoff,
            backoff_max_s=max(backoff, _or(d.restart_backoff_max, 300.0)),
            exit_codes=None if d.restart_exit_codes is None else tuple(d.restart_exit_codes),
        ),
        watch=Watch(
            checkpoint=d.checkpoint,
            checkpoint_signal=_or(d.checkpoint_signal, "SIGUSR2"),
            progress_regex=d.progress_regex,
            total_steps=d.total_steps,
            stall_timeout_s=d.stall_timeout,
            on_stall=_or(d.on_stall, "mark"),
            snapshot_interval_s=cfg.snapshot_interval_s,
        ),
        logs=LogPolicy(
            max_bytes=_or(d.log_max_size, cfg.log_max_mib << 20),
            keep=_or(d.log_keep, cfg.log_keep),
        ),
        isolation=Isolation(cgroup=cfg.cgroup, systemd=cfg.systemd),
        gpu=GpuBinding(
            timeout_s=_or(d.gpu_timeout, cfg.gpu_timeout_s),
            tolerance_mib=cfg.gpu_tolerance_mib,
        ),
        backend=_or(d.backend, "local"),
        slurm={k: given[k] for k in sorted(SLURM_KEYS) if k in given} or None,
        spec_file=spec_file,
    )
    _check_command(argv, workdir, full_env)
    return spec


def start_job(home: Path, spec: Spec, cfg: Config, gpus: GpuRequest | None = None) -> StartResult:
    """Start a run of ``spec`` under a new detached supervisor; return once main has exec'd."""
    state.ensure_home(home)
    jdir = state.check_not_symlink(state.job_dir(home, spec.name))
    created = not jdir.exists()
    jdir.mkdir(mode=0o700, exist_ok=True)
    try:
        with state.job_lock(jdir, 10.0):
            return start_locked(home, jdir, spec, cfg, gpus)
    except BaseException:
        if created and not (jdir / "state.json").exists():
            shutil.rmtree(jdir, ignore_errors=True)
        raise


def start_locked(
    home: Path, jdir: Path, spec: Spec, cfg: Config, gpus: GpuRequest | None = None
) -> StartResult:
    """Start a run; the caller holds the job lock."""
    t0 = time.monotonic()
    prev = state.read_state(jdir) if (jdir / "state.json").exists() else None
    if prev is not None:
        _refuse_if_live(jdir, prev)
    req = backends.StartRequest(home, jdir, spec, cfg, gpus, prev, t0)
    return backends.backend(spec.backend).start(req)


def _refuse_if_live(jdir: Path, prev: JobState) -> None:
    backends.of(prev).refuse_if_live(jdir, prev)
    left = live_members(prev)
    if state.supervisor_alive(jdir, prev) or (left and prev.phase not in state.TERMINAL):
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


_GPU_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


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
        if left or not stopped.ok:
            held = stopped.held_gpus
            why = (
                f"{len(left)} process(es) of run {st.run} survived the stop (pids "
                f"{', '.join(map(str, sorted(left)[:8]))})"
                if left or not held
                else f"GPU(s) {', '.join(str(g.index) for g in held)} were not released"
            )
            raise JobConflictError(f"not restarting {name}: {why}")
        # the same GPUs as before: they were just verified free
        gpus = (
            GpuRequest([int(i) for i in spec.gpu.indices.split(",")]) if spec.gpu.indices else None
        )
        env = {k: v for k, v in spec.env.items() if k not in _GPU_VARS}
        started = start_locked(home, jdir, dataclasses.replace(spec, env=env), cfg, gpus)
    return stopped, started
