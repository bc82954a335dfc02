"""Run one event's hook and tell the notify URL, in a process of its own.

The supervisor starts ``python -m trainctl.supervisor.life.hookrun`` with the event on stdin and
never waits for it: a hook can neither delay a stop, a restart or the supervisor's exit,
nor be killed by the job's own stop (it runs in its own session, outside the job's cgroup,
and carries ``TRAINCTL_HELPER`` so no membership net takes it for a member). What the hook
printed and how it ended go to the job's events.jsonl, once: nothing is retried.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from trainctl.supervisor.errors import StateError
from trainctl.supervisor.model.events import append_event
from trainctl.supervisor.model.state import open_in, write_bytes_atomic
from trainctl.supervisor.model.tail import tail_text
from trainctl.supervisor.records import JsonObject

from .hooks import HookJob

OUTPUT_CHARS = 2000  # what of a hook's output goes into its event line
NOTIFY_TIMEOUT_S = 10.0


def run_command(job: HookJob, argv: list[str], env: dict[str, str]) -> JsonObject:
    """Run the hook with its timeout; return what its event line records."""
    jdir = Path(job.jdir)
    out = jdir / "hooks" / f"run-{job.run}.{job.event}.out"
    t0 = time.monotonic()
    fd = open_in(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=job.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as e:
        return {"ok": False, "error": f"cannot run {argv[0]}: {e.strerror}"}
    finally:
        os.close(fd)
    try:
        code = proc.wait(timeout=job.timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        # Our own child, not yet reaped: its pid (= its session's group) is still its own.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
        timed_out = True
    doc: JsonObject = {
        "ok": code == 0 and not timed_out,
        "exit_code": code,
        "duration_s": round(time.monotonic() - t0, 3),
        "output": tail_text(out, OUTPUT_CHARS),
        "output_file": str(out),
    }
    if timed_out:
        doc["error"] = f"timed out after {job.timeout_s:g} s; killed"
    return doc


def notify(url: str, doc: JsonObject) -> JsonObject:
    """POST the event document; ntfy's topic may be given as the URL's fragment."""
    parts = urllib.parse.urlsplit(url)
    body = dict(doc)
    if parts.fragment:
        body["topic"] = parts.fragment
    target = urllib.parse.urlunsplit(parts._replace(fragment=""))
    req = urllib.request.Request(  # noqa: S310  (the scheme was checked at start: http/https)
        target,
        data=json.dumps(body, default=str).encode(),
        headers={"Content-Type": "application/json", "User-Agent": "trainctl"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=NOTIFY_TIMEOUT_S) as resp:  # noqa: S310
            return {"ok": True, "status": resp.status}
    except urllib.error.HTTPError as e:
        return {"ok": False, "error": f"HTTP {e.code} {e.reason}"}
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = getattr(e, "reason", e)
        return {"ok": False, "error": f"cannot reach {parts.netloc}: {why}"}


def main() -> int:
    """Read the event from stdin, run its hook, tell its URL; record both."""
    try:
        job = HookJob.from_doc(json.loads(sys.stdin.buffer.read()), "the hook's event")
    except (ValueError, StateError) as e:  # written by the supervisor: a bug, said and done
        sys.stderr.write(f"trainctl hookrun: {e}\n")
        return 2
    jdir = Path(job.jdir)
    (jdir / "hooks").mkdir(mode=0o700, exist_ok=True)
    lines = jdir / "hooks" / f"run-{job.run}.{job.event}.lines"
    with contextlib.suppress(OSError):
        write_bytes_atomic(lines, "".join(f"{x}\n" for x in job.last_lines).encode())
    base = {"hook_event": job.event, "run": job.run}
    if job.argv:
        env = {**job.env, "TRAINCTL_LAST_LINES": str(lines)}
        result = run_command(job, job.argv, env)
        name = "hook_ran" if result["ok"] else "hook_failed"
        with contextlib.suppress(OSError):
            append_event(jdir, name, **base, argv=job.argv, **result)
    if job.notify:
        result = notify(job.notify, job.doc)
        with contextlib.suppress(OSError):
            append_event(jdir, "notified" if result["ok"] else "notify_failed", **base, **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
