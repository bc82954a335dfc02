"""The per-node agent of a Slurm job: ``srun python -m trainctl.supervisor.node ...``.

Inside an allocation the job still runs under trainctl's guarantees: the agent is the
job's child subreaper, every process carries the marker, stdout/stderr go to the job's
log, and a stop (Slurm's SIGTERM to the step) runs the same stop sequence as locally, so
a setsid'd escaper that Slurm's proctrack plugin would miss is stopped too. A checkpoint
request (a file the CLI writes in the job directory) is forwarded only to the processes
that catch the checkpoint signal.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path

from trainctl.supervisor.model.reports import StopReport
from trainctl.supervisor.model.spec import Spec, StopOrder
from trainctl.supervisor.model.state import (
    NODE_VAR,
    ProcRef,
    job_dir,
    mtime,
    progress_path,
    read_spec,
)
from trainctl.supervisor.records import JsonObject, asdict
from trainctl.supervisor.tree.proctree import Member, Target, alive, scan, scan_light
from trainctl.supervisor.tree.spawn import Spawned, exit_code_of, job_env, spawn_main
from trainctl.supervisor.tree.stop import run_stop

from .boot import set_subreaper
from .errors import StateError
from .linux import procfs
from .model import events
from .model import nodefiles as nf

_stop = {"asked": False, "by_request": False}


def _on_stop(_sig: int, _frame: object) -> None:
    _stop["asked"] = True


# Set by slurmd for this very task on this node; the environment recorded at submit time
# (on the login node) has none of them, or stale ones. CUDA_VISIBLE_DEVICES is Slurm's
# choice of this node's allocated GPUs; the rest let a multi-node job find its rank and
# its master (SLURM_PROCID, SLURM_NODEID, SLURM_JOB_NODELIST, SLURMD_NODENAME, ...).
_TASK_PREFIXES = ("SLURM_", "SLURMD_")
_TASK_VARS = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES")


def slurm_task_env(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The per-task variables slurmd gave this agent, to pass on to the job over the spec's.

    Also what launchers need to form a multi-node job, derived from them: MASTER_ADDR (the
    batch host, the allocation's first node, exported by the batch script), MASTER_PORT
    (from the job id, so that two jobs on a node do not collide), NNODES and NODE_RANK;
    `torchrun --nnodes $NNODES --node-rank $NODE_RANK --rdzv-endpoint
    $MASTER_ADDR:$MASTER_PORT ...` then works as written.
    """
    out = {k: v for k, v in env.items() if k.startswith(_TASK_PREFIXES) or k in _TASK_VARS}
    job_id = env.get("SLURM_JOB_ID", "")
    derived = {
        "MASTER_ADDR": env.get("TRAINCTL_MASTER_ADDR"),
        "MASTER_PORT": str(20000 + int(job_id) % 20000) if job_id.isdigit() else None,
        "NNODES": env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES"),
        "NODE_RANK": env.get("SLURM_NODEID"),
    }
    out.update({k: v for k, v in derived.items() if v})
    return out


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trainctl-node")
    p.add_argument("--home", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--run", type=int, required=True)
    p.add_argument("--marker", required=True)
    p.add_argument(
        "--sweep",
        action="store_true",
        help="run nothing: stop what carries the marker on this node, report, exit",
    )
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    """Run the job on this node until it ends or is stopped; exit with its exit code."""
    args = _args(argv)
    jdir = job_dir(Path(args.home), args.name)
    spec = read_spec(jdir)
    if args.sweep:
        return sweep(jdir, spec, args.run, args.marker)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_stop)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # checkpoints come through the request file
    set_subreaper()
    # ``spawned`` stays referenced for the whole run: its Popen, collected early, would
    # reap main in __del__ and take its exit status along (a fast `exit 3` read as 143)
    target, spawned = _start_here(jdir, spec, args.run, args.marker)
    pid = spawned.pid
    _record(jdir, args.run, target)
    status = _supervise(jdir, spec.watch.checkpoint_signal, target, pid, args.run)
    started = time.monotonic()
    # main ended (or we were told to stop): nothing of the job may outlive this step
    # the request is type-checked (a NaN or negative grace is refused): else the job's own
    asked = nf.read_stop_request(jdir) if _stop["by_request"] else None
    order = asked.order if asked is not None and asked.order in tuple(StopOrder) else None
    grace_s = asked.grace_s if asked is not None else spec.stop.grace_s
    report = run_stop(
        target,
        spec,
        grace_s=grace_s,
        order=None if order is None else StopOrder(order),
        reason="stop" if _stop["asked"] else "node done",
    )
    _reap_all()
    if status is None:
        status = _wait_main(pid)
    code = exit_code_of(status) if status is not None else 143
    _report(jdir, args.run, target, report, code)
    if _stop["asked"]:
        # srun --kill-on-bad-exit ends the whole step when one agent exits non-zero: an
        # agent that finished its node's stop first would have Slurm kill the nodes still
        # in their graceful phase, loaders before ranks. Every node's stop ends first.
        budget = grace_s + spec.stop.kill_wait_s
        _wait_other_nodes(jdir, args.run, started + budget + BARRIER_SLACK_S)
    return code


def _start_here(jdir: Path, spec: Spec, run: int, marker: str) -> tuple[Target, Spawned]:
    """Start this node's share of the job; the target a stop of it works on, and main."""
    progress = progress_path(jdir, run)
    env = {**job_env(spec, jdir, marker, run, progress), **slurm_task_env(os.environ)}
    env.pop("TRAINCTL_MASTER_ADDR", None)
    env[NODE_VAR] = node_name()  # the marker net of this agent takes this node's only
    spawned = spawn_main(spec, env, node_log(jdir, run), [])
    me, st = procfs.read_stat(os.getpid()), procfs.read_stat(spawned.pid)
    if me is None or st is None:  # cannot happen: an unreaped child keeps its /proc entry
        raise SystemExit(f"trainctl-node: {spec.argv[0]} vanished right after exec")
    target = Target(
        marker=marker,
        main=ProcRef(spawned.pid, st.start_ticks),
        supervisor=ProcRef(me.pid, me.start_ticks),
        pgid=spawned.pid,
        sid=spawned.pid,
        node=node_name(),
    )
    return target, spawned


def _report(jdir: Path, run: int, target: Target, report: StopReport, code: int) -> None:
    """This node's end: its record (the stop's report, the exit code) and an event."""
    _record(jdir, run, target, stop=report.to_doc(), exit_code=code, stopped=_stop["asked"])
    events.append_event(
        jdir,
        "node_done",
        node=node_name(),
        run=run,
        found=report.found,
        killed=report.killed,
        ok=report.ok,
        exit_code=code,
        survivors=[asdict(sv) for sv in report.survivors],
    )


def sweep(jdir: Path, spec: Spec, run: int, marker: str) -> int:
    """Stop the leftovers of a run on this node, by marker, and publish the node's report.

    Run by `trainctl stop` in a fresh allocation on a node whose agent died without a
    report, once Slurm has ended or forgotten the job: the agent's processes may still
    run there, and this host's own sweep cannot reach another host.
    """
    target = Target(marker=marker, node=node_name())
    report = run_stop(target, spec.with_stop(kill_wait_s=5.0), grace_s=0.5, reason="sweep")
    _reap_all()
    _record(jdir, run, target, stop={**report.to_doc(), "swept": True}, sweep=True)
    events.append_event(
        jdir, "node_swept", node=node_name(), run=run, found=report.found, ok=report.ok
    )
    return 0 if report.ok else 1


def node_name() -> str:
    """This node's Slurm name (several slurmd may share one host), else the hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def node_log(jdir: Path, run: int) -> Path:
    """This node's log file (see nodefiles.node_log_path)."""
    first = os.environ.get("SLURM_NODEID", "0") in ("", "0")
    return nf.node_log_path(jdir, run, node_name(), first=first)


# An agent publishes its members for `status` and `ps` anywhere within CHANGE_S of a
# change of its member set, and every PUBLISH_S regardless (its record's age says it lives).
CHANGE_S = 0.5
PUBLISH_S = 2.0
# After its own stop, how long beyond the job's grace and kill wait an agent waits for the
# other nodes to finish theirs.
BARRIER_SLACK_S = 10.0


def _wait_other_nodes(jdir: Path, run: int, deadline: float) -> None:
    """Wait until every node of the allocation has published its stop report, or deadline."""
    want = nf.node_count(os.environ)
    while time.monotonic() < deadline:
        done = [r for r in nf.read_records(jdir, run) if r.stop is not None]
        if len(done) >= want:
            return
        _reap_all()
        time.sleep(0.1)


def _record(
    jdir: Path,
    run: int,
    target: Target,
    stop: JsonObject | None = None,
    *,
    sweep: bool = False,
    members: list[Member] | None = None,
    exit_code: int | None = None,
    stopped: bool | None = None,
) -> None:
    """Publish this node's view in the job directory (a shared file system under Slurm):
    its agent and main, its live members, and, at the end, its own stop report and how its
    run ended (``exit_code``, ``stopped``).

    A sweep job (``sweep``) adds its report to what the node's agent had published: the
    node keeps its rank (its log's name depends on it), agent and main.
    """
    if members is None:
        members = [] if stop is not None else _members(target)
    rec = nf.NodeRecord(
        node=node_name(),
        host=socket.gethostname(),
        rank=os.environ.get("SLURM_NODEID"),
        at=time.time(),
        agent=target.supervisor.pid if target.supervisor else None,
        main=target.main.pid if target.main else None,
        members=tuple(nf.node_process(m.stat) for m in members[:256]),
        member_count=len(members),
        stop=stop,
        exit_code=exit_code,
        stopped=stopped,
    )
    nf.write_record(jdir, run, rec, keep_from_agent=sweep)


def _members(target: Target) -> list[Member]:
    return sorted(alive(scan_light(target)).values(), key=_pid)


def _pid(m: Member) -> int:
    return m.stat.pid


def _supervise(jdir: Path, ckpt_signal: str, target: Target, main_pid: int, run: int) -> int | None:
    """Reap, publish, forward checkpoint requests until main exits or a stop is asked."""
    request = nf.slurm_dir(jdir) / nf.CHECKPOINT_REQUEST
    stop_file = nf.slurm_dir(jdir) / nf.STOP_REQUEST
    seen, stop_seen = mtime(request), mtime(stop_file)
    published = looked = time.monotonic()
    last: set[int] = set()
    while not _stop["asked"]:
        now = time.monotonic()
        if now - looked >= CHANGE_S:
            looked = now
            members = _members(target)
            pids = {m.stat.pid for m in members}
            if pids != last or now - published >= PUBLISH_S:
                published, last = now, pids
                with contextlib.suppress(OSError, StateError):  # a full disk costs the view
                    _record(jdir, run, target, members=members)
        if mtime(stop_file) > stop_seen:  # `trainctl stop`: our own graceful, ordered stop
            _stop["asked"] = _stop["by_request"] = True
            return None
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid == main_pid:
            return status
        if pid:
            continue
        if mtime(request) > seen:
            seen = mtime(request)
            _forward_checkpoint(target, signal.Signals[ckpt_signal])
        time.sleep(0.1)
    return None


def _forward_checkpoint(target: Target, sig: signal.Signals) -> None:
    for m in alive(scan(target)).values():
        if procfs.catches(m.stat.pid, sig):
            procfs.send_signal(m.stat.pid, m.stat.start_ticks, sig)


def _wait_main(pid: int) -> int | None:
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None


def _reap_all() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
