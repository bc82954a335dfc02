"""The Slurm backend: the same verbs, driving sbatch / squeue / scontrol / scancel.

trainctl does not grow its own multi-host orchestrator. A Slurm job is a batch script
(kept in the job directory) whose single step runs trainctl's node agent on every node
(``srun python -m trainctl.supervisor.node``), so the marker, subreaper and log
guarantees hold inside the allocation too.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from trainctl.supervisor import state
from trainctl.supervisor.errors import ConfigError, StateError, TrainctlError
from trainctl.supervisor.proctree import Target, alive, scan
from trainctl.supervisor.spec import Spec, spec_to_doc
from trainctl.supervisor.state import JobState, Phase
from trainctl.supervisor.stop import run_stop

SLURM_PHASES = {
    "PENDING": Phase.STARTING,
    "CONFIGURING": Phase.STARTING,
    "REQUEUED": Phase.STARTING,
    "RUNNING": Phase.RUNNING,
    "SUSPENDED": Phase.RUNNING,
    "COMPLETING": Phase.STOPPING,
    "STOPPED": Phase.RUNNING,
    "COMPLETED": Phase.EXITED,
    "CANCELLED": Phase.STOPPED,
}


class SlurmError(TrainctlError):
    """A Slurm command failed; the message carries Slurm's own reason."""


class SlurmUnreachableError(StateError):
    """The controller does not answer: the job's state is unknown (exit 4), not wrong."""


# How long a query of the controller may take before trainctl says it is unreachable:
# scontrol itself retries for tens of seconds, and every verb must answer in a few.
QUERY_TIMEOUT_S = 5.0


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SlurmError(
            f"{name} not found: install the Slurm client (slurm-client) or drop --backend slurm"
        )
    return path


def _run(argv: list[str], env: dict[str, str] | None = None, timeout_s: float = 90) -> str:
    try:
        p = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise SlurmUnreachableError(
            f"Slurm controller {controller()} did not answer {Path(argv[0]).name} within "
            f"{timeout_s:g} s; the job's state is unknown until it does"
        ) from None
    if p.returncode != 0:
        raise SlurmError(_reason(p.stderr) or f"{Path(argv[0]).name} failed ({p.returncode})")
    return p.stdout


def _reason(stderr: str) -> str:
    """Slurm's own reason, in one line (not the `Try "sbatch --help"` that may follow it)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("Try ")] or lines
    for ln in reversed(lines):
        if "Unable to contact slurm controller" in ln:
            return (
                f"Slurm controller {controller()} unreachable (Unable to contact slurm controller)"
            )
        if "failed:" in ln or "error:" in ln:
            return "Slurm: " + ln.split("error:", 1)[-1].strip()
    return "Slurm: " + lines[-1] if lines else ""


def controller() -> str:
    """The controller's host as slurm.conf names it (for error lines), else 'slurmctld'."""
    conf = Path(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    try:
        for line in conf.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip().lower() in ("slurmctldhost", "controlmachine") and value.strip():
                return value.split("(")[0].split()[0].strip()
    except OSError:
        pass
    return "slurmctld"


def agent_argv(home: Path, name: str, run: int, marker: str, *extra: str) -> list[str]:
    """The node agent's command line (see supervisor/node.py)."""
    return [
        sys.executable,
        "-m",
        "trainctl.supervisor.node",
        *("--home", str(home), "--name", name, "--run", str(run), "--marker", marker),
        *extra,
    ]


def batch_script(home: Path, jdir: Path, spec: Spec, run: int, marker: str) -> str:
    """Return the sbatch script of one run."""
    opts = spec.slurm or {}
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=trainctl-{spec.name}",
        f"#SBATCH --output={state.log_path(jdir, run)}",
        "#SBATCH --open-mode=append",
        f"#SBATCH --nodes={opts.get('nodes', 1)}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --chdir={spec.cwd}",
    ]
    if opts.get("partition"):
        lines.append(f"#SBATCH --partition={opts['partition']}")
    if opts.get("time"):
        lines.append(f"#SBATCH --time={opts['time']}")
    if opts.get("gpus_per_node"):
        lines.append(f"#SBATCH --gpus-per-node={opts['gpus_per_node']}")
    lines += [f"#SBATCH {arg}" for arg in opts.get("sbatch_args", ())]
    agent = agent_argv(home, spec.name, run, marker)
    lines += [
        "# the batch host is the allocation's first node: the rendezvous host (MASTER_ADDR)",
        'export TRAINCTL_MASTER_ADDR="$(hostname)"',
        "# one trainctl node agent per node; it runs and supervises the job's argv",
        f"exec srun --kill-on-bad-exit=1 {shlex.join(agent)}",
        "",
    ]
    return "\n".join(lines)


def submit(home: Path, jdir: Path, spec: Spec, prev: JobState | None) -> JobState:
    """Write the batch script, submit it, record the Slurm job id; return the new state."""
    sbatch = _tool("sbatch")
    run = prev.run + 1 if prev else 1
    marker = uuid.uuid4().hex
    state.write_json_atomic(jdir / "spec.json", spec_to_doc(spec))
    script = jdir / "slurm" / f"run-{run}.sbatch"
    script.parent.mkdir(mode=0o700, exist_ok=True)
    (jdir / "logs").mkdir(mode=0o700, exist_ok=True)
    state.write_bytes_atomic(script, batch_script(home, jdir, spec, run, marker).encode())
    out = _run([sbatch, "--parsable", str(script)], env=spec.env, timeout_s=30)
    job_id = out.strip().split(";")[0]
    st = JobState(
        name=spec.name,
        run=run,
        phase=Phase.STARTING,
        marker=marker,
        started_at=time.time(),
        backend="slurm",
        slurm={"job_id": job_id, "script": str(script), "submitted_at": time.time()},
    )
    state.write_state(jdir, st)
    state.append_event(jdir, "submitted", job=spec.name, run=run, slurm_job_id=job_id)
    return st


def query(st: JobState) -> dict[str, Any]:
    """Return {state, reason, nodes, exit_code, phase} for the job's Slurm id."""
    job_id = (st.slurm or {}).get("job_id")
    if not job_id:
        raise ConfigError(f"job {st.name} has no Slurm job id")
    try:
        out = _run([_tool("scontrol"), "show", "job", "-o", str(job_id)], timeout_s=QUERY_TIMEOUT_S)
    except SlurmError as e:
        if "unreachable" in str(e):
            raise SlurmUnreachableError(str(e)) from None
        out = ""  # "Invalid job id": Slurm has purged it; accounting may still know
    fields = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
    if not fields:
        fields = _sacct(str(job_id))
    slurm_state = fields.get("JobState", "UNKNOWN").split()[0]
    code = fields.get("ExitCode", "")
    rc: int | None = None
    if ":" in code:
        status, sig = (int(x) for x in code.split(":")[:2])
        rc = 128 + sig if sig else status
    phase = SLURM_PHASES.get(slurm_state, Phase.FAILED if slurm_state != "UNKNOWN" else Phase.LOST)
    if phase == Phase.EXITED and rc:
        phase = Phase.FAILED
    if phase not in state.TERMINAL:
        rc = None  # Slurm says 0:0 while running
    return {
        "state": slurm_state,
        "reason": fields.get("Reason"),
        "nodes": fields.get("NodeList"),
        "exit_code": rc,
        "phase": phase,
    }


def _scancel(argv: list[str]) -> None:
    """scancel, where "Invalid job id" means the job already left the queue: not an error."""
    try:
        _run(argv, timeout_s=2 * QUERY_TIMEOUT_S)
    except SlurmError as e:
        if "invalid job id" not in str(e).lower():
            raise


def _sacct(job_id: str) -> dict[str, str]:
    try:
        out = _run(
            [_tool("sacct"), "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode"],
            timeout_s=QUERY_TIMEOUT_S,
        )
    except SlurmError:
        return {}
    line = out.strip().splitlines()[:1]
    if not line:
        return {}
    st, _, code = line[0].partition("|")
    return {"JobState": st, "ExitCode": code}


def local_target(st: JobState) -> Target:
    """The marker net alone: what of the job runs on this node."""
    return Target(marker=st.marker)


def stop(
    jdir: Path, st: JobState, spec: Spec, grace_s: float, order: str | None = None
) -> dict[str, Any]:
    """Ask the node agents to stop, else scancel; wait, escalate, verify (queue + node)."""
    t0 = time.monotonic()
    scancel = _tool("scancel")
    job_id = str((st.slurm or {})["job_id"])
    info = query(st)
    ended = info["phase"] in state.TERMINAL or info["phase"] == Phase.LOST
    silent = _silent_nodes(jdir, st.run)
    if ended and not silent and not alive(scan(local_target(st))):
        return {"ok": True, "already_stopped": True, "slurm": info}
    cancelled = False
    if not ended and info["phase"] == Phase.RUNNING:
        # Ask the node agents themselves (through the job directory, as for checkpoints):
        # each runs trainctl's own stop on its node, in the job's order, with this grace.
        # `scancel --signal` would hit every process of the step at once, loaders too.
        request = {"at": time.time(), "grace_s": grace_s, "order": order or spec.stop.order}
        state.write_json_atomic(jdir / "slurm" / "stop-request", request)
        state.append_event(jdir, "stop_requested", job=st.name, via="node agents", **request)
        # the agents need their grace, their escalation and a moment to report back
        ended = _wait_left_queue(st, grace_s + spec.stop.kill_wait_s + 15)
    if not ended:
        sig = spec.stop.signal.removeprefix("SIG")
        # Pending, or agents that did not answer: Slurm's own signal to the job's steps.
        # Not --full: the batch shell is `exec srun`, and srun answers a SIGTERM by
        # terminating the whole step at once, which would take the grace away.
        _scancel([scancel, f"--signal={sig}", job_id])
        state.append_event(jdir, "signal_sent", job=st.name, signal=spec.stop.signal, via="scancel")
        cancelled = not _wait_left_queue(st, grace_s)
        if cancelled:
            _scancel([scancel, job_id])
            state.append_event(jdir, "escalated", job=st.name, via="scancel")
            _wait_left_queue(st, 60)
    # else: Slurm has ended (or forgotten) the job, but its processes outlived it
    # (a node agent SIGKILLed). A node whose agent left no report gets a sweep job; then
    # this host's own sweep: Slurm's proctrack may miss escapers (setsid), the marker not.
    swept = _sweep(jdir, st, _silent_nodes(jdir, st.run))  # read anew: agents report on stop
    local = run_stop(local_target(st), spec.with_stop(kill_wait_s=5.0), grace_s=0.5, reason="stop")
    final = query(st)
    nodes, unverified = _verify_nodes(jdir, st.run, local.ok)
    report = {
        "ok": (final["phase"] in state.TERMINAL or final["phase"] == Phase.LOST)
        and local.ok
        and not unverified,
        "nodes": nodes,
        "unverified": unverified,
        "slurm": final,
        "cancelled_after_grace": cancelled,
        "local_leftovers": local.found,
        "sweep_jobs": swept,
        "survivors": local.survivors,
        "total_s": round(time.monotonic() - t0, 3),
        "signal": spec.stop.signal,
        "grace_s": grace_s,
        "mode": "slurm",
    }
    state.append_event(jdir, "stop_report", job=st.name, **report)
    return report


SWEEP_WAIT_S = 60.0  # for a sweep job's allocation, its stop and its report, per node


def _silent_nodes(jdir: Path, run: int) -> list[str]:
    """The nodes whose agent has published no stop report (yet, or ever: killed)."""
    return [r["node"] for r in node_records(jdir, run) if not isinstance(r.get("stop"), dict)]


def _sweep(jdir: Path, st: JobState, silent: list[str]) -> list[str]:
    """Sweep, in a fresh one-node allocation each, the nodes whose agent sent no report.

    Only once Slurm has ended the job (the allocation is gone with it). Returns the nodes
    swept; a node whose sweep job could not run stays unverified in the report.
    """
    if not silent:
        return []
    srun = _tool("srun")
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
            _run(argv, timeout_s=SWEEP_WAIT_S)
        except TrainctlError as e:
            state.append_event(jdir, "sweep_failed", job=st.name, node=node, error=str(e))
            continue
        done.append(node)
    return done


def _verify_nodes(jdir: Path, run: int, local_ok: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """Each node's own stop report; the nodes none of which proves the job gone there.

    A node agent that was killed reports nothing: its node counts as verified only when it
    is this host, where the marker sweep just ran.
    """
    here = socket.gethostname()
    nodes, unverified = [], []
    for rec in node_records(jdir, run):
        stop = rec.get("stop") if isinstance(rec.get("stop"), dict) else None
        swept_here = rec.get("host") == here and local_ok
        ok = bool(stop and stop.get("ok")) or swept_here
        by = None
        if stop:
            by = "a sweep job" if stop.get("swept") else "its agent"
        elif swept_here:
            by = "this host's sweep"
        nodes.append(
            {
                "node": rec["node"],
                "ok": ok,
                "found": stop.get("found") if stop else None,
                "killed": stop.get("killed") if stop else None,
                "survivors": stop.get("survivors", []) if stop else [],
                "by": by,
            }
        )
        if not ok:
            unverified.append(rec["node"])
    return nodes, unverified


def _wait_left_queue(st: JobState, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if query(st)["phase"] in state.TERMINAL:
            return True
        time.sleep(0.3)
    return query(st)["phase"] in state.TERMINAL


def request_checkpoint(jdir: Path) -> float:
    """Ask every node agent to forward the checkpoint signal to its catching processes."""
    state.write_bytes_atomic(jdir / "slurm" / "checkpoint-request", str(time.time()).encode())
    return time.time()


def describe_stop(name: str, run: int, report: dict[str, Any]) -> str:
    """The human report of a Slurm stop (the CLI prints it as the stop's message)."""
    from .render import survivor_line  # noqa: PLC0415

    sl = report.get("slurm", {})
    how = (
        "did not leave the queue within the grace: cancelled (scancel)"
        if report.get("cancelled_after_grace")
        else "left the queue within the grace"
    )
    lines = [
        f"stopped {name} run {run} via slurm (job {sl.get('state')}, "
        f"exit code {sl.get('exit_code')})",
        f"  {report['signal']:<10} through each node's agent; the job {how} "
        f"({report['grace_s']:g} s grace)",
        f"  this node  {report.get('local_leftovers', 0)} leftover process(es) of the job "
        "stopped by marker (what Slurm's proctrack missed)",
        *(
            f"  node {n['node']:<8} "
            + (
                f"nothing left ({n['by']}: {n['found']} found, {n['killed']} SIGKILLed)"
                if n["ok"] and n["found"] is not None
                else f"nothing left ({n['by']})"
                if n["ok"]
                else "NOT VERIFIED: its agent sent no stop report"
            )
            for n in report.get("nodes", [])
        ),
        *(survivor_line(s) for s in report.get("survivors", [])),
        f"  total      {report['total_s']:.2f} s — "
        + ("nothing of the job is alive" if report.get("ok") else "the job did NOT end cleanly"),
    ]
    return "\n".join(lines)


# A node's record older than this is stale: its agent stopped publishing (gone, or hung).
STALE_S = 10.0


def node_records(jdir: Path, run: int) -> list[dict[str, Any]]:
    """What each node agent published about run ``run`` (members, stop report), by node."""
    out = []
    for path in sorted((jdir / "slurm").glob(f"run-{run}.*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("node"), str):
            doc["age_s"] = round(max(0.0, time.time() - float(doc.get("at") or 0)), 1)
            out.append(doc)
    return out
