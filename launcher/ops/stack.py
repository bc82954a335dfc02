"""`stack`: the Python stack of every process of a job, read with py-spy, grouped.

py-spy (MIT, a ~3 MB binary wheel, a default dependency; run by supervisor/stacks.py)
reads another process's memory through ptrace; it pauses each process for a moment and
signals nothing. The members are the job's own (every net, pid + start time): a pid that
was reused while it was read is dropped, never shown as the job's. Each process is read
in parallel, so a job's stacks take about as long as its slowest process.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trainctl.launcher import backends
from trainctl.launcher.results import Frame, Skipped, StackGroup, StackReport, StackThread
from trainctl.supervisor import procfs, stacks, state
from trainctl.supervisor.errors import ConfigError, ProcessTreeError
from trainctl.supervisor.gpu.holders import read_env_var
from trainctl.supervisor.proctree import Member, alive, scan, target_of

from .jobs import existing_job

NOT_PYTHON = "Failed to find python version"
PTRACE_REFUSED = ("Permission denied", "Operation not permitted", "ptrace")


def pyspy_path() -> str:
    """py-spy, or one line saying how to install it."""
    found = stacks.pyspy_path()
    if found is None:
        raise ConfigError(stacks.MISSING)
    return found


def job_stacks(home: Path, name: str, *, native: bool = False) -> StackReport:
    """Read every live member's Python stack; group identical stacks."""
    t0 = time.monotonic()
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    if backends.of(st).kind != "local":
        raise ConfigError(f"job {name} runs under Slurm: run `trainctl stack` on its nodes")
    members = sorted(alive(scan(target_of(st))).values(), key=lambda m: m.stat.pid)
    tool = pyspy_path()
    dumps = stacks.dump(tool, [m.stat.pid for m in members], native=native)
    report = StackReport(name, st.run)
    refused = []
    for m in members:
        cmd = procfs.read_cmdline(m.stat.pid)[:200] or f"[{m.stat.comm}]"
        ok, payload = dumps[m.stat.pid]
        now = procfs.read_stat(m.stat.pid)
        if now is None or now.start_ticks != m.stat.start_ticks:
            continue  # it exited (its pid may be someone else's now): not the job's any more
        if not ok:
            why = _why(payload)
            refused += [m.stat.pid] if why.startswith("ptrace") else []
            report.skipped.append(Skipped(m.stat.pid, cmd, why))
            continue
        _add_threads(report, m, cmd, payload)
    if refused and not report.groups:
        raise ProcessTreeError(_ptrace_fix(len(refused)))
    report.elapsed_s = round(time.monotonic() - t0, 3)
    return report


def _why(err: str) -> str:
    if NOT_PYTHON in err:
        return "not a Python process"
    if any(word in err for word in PTRACE_REFUSED):
        return "ptrace refused"
    lines = [ln.strip() for ln in err.splitlines() if ln.strip().startswith("Error")]
    return lines[0] if lines else err.strip().splitlines()[0] if err.strip() else "py-spy failed"


def _ptrace_fix(n: int) -> str:
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        scope = "?"
    return (
        f"ptrace refused for {n} process(es) (kernel.yama.ptrace_scope = {scope}): run "
        "`trainctl stack` as root (sudo), set `sysctl kernel.yama.ptrace_scope=0`, or give "
        "the container CAP_SYS_PTRACE"
    )


def _add_threads(report: StackReport, m: Member, cmd: str, threads: Any) -> None:
    """File each thread of ``m`` under the group of its exact stack."""
    pid = m.stat.pid
    rank, local = read_env_var(pid, "RANK"), read_env_var(pid, "LOCAL_RANK")
    for t in threads if isinstance(threads, list) else []:
        frames = [
            Frame(
                str(f.get("name", "?")),
                str(f.get("short_filename") or f.get("filename")),
                f.get("line"),
            )
            for f in t.get("frames", [])
            if isinstance(f, dict)
        ]
        label = t.get("thread_name") or str(t.get("os_thread_id") or t.get("thread_id"))
        thread = StackThread(pid, str(label), cmd, rank, local)
        for g in report.groups:
            if g.frames == frames:
                g.threads.append(thread)
                break
        else:
            report.groups.append(StackGroup(frames, [thread]))
