"""`stack`: the Python stack of every process of a job, read with py-spy, grouped.

py-spy (MIT, a ~3 MB binary wheel, a default dependency; run by supervisor/tree/stacks.py)
reads another process's memory through ptrace; it pauses each process for a moment and
signals nothing. The members are the job's own (every net, pid + start time): a pid that
was reused while it was read is dropped, never shown as the job's. Each process is read
in parallel, so a job's stacks take about as long as its slowest process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from trainctl.launcher import backends
from trainctl.launcher.results import Frame, Skipped, StackGroup, StackReport, StackThread
from trainctl.supervisor.errors import ConfigError, ProcessTreeError
from trainctl.supervisor.gpu.holders import read_env_var
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model import state
from trainctl.supervisor.tree import stacks
from trainctl.supervisor.tree.proctree import alive, scan, target_of

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
    if not (b := backends.of(st)).can.local_stacks:
        raise ConfigError(f"job {name} runs under {b.title}: run `trainctl stack` on its nodes")
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
        add_threads(report, m.stat.pid, cmd, payload)
    if refused and not report.groups:
        raise ProcessTreeError(_ptrace_fix(refused))
    report.elapsed_s = round(time.monotonic() - t0, 3)
    return report


def _why(err: str) -> str:
    if NOT_PYTHON in err:
        return "not a Python process"
    if any(word in err for word in PTRACE_REFUSED):
        return "ptrace refused"
    lines = [ln.strip() for ln in err.splitlines() if ln.strip().startswith("Error")]
    return lines[0] if lines else err.strip().splitlines()[0] if err.strip() else "py-spy failed"


CAP_SYS_PTRACE = 19


def _status_field(pid: int | str, key: str) -> str | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _ptrace_fix(pids: list[int]) -> str:
    """Why ptrace was refused, and only the advice that applies: a tracer already on the
    process (one tracer at a time), a container without CAP_SYS_PTRACE, Yama's scope, or
    a process of another user."""
    why: list[str] = []
    tracers = {p: t for p in pids if (t := _status_field(p, "TracerPid")) not in (None, "0")}
    if tracers:
        pid, tracer = next(iter(tracers.items()))
        comm = procfs.read_cmdline(int(tracer))[:60] or "?"
        why.append(
            f"pid {pid} is already traced by pid {tracer} ({comm}): a process takes one "
            "tracer at a time; detach that one (end the strace or debugger) and run it again"
        )
    caps = int(_status_field("self", "CapEff") or "0", 16)
    if not caps >> CAP_SYS_PTRACE & 1 and os.geteuid() == 0:
        why.append("this process lacks CAP_SYS_PTRACE: give the container that capability")
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        scope = None  # no Yama: it refuses nothing
    if scope not in (None, "0") and not tracers:
        fix = (
            "no process may be traced until reboot (scope 3)"
            if scope == "3"
            else "run `trainctl stack` as root (sudo), or `sysctl kernel.yama.ptrace_scope=0`"
        )
        why.append(f"kernel.yama.ptrace_scope = {scope}: {fix}")
    others = [p for p in pids if procfs.read_uid(p) not in (None, os.geteuid())]
    if others and os.geteuid() != 0:
        why.append(f"pid {others[0]} belongs to another user: run as that user or as root")
    return f"ptrace refused for {len(pids)} process(es): " + (
        "; ".join(why) or "py-spy could not attach (see `trainctl stack --json`)"
    )


def add_threads(report: StackReport, pid: int, cmd: str, threads: Any) -> None:
    """File each thread (py-spy's JSON) of process ``pid`` under the group of its exact
    stack: `trainctl stack`, and the stacks the supervisor wrote (the web page)."""
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
