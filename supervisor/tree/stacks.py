"""Python stacks of a job's processes, read with py-spy: the one runner of py-spy.

Used by `trainctl stack`, and by the supervisor at the two moments a run is seen stuck:
when the stall watchdog first fires (``jobs/<name>/stacks/run-N.stall.json``) and when a
stop's grace has run out, before the SIGKILL (``run-N.before-kill.json``), so a hung
rank is seen before it is killed. Reading a stack pauses a process for a moment through
ptrace and signals nothing. Without py-spy (a dependency where it has a wheel) the stop
and the watchdog go on exactly as before and write no file (the report's ``stacks`` stays empty).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model.state import ProcRef, helper_env, stacks_path, write_json_atomic

DUMP_TIMEOUT_S = 10.0  # a hung ptrace must not hang `stack`
BEFORE_KILL_TIMEOUT_S = 3.0  # what reading the stacks may add to a stop that ran out of grace


_WHEELS = ("x86_64", "aarch64")  # the machines py-spy publishes Linux wheels for
MISSING = (
    "trainctl stack needs py-spy, a dependency of trainctl: "
    + (
        "it is not in this environment (installed without dependencies?): pip install py-spy"
        if os.uname().machine in _WHEELS
        else "it has no wheel for this machine: pip install py-spy (builds from source with Rust)"
    )
    + ", or put a py-spy binary on PATH"
)


def pyspy_path() -> str | None:
    """The py-spy next to this interpreter (the extra's console script), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def dump(
    tool: str,
    pids: list[int],
    *,
    native: bool = False,
    timeout_s: float = DUMP_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> dict[int, tuple[bool, Any]]:
    """Run one py-spy per pid, all at once: (True, its JSON) or (False, its error text).

    ``env``: the supervisor passes its helpers' environment (state.helper_env), so that
    no membership net takes a py-spy it started for a member of the job.
    """
    procs = {}
    for pid in pids:
        argv = [tool, "dump", "--pid", str(pid), "--json", *(["--native"] if native else [])]
        procs[pid] = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env
        )
    out: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout_s
    for pid, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()  # our own child, not yet reaped: its pid cannot have been reused
            p.communicate()
            out[pid] = (False, f"py-spy did not answer within {timeout_s:g} s")
            continue
        if p.returncode == 0:
            try:
                out[pid] = (True, json.loads(stdout))
                continue
            except ValueError:
                stderr = b"py-spy printed no JSON"
        out[pid] = (False, stderr.decode(errors="replace"))
    return out


def before_kill_writer(jdir: Path, run: int, marker: str) -> Callable[[list[ProcRef]], str | None]:
    """A stop's hook: write the survivors' stacks to the job directory; return the path."""
    return stacks_writer(jdir, run, "before-kill", marker)


def stacks_writer(
    jdir: Path, run: int, moment: str, marker: str
) -> Callable[[list[ProcRef]], str | None]:
    """Write the stacks of the given processes for ``moment``; return the path (or None)."""

    def write(refs: list[ProcRef]) -> str | None:
        tool = pyspy_path()
        if tool is None or not refs:
            return None
        pids = [r.pid for r in refs[:64]]
        found = dump(tool, pids, timeout_s=BEFORE_KILL_TIMEOUT_S, env=helper_env(marker))
        doc = {
            "at": time.time(),
            "run": run,
            "processes": [
                {
                    "pid": r.pid,
                    "cmd": procfs.read_cmdline(r.pid)[:200],
                    "threads": found[r.pid][1] if found[r.pid][0] else [],
                    "error": None if found[r.pid][0] else str(found[r.pid][1]).strip()[:300],
                }
                for r in refs[:64]
            ],
        }
        path = stacks_path(jdir, run, moment)
        try:
            path.parent.mkdir(mode=0o700, exist_ok=True)
            write_json_atomic(path, doc, durable=False)
        except OSError:
            return None  # a full disk costs the stacks, never the stop
        return str(path)

    return write
