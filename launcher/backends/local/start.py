"""The local start: lease GPUs, spawn the run's supervisor, and undo a start that failed."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from trainctl.launcher import prespawn, snapshot
from trainctl.launcher.backends import StartRequest, StopRequest
from trainctl.launcher.gpus import lease_token, resolve_gpus
from trainctl.launcher.results import StartResult
from trainctl.supervisor import ids
from trainctl.supervisor.errors import ConfigError, SpawnError, TrainctlError
from trainctl.supervisor.gpu import MIB
from trainctl.supervisor.model import state
from trainctl.supervisor.model.spec import Spec, StopOrder
from trainctl.supervisor.model.state import Phase, gpu_env
from trainctl.supervisor.records import replace
from trainctl.supervisor.tree.launch import Handover, launch_supervisor

from .record import record
from .stop import stop_once


def start_run(req: StartRequest) -> StartResult:
    """Hand the next run to a new supervisor; undo everything if that fails."""
    run = req.prev.run + 1 if req.prev else 1
    marker = ids.new_marker()
    if req.spec.snapshot.mode != "none" and not req.keep_cwd:  # its own copy of the code
        req = replace(req, spec=snapshot.make(req.jdir, req.spec, run))
    try:
        ho = Handover(run, marker, from_scratch=req.from_scratch, rolled_back=req.rolled_back)
        started = _launch(req, ho)
    except SpawnError as e:
        _undo_failed_start(req.jdir, req.spec, marker, str(e))
        raise
    if req.spec.snapshot.mode != "none":
        with contextlib.suppress(OSError):  # an old snapshot left behind costs disk only
            # never the previous run's (a deploy's way back) nor the one this run uses
            in_use = {run, req.prev.run if req.prev else run, snapshot.run_of(req.spec, req.jdir)}
            snapshot.prune(req.jdir, req.spec.snapshot.keep, {r for r in in_use if r})
    return started


def _launch(req: StartRequest, ho: Handover) -> StartResult:
    """Spawn the run's supervisor (leasing GPUs first, if asked) and wait for its answer."""
    home, jdir, spec, cfg, gpus = req.home, req.jdir, req.spec, req.cfg, req.gpus
    if gpus is None:
        reply = launch_supervisor(home, jdir, spec, ho, cfg.ready_timeout_s, standby=_standby(req))
    else:
        # One start at a time picks GPUs, so two jobs can never lease the same one.
        with state.flock_file(home / "gpus.lock", 30.0, "another start is choosing GPUs"):
            leases = resolve_gpus(
                gpus.spec,
                home,
                share=gpus.share,
                force=gpus.force,
                foreign_threshold_bytes=cfg.gpu_foreign_threshold_mib * MIB,
            )
            if (need := spec.gpu.min_gpus) is not None and need > len(leases):
                raise ConfigError(f"min_gpus {need} is more than the {len(leases)} GPU(s) leased")
            spec = replace(
                spec,
                gpu=replace(
                    spec.gpu,
                    indices=",".join(map(lease_token, leases)),
                    asked=gpus.asked or ",".join(map(lease_token, leases)),
                ),
                env={**spec.env, **gpu_env(leases)},
            )
            ho = replace(ho, gpus=tuple(leases))
            reply = launch_supervisor(
                home, jdir, spec, ho, cfg.ready_timeout_s, standby=_standby(req)
            )
    guard = None
    if spec.watch.checkpoint and not ho.from_scratch:  # what the supervisor handed and kept
        with contextlib.suppress(TrainctlError, OSError):
            guard = state.read_state(jdir).guard
    return StartResult(
        guard=guard,
        from_scratch=ho.from_scratch,
        name=spec.name,
        run=ho.run,
        main_pid=reply.main_pid,
        mode=reply.mode,
        log=str(state.log_path(jdir, ho.run)),
        elapsed_s=time.monotonic() - req.t0,
        gpus=spec.gpu.indices,
        unit=reply.unit,
        warnings=[f"warning: {reply.warning}"] if reply.warning else [],
    )


def _standby(req: StartRequest) -> tuple[int, int] | None:
    """The supervisor spawned as the command began (launcher/prespawn.py), if it was."""
    return prespawn.take(str(req.home), req.spec.name)


def _undo_failed_start(jdir: Path, spec: Spec, marker: str, why: str) -> None:
    """After a failed start, make sure nothing of the run it recorded is left running.

    The supervisor records the run before main exists, so when it died (or hung past the
    readiness timeout) after spawning main, its state names the run's marker and cgroup:
    stop whatever carries them, then record the run as failed. The caller holds the lock.
    """
    try:
        st = state.read_state(jdir)
    except TrainctlError:
        return
    if st.marker != marker:
        return  # the supervisor died before recording anything: nothing can be running
    grace = min(spec.stop.grace_s, 5.0)
    req = StopRequest(
        grace_s=grace,
        order=StopOrder(spec.stop.order),
        gpu_timeout_s=spec.gpu.timeout_s,
        kill_wait_s=spec.stop.kill_wait_s,
        lock_held=True,
    )
    for _ in range(3):  # main may be between fork and exec for a moment: look again
        if stop_once(jdir, spec, req).via == "noop":
            break
        time.sleep(0.05)
    st = state.read_state(jdir)
    # recorded as the failed start it was (the stop above may have called it "stopped")
    failed = replace(
        st, phase=Phase.FAILED, ended_at=st.ended_at or time.time(), error=f"start failed: {why}"
    )
    with contextlib.suppress(OSError):  # the stop above is what matters; the record is not
        record(jdir, failed)
