"""The Slurm backend: the same operations, driving sbatch / scontrol / scancel / srun.

trainctl does not grow its own multi-host orchestrator. A Slurm job is a batch script
(kept in the job directory) whose single step runs trainctl's node agent on every node
(``srun python -m trainctl.supervisor.node``), so the marker, subreaper and log
guarantees hold inside the allocation too.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

from trainctl.launcher.backends import (
    Asked,
    Capabilities,
    RunWatch,
    StartRequest,
    StopRequest,
)
from trainctl.launcher.checkpoint import wait_new_checkpoint
from trainctl.launcher.results import (
    Checkpoint,
    NodeStop,
    PsRow,
    Seen,
    SlurmAgent,
    SlurmStopReport,
    SlurmVerdict,
    SlurmView,
    StartResult,
    StopResult,
)
from trainctl.launcher.specfile import SpecDraft
from trainctl.supervisor.errors import ConfigError, JobConflictError, StateError, TrainctlError
from trainctl.supervisor.linux.poll import poll_until
from trainctl.supervisor.model import events, state
from trainctl.supervisor.model import nodefiles as nf
from trainctl.supervisor.model.reports import StopReport
from trainctl.supervisor.model.sections import SlurmRecord
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import JobState, Phase
from trainctl.supervisor.records import asdict, replace
from trainctl.supervisor.tree.proctree import Target, alive, scan
from trainctl.supervisor.tree.stop import run_stop

from .ctl import (
    agent_argv,
    query,
    record,
    run_tool,
    scancel,
    submit,
    tool,
)


def local_target(st: JobState) -> Target:
    """The marker net alone: what of the job runs on this node."""
    return Target(marker=st.marker)


def _stop_slurm(
    jdir: Path, st: JobState, spec: Spec, grace_s: float, order: str
) -> SlurmStopReport:
    """Ask the node agents to stop, else scancel; wait, escalate, verify (queue + node)."""
    t0 = time.monotonic()
    info = query(st)
    ended = info.phase.ended or info.phase == Phase.LOST
    if ended and not _silent_nodes(jdir, st.run) and not alive(scan(local_target(st))):
        return SlurmStopReport(info, spec.stop.signal, grace_s, ok=True, already_stopped=True)
    cancelled = False
    if not ended and info.phase == Phase.RUNNING:
        # Ask the node agents themselves (through the job directory, as for checkpoints):
        # each runs trainctl's own stop on its node, in the job's order, with this grace.
        # `scancel --signal` would hit every process of the step at once, loaders too.
        ask = nf.StopFile(at=time.time(), grace_s=grace_s, order=order)
        nf.write_stop_request(jdir, ask)
        fields = asdict(ask)
        events.append_event(jdir, "stop_requested", job=st.name, via="node agents", **fields)
        # the agents need their grace, their escalation and a moment to report back
        ended = _wait_left_queue(st, grace_s + spec.stop.kill_wait_s + 15)
    if not ended:
        cancelled = _scancel(jdir, st, spec, grace_s)
    # else: Slurm has ended (or forgotten) the job, but its processes outlived it
    # (a node agent SIGKILLed). A node whose agent left no report gets a sweep job; then
    # this host's own sweep: Slurm's proctrack may miss escapers (setsid), the marker not.
    swept = _sweep(jdir, st, _silent_nodes(jdir, st.run))  # read anew: agents report on stop
    local = run_stop(local_target(st), spec.with_stop(kill_wait_s=5.0), grace_s=0.5, reason="stop")
    final = query(st)
    nodes = _verify_nodes(jdir, st.run, local.ok)
    unverified = [n.node for n in nodes if not n.ok]
    report = SlurmStopReport(
        final,
        spec.stop.signal,
        grace_s,
        ok=(final.phase.ended or final.phase == Phase.LOST) and local.ok and not unverified,
        nodes=nodes,
        unverified=unverified,
        cancelled_after_grace=cancelled,
        local_leftovers=local.found,
        sweep_jobs=swept,
        survivors=local.survivors,
        total_s=round(time.monotonic() - t0, 3),
    )
    events.append_event(jdir, "stop_report", job=st.name, **report.to_doc())
    return report


def _scancel(jdir: Path, st: JobState, spec: Spec, grace_s: float) -> bool:
    """Pending, or agents that did not answer: Slurm's own signal to the job's steps, then
    after ``grace_s`` its cancel. Whether it had to cancel."""
    scancel_bin = tool("scancel")
    job_id = st.slurm.job_id if st.slurm is not None else ""
    sig = spec.stop.signal.removeprefix("SIG")
    # Not --full: the batch shell is `exec srun`, and srun answers a SIGTERM by
    # terminating the whole step at once, which would take the grace away.
    scancel([scancel_bin, f"--signal={sig}", job_id])
    events.append_event(jdir, "signal_sent", job=st.name, signal=spec.stop.signal, via="scancel")
    cancelled = not _wait_left_queue(st, grace_s)
    if cancelled:
        scancel([scancel_bin, job_id])
        events.append_event(jdir, events.Escalated(via="scancel"), job=st.name)
        _wait_left_queue(st, 60)
    return cancelled


SWEEP_WAIT_S = 60.0  # for a sweep job's allocation, its stop and its report, per node


def _silent_nodes(jdir: Path, run: int) -> list[str]:
    """The nodes whose agent has published no stop report (yet, or ever: killed)."""
    return [r.node for r in nf.read_records(jdir, run) if r.stop is None]


def _sweep(jdir: Path, st: JobState, silent: list[str]) -> list[str]:
    """Sweep, in a fresh one-node allocation each, the nodes whose agent sent no report.

    Only once Slurm has ended the job (the allocation is gone with it). Returns the nodes
    swept; a node whose sweep job could not run stays unverified in the report.
    """
    if not silent:
        return []
    srun = tool("srun")
    home = jdir.parent.parent
    agent = agent_argv(home, st.name, st.run, st.marker, "--sweep")
    done = []
    for node in silent:
        argv = [
            srun,
            f"--nodelist={node}",
            "--nodes=1",
            "--ntasks=1",
            "--immediate=30",
            f"--job-name=trainctl-sweep-{st.name}",
            "--time=5",
            *agent,
        ]
        try:
            run_tool(argv, timeout_s=SWEEP_WAIT_S)
        except TrainctlError as e:
            events.append_event(jdir, "sweep_failed", job=st.name, node=node, error=str(e))
            continue
        done.append(node)
    return done


def _verify_nodes(jdir: Path, run: int, local_ok: bool) -> list[NodeStop]:
    """Each node's own stop report, or why none proves the job gone there.

    A node agent that was killed reports nothing: its node counts as verified only when it
    is this host, where the marker sweep just ran.
    """
    here = socket.gethostname()
    nodes = []
    for rec in nf.read_records(jdir, run):
        swept_here = rec.host == here and local_ok
        stop = _node_report(rec)
        by = None
        if stop is not None:
            by = "a sweep job" if (rec.stop or {}).get("swept") else "its agent"
        elif swept_here:
            by = "this host's sweep"
        nodes.append(
            NodeStop(
                rec.node,
                ok=(stop is not None and stop.ok) or swept_here,
                found=None if stop is None else stop.found,
                killed=None if stop is None else stop.killed,
                survivors=[] if stop is None else stop.survivors,
                by=by,
            )
        )
    return nodes


def _node_report(rec: nf.NodeRecord) -> StopReport | None:
    """The stop report a node published, checked; None when it has none (or a bad one)."""
    if rec.stop is None:
        return None
    try:
        return StopReport.from_doc(rec.stop, f"node {rec.node}'s stop report")
    except StateError:
        return None  # an unreadable report proves nothing: the node stays unverified


def _wait_left_queue(st: JobState, timeout_s: float) -> bool:
    left = poll_until(lambda: True if query(st).phase.ended else None, timeout_s, 0.3)
    return left is True


class _SlurmWatch:
    """A Slurm run, watched by asking the scheduler (``Slurm.seen``) at most once a second:
    state.json is read once, for the job's id."""

    ASK_EVERY_S = 1.0

    def __init__(self, backend: Slurm, jdir: Path, run: int) -> None:
        self.backend, self.jdir, self.run = backend, jdir, run
        self.st = state.read_state(jdir)
        self.done = self.st.run != run or self.st.phase.ended
        self.asked = -self.ASK_EVERY_S

    def over(self) -> bool:
        if self.done or time.monotonic() - self.asked < self.ASK_EVERY_S:
            return self.done
        self.asked = time.monotonic()
        self.done = self.backend.seen(self.jdir, self.st).ended
        return self.done

    def final(self) -> bool:
        return self.over()  # Slurm relaunches nothing of trainctl's


class Slurm:
    """In a Slurm allocation: sbatch submits, a node agent supervises on each node."""

    kind = "slurm"
    title = "Slurm"
    can = Capabilities()  # Slurm's own tools do these on its nodes
    queues_here = False

    def check_values(self, draft: SpecDraft) -> None:
        """--gpus binds this host's GPUs; Slurm allocates its own. A line break in any
        sbatch setting would start a new line of the batch script: a shell command."""
        if draft.gpus:
            raise ConfigError("--gpus binds local GPUs; with --backend slurm use --gpus-per-node")
        if draft.tty:
            raise ConfigError("--tty: a terminal to attach to is for local jobs, not Slurm's")
        settings = {"partition": [draft.partition], "time": [draft.time]}
        settings["sbatch_args"] = list(draft.sbatch_args or [])
        for key, items in settings.items():
            for item in items:
                if item is not None and ("\n" in item or "\r" in item):
                    raise ConfigError(f"{key}: a line break is not allowed ({item!r})")

    def seen(self, jdir: Path, st: JobState) -> Seen:
        """Slurm's verdict, recorded the moment it is final; plus what each node reports.

        A run recorded as ended is not asked about again: Slurm forgets jobs (MinJobAge),
        and a forgotten job must stay `exited` or `failed`, not turn `lost`.
        """
        if st.phase.ended:
            final = (st.slurm.state if st.slurm is not None else None) or "ENDED"
            info = SlurmVerdict(state=final, phase=st.phase, exit_code=st.exit_code)
        else:
            info = query(st)
        nodes = nf.read_records(jdir, st.run)
        if info.phase == Phase.LOST:
            info = _agents_verdict(nodes, _num_nodes(st)) or info
        if info.phase.ended and not st.phase.ended:
            _record_final(jdir, info)
        live = [n for n in nodes if n.stop is None and n.age_s < nf.STALE_S]
        running = info.phase.live
        view = _view(st, info, nodes)
        rows = [_row(n.node, p) for n in live for p in n.members] if running else []
        count = sum(n.member_count for n in live) if running else 0
        here = socket.gethostname()
        if any(n.host == here and n.stop is None and (n.stale or not running) for n in nodes):
            # An agent of this host was killed (it stopped publishing, or the run ended
            # without its report): what it left is counted by the marker, which covers
            # every node on this host (their agents' counts are replaced by it).
            live = [n for n in live if n.host != here]
            rows = [r for r in rows if r.node not in {n.node for n in nodes if n.host == here}]
            found = alive(scan(local_target(st)))
            rows += [_row(f"{here} (marker)", nf.node_process(m.stat)) for m in found.values()]
            count = sum(n.member_count for n in live) + len(found)
        return Seen(
            info.phase,
            info.exit_code,
            "slurm",
            # LOST: Slurm has purged the job record (MinJobAge): it ended
            ended=info.phase.ended or info.phase == Phase.LOST,
            whole_job_here=False,
            slurm=view,
            members=count,
            processes=rows,
        )

    def watch_run(self, jdir: Path, run: int) -> RunWatch:
        """Slurm's verdict (``seen``), asked at most once a second."""
        return _SlurmWatch(self, jdir, run)

    def refuse_if_live(self, jdir: Path, prev: JobState) -> None:
        """The name is busy while Slurm still queues or runs the job."""
        seen = self.seen(jdir, prev)
        if not seen.ended and seen.slurm is not None:
            raise JobConflictError(
                f"job {prev.name} is {seen.slurm.state} in Slurm (job id "
                f"{seen.slurm.job_id}); stop it first or choose another name"
            )

    def start(self, req: StartRequest) -> StartResult:
        """Submit the batch script; the node agents start the job on each node."""
        st = submit(req.home, req.jdir, req.spec, req.prev)
        return StartResult(
            name=req.spec.name,
            run=st.run,
            main_pid=None,
            mode="slurm",
            log=str(state.log_path(req.jdir, st.run)),
            elapsed_s=time.monotonic() - req.t0,
            slurm_job_id=st.slurm.job_id if st.slurm is not None else None,
        )

    def stop(self, jdir: Path, st: JobState, spec: Spec, req: StopRequest) -> StopResult:
        """The node agents stop their nodes; Slurm makes sure; record the outcome."""
        order = str(req.asked_order) if req.asked_order is not None else spec.stop.order
        report = _stop_slurm(jdir, st, spec, req.grace_s, order)
        final = report.slurm
        if report.already_stopped:
            msg = f"job {st.name} is not running (Slurm: {final.state}); nothing to stop"
            return StopResult(st.name, st.run, "noop", report, final.exit_code, msg)
        new = replace(
            st,
            phase=Phase.STOPPED,
            exit_code=final.exit_code,
            ended_at=time.time(),
            last_stop=report,
            slurm=_with_state(st.slurm, final.state),
        )
        record(jdir, new)
        return StopResult(st.name, st.run, "slurm", report, final.exit_code)

    def record(self, jdir: Path, st: JobState) -> None:
        """Write state.json (ctl.record: this backend's one writer)."""
        record(jdir, st)

    def checkpoint(
        self, jdir: Path, st: JobState, spec: Spec, timeout_s: float, asked: Asked
    ) -> Checkpoint | None:
        """Ask the node agents (through the job directory) and wait for a new checkpoint."""
        asked()
        asked_at = nf.write_checkpoint_request(jdir)
        return wait_new_checkpoint(spec, asked_at, timeout_s)


BACKEND = Slurm()


def _view(st: JobState, info: SlurmVerdict, nodes: list[nf.NodeRecord]) -> SlurmView:
    """Slurm's verdict on the run and its node agents, as `status` shows them."""
    return SlurmView(
        job_id=st.slurm.job_id if st.slurm is not None else None,
        state=info.state,
        reason=info.reason,
        nodes=info.nodes,
        exit_code=info.exit_code,
        agents=[
            SlurmAgent(n.node, n.host, n.rank, n.member_count, n.age_s, n.stale, n.stop is not None)
            for n in nodes
        ],
    )


def _row(node: str, p: nf.NodeProcess) -> PsRow:
    """A process a node agent published, as a row of `ps`."""
    return PsRow(
        pid=p.pid,
        ppid=p.ppid,
        pgid=0,
        sid=0,
        state=p.state,
        cpu_percent=0.0,
        rss_bytes=0,
        escaped=False,
        nets=["agent"],
        cmd=p.cmd,
        depth=0,
        node=node,
    )


def _num_nodes(st: JobState) -> int:
    """The nodes the run was submitted for (recorded at submit; 1 for older records)."""
    return max(st.slurm.num_nodes, 1) if st.slurm is not None else 1


def _with_state(job: SlurmRecord | None, final: str) -> SlurmRecord | None:
    """The Slurm record with Slurm's final word on the job."""
    return None if job is None else replace(job, state=final)


def _agents_verdict(nodes: list[nf.NodeRecord], want: int) -> SlurmVerdict | None:
    """How the run ended, from what every node's agent published at its end; None unless
    all of them did. For a job Slurm has forgotten (MinJobAge) before anyone looked: the
    agents were there at the end, and their word is as good as Slurm's.

    As srun reports a step: the highest exit code of the nodes; a stop on any node makes
    the run `stopped` (Slurm's CANCELLED).
    """
    ended = [n for n in nodes if n.stop is not None and n.exit_code is not None]
    if not ended or len(ended) < max(want, len(nodes)):
        return None
    code = max(n.exit_code or 0 for n in ended)
    if any(n.stopped for n in ended):
        phase, name = Phase.STOPPED, "CANCELLED"
    else:
        phase, name = (Phase.EXITED, "COMPLETED") if code == 0 else (Phase.FAILED, "FAILED")
    return SlurmVerdict(
        state=name, phase=phase, reason="recorded by the node agents", exit_code=code
    )


def _record_final(jdir: Path, info: SlurmVerdict) -> None:
    """Record Slurm's final verdict, under the job lock and only if nobody holds it (a
    `stop` in progress records its own outcome); a view never waits, nor fails, for it."""
    with contextlib.suppress(OSError, TrainctlError), state.job_lock(jdir, 0.0):
        now = state.read_state(jdir)
        if not now.phase.ended:
            ended = replace(
                now,
                phase=info.phase,
                exit_code=info.exit_code,
                ended_at=time.time(),
                slurm=_with_state(now.slurm, info.state),
            )
            record(jdir, ended)
