"""Slurm's own commands, run for the Slurm backend: sbatch, scontrol, sacct, scancel.

Every call has a deadline (a controller that does not answer is "state unknown", exit 4,
never a hang), and Slurm's error text is cut to its one line of reason.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from trainctl.launcher.config import load_config
from trainctl.launcher.results import SlurmVerdict
from trainctl.supervisor import ids
from trainctl.supervisor.errors import ConfigError, StateError, TrainctlError
from trainctl.supervisor.model import events, state
from trainctl.supervisor.model.sections import SlurmRecord
from trainctl.supervisor.model.spec import Spec, spec_to_doc
from trainctl.supervisor.model.state import JobState, Phase

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


@functools.cache
def query_timeout_s() -> float:
    """How long a query of the controller may take before trainctl says it is unreachable
    (`[slurm] query_timeout`, 5 s): scontrol itself retries for tens of seconds, and every
    verb must answer in a few."""
    return load_config().slurm_query_timeout_s


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SlurmError(
            f"{name} not found: install the Slurm client (slurm-client) or drop --backend slurm"
        )
    return path


def run_tool(argv: list[str], env: dict[str, str] | None = None, timeout_s: float = 90) -> str:
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
    sbatch = tool("sbatch")
    run = prev.run + 1 if prev else 1
    marker = ids.new_marker()
    state.write_json_atomic(state.JobDir(jdir).spec, spec_to_doc(spec))
    script = jdir / "slurm" / f"run-{run}.sbatch"
    script.parent.mkdir(mode=0o700, exist_ok=True)
    (jdir / "logs").mkdir(mode=0o700, exist_ok=True)
    state.write_bytes_atomic(script, batch_script(home, jdir, spec, run, marker).encode())
    out = run_tool([sbatch, "--parsable", str(script)], env=spec.env, timeout_s=30)
    job_id = out.strip().split(";")[0]
    new = JobState(
        name=spec.name,
        run=run,
        phase=Phase.STARTING,
        marker=marker,
        started_at=time.time(),
        backend="slurm",
        slurm=SlurmRecord(
            job_id=job_id,
            script=str(script),
            submitted_at=time.time(),
            num_nodes=int((spec.slurm or {}).get("nodes", 1)),
        ),
    )
    record(jdir, new)
    events.append_event(jdir, "submitted", job=spec.name, run=run, slurm_job_id=job_id)
    return new


def query(st: JobState) -> SlurmVerdict:
    """Return Slurm's state, reason, nodes, exit code and our phase for the job's id."""
    job_id = st.slurm.job_id if st.slurm is not None else None
    if not job_id:
        raise ConfigError(f"job {st.name} has no Slurm job id")
    try:
        argv = [tool("scontrol"), "show", "job", "-o", str(job_id)]
        out = run_tool(argv, timeout_s=query_timeout_s())
    except SlurmError as e:
        if "unreachable" in str(e):
            raise SlurmUnreachableError(str(e)) from None
        out = ""  # "Invalid job id": Slurm has purged it; accounting may still know
    fields = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
    if not fields:
        fields = _sacct(str(job_id))
    slurm_state = (fields.get("JobState") or "UNKNOWN").split()[0]
    code = fields.get("ExitCode", "")
    rc: int | None = None
    if ":" in code:
        status, sig = (int(x) for x in code.split(":")[:2])
        rc = 128 + sig if sig else status
    phase = SLURM_PHASES.get(slurm_state, Phase.FAILED if slurm_state != "UNKNOWN" else Phase.LOST)
    if phase == Phase.EXITED and rc:
        phase = Phase.FAILED
    if not phase.ended:
        rc = None  # Slurm says 0:0 while running
    return SlurmVerdict(
        state=slurm_state,
        phase=phase,
        reason=fields.get("Reason"),
        nodes=fields.get("NodeList"),
        exit_code=rc,
    )


def scancel(argv: list[str]) -> None:
    """scancel, where "Invalid job id" means the job already left the queue: not an error."""
    try:
        run_tool(argv, timeout_s=2 * query_timeout_s())
    except SlurmError as e:
        if "invalid job id" not in str(e).lower():
            raise


def _sacct(job_id: str) -> dict[str, str]:
    try:
        out = run_tool(
            [tool("sacct"), "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode"],
            timeout_s=query_timeout_s(),
        )
    except SlurmError:
        return {}
    line = out.strip().splitlines()[:1]
    if not line:
        return {}
    st, _, code = line[0].partition("|")
    return {"JobState": st, "ExitCode": code}


def record(jdir: Path, st: JobState) -> None:
    """The Slurm backend's one writer of state.json (no supervisor of trainctl's own runs
    a Slurm job: its node agents write files of their own, model/nodefiles.py)."""
    state.write_state(jdir, st)
