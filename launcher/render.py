"""Records into text and JSON: the only module that formats what a verb prints.

It reads records (``results``) and nothing above them; operations and backends never
format text. Slurm's stop report is rendered here too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import term
from .inputs import human_duration
from .progress import sparkline
from .results import (
    ENDED_STATES,
    Checkpoint,
    CheckpointInfo,
    CheckpointSeen,
    EndedAtOnce,
    Failure,
    GpuRelease,
    MemoryView,
    Progress,
    PsRow,
    Queued,
    QueueView,
    SlurmStopReport,
    StackReport,
    StartResult,
    Status,
    StopPlan,
    StopReport,
    StopResult,
    Survivor,
)

if TYPE_CHECKING:
    from trainctl.supervisor.model.reports import GpuHolder

    from .remote import HostRow
    from .results import GpuInventory
    from .results.ops import (
        Check,
        DeployPlan,
        DeployReport,
        DeployStep,
        Goodput,
        Health,
        HistoryRow,
        HostAnswer,
    )


def line(text: str) -> None:
    """Print one line of a verb's own (a note, a refusal's context)."""
    print(text)


def error_line(text: str) -> None:
    """Print one ``trainctl: …`` line to stderr (an error the verb reports itself)."""
    sys.stderr.write(f"trainctl: {text}\n")


class _Captures(threading.local):
    """The open captured_json() blocks of one thread, innermost last. Per thread: the
    MCP server runs each tool call in a worker thread of its own, and two calls at once
    must never receive each other's documents."""

    def __init__(self) -> None:
        self.stack: list[list[Any]] = []


_CAPTURE = _Captures()


def emit_json(doc: Any) -> None:
    """Print one JSON document (or keep it, inside ``captured_json``)."""
    if _CAPTURE.stack:
        _CAPTURE.stack[-1].append(json.loads(json.dumps(doc, default=str)))
        return
    print(json.dumps(doc, indent=2, default=str))


def capturing() -> bool:
    """Tell whether this thread's JSON documents are being collected (no text may go out)."""
    return bool(_CAPTURE.stack)


@contextlib.contextmanager
def captured_json() -> Iterator[list[Any]]:
    """Collect the documents emitted inside the block (a verb run for several jobs prints
    them as one JSON list)."""
    got: list[Any] = []
    _CAPTURE.stack.append(got)
    try:
        yield got
    finally:
        _CAPTURE.stack.pop()


def duration(secs: float) -> str:
    """Format seconds as 3d4h, 2h05m, 4m07s or 12.3s."""
    if secs < 60:
        return f"{secs:.1f}s"
    m, s = divmod(int(secs), 60)
    h, m = divmod(m, 60)
    d, h = divmod(h, 24)
    if d:
        return f"{d}d{h}h"
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def ago(ts: float | None) -> str:
    """`5m02s ago`, from an epoch time ("-" when there is none)."""
    return "-" if ts is None else f"{age(max(0.0, time.time() - ts))} ago"


def age(secs: float) -> str:
    """An age as every verb prints it: whole seconds under a minute, else `duration`."""
    return f"{secs:.0f}s" if secs < 60 else duration(secs)


def time_cell(s: Status) -> str:
    """`up 3m02s` for a live run, `ended 5m02s ago` for a finished one (list, top)."""
    if s.ended_at is not None and s.state in ENDED_STATES:
        return f"ended {ago(s.ended_at)}"
    if s.state == "queued":
        return f"queued {duration(s.uptime_s)}"
    return f"up {duration(s.uptime_s)}"


def size(nbytes: int) -> str:
    """Format a byte count as 512K, 3.1M, 2.0G."""
    value = float(nbytes)
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            return f"{value:.0f}{unit}" if unit in ("B", "K") else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}G"


def stop_doc(res: StopResult, checkpoint: CheckpointInfo | None = None) -> None:
    """Print a stop result as JSON."""
    emit_json(
        {
            "name": res.name,
            "run": res.run,
            "via": res.via,
            "ok": res.ok,
            "exit_code": res.exit_code,
            "message": res.message,
            "warnings": res.warnings,
            "report": res.report.to_doc(),
            "cause": None if (c := getattr(res.report, "cause", None)) is None else c.to_doc(),
            "checkpoint": None if checkpoint is None else checkpoint.to_doc(),
        }
    )


def status_doc(s: Status) -> None:
    """Print a status as JSON."""
    emit_json(s.to_doc())


def ended_at_once(e: EndedAtOnce, *, shown_log: bool = False) -> None:
    """A run that ended within `start`'s first look: how, and its last lines."""
    code = (
        ""
        if e.exit_code is None or f"code {e.exit_code}" in e.cause
        else f" (exit code {e.exit_code})"
    )
    if e.state == "restarting":
        sys.stderr.write(
            f"trainctl: {e.name} run {e.run} ended at once: {clean(e.cause)}; the restart "
            f"policy starts it again (`trainctl status {e.name}`)\n"
        )
    elif e.failed:
        sys.stderr.write(f"trainctl: {e.name} run {e.run} ended at once{code}: {clean(e.cause)}\n")
    else:
        print(f"{e.name} run {e.run} already ended{code}: {clean(e.cause)}")
    if not shown_log:
        for line in e.last_lines:
            sys.stderr.write(f"  | {clean(line)}\n")


def start(res: StartResult) -> None:
    """Render a started run."""
    if res.gpus:
        print(f"GPUs {res.gpus} bound (CUDA_VISIBLE_DEVICES={res.gpus})")
    where = (
        f"main pid {res.main_pid}"
        if res.main_pid is not None
        else f"submitted as {res.mode} job {res.slurm_job_id}"
    )
    ms = res.elapsed_s * 1000
    print(f"started {res.name} run {res.run}: {where}, mode {res.mode} ({ms:.0f} ms)")
    print(f"log: {res.log}")
    if res.unit:
        print(f"unit: {res.unit} (systemd scope, outside your login session)")
    for line in res.warnings:
        sys.stderr.write(f"trainctl: {line}\n")


def stop_plan(p: StopPlan) -> None:
    """Render `stop --dry-run`: what the stop would do, in the order it would do it."""
    print(
        f"{p.name} run {p.run} ({p.state}): a stop would send {p.signal} in order {p.order}, "
        f"grace {age(p.grace_s)}, then SIGKILL; {len(p.members)} live member(s)"
    )
    if p.queued:
        print("  its queued next run would be dequeued first")
    for m in p.members:
        gpu = " [GPU]" if m.gpu else ""
        print(f"  {m.pid:>7}  {m.role:<28} {term.middle(clean(m.cmd), term.width() - 40)}{gpu}")
    if p.checkpoint_glob:
        if p.checkpoint is None:
            print(f"  checkpoint: none complete matches {p.checkpoint_glob}")
        else:
            at = "" if p.checkpoint_step is None else f"step {p.checkpoint_step:g}, "
            print(f"  checkpoint: {p.checkpoint} ({at}{age(p.checkpoint_age_s or 0)} old)")
    why_not = "; ".join(f"not {k}: {v}" for k, v in p.cannot_at.items())
    print(f"  --at: can {', '.join(p.can_at)}" + (f" ({why_not})" if why_not else ""))
    if p.gpus:
        print(f"  GPUs {', '.join(map(str, p.gpus))}: the stop waits until they are released")
    if p.dooms:
        print(f"  it would fail the queued job(s) waiting for it: {', '.join(p.dooms)}")
    print("  nothing was signalled (--dry-run)")


def queued(q: Queued) -> None:
    """Render a start that was queued."""
    print(f"queued {q.name}: position {q.position}, waiting for {'; '.join(q.waits_for)}")
    print(f"  `trainctl status {q.name}` shows its place; `trainctl stop {q.name}` dequeues it")


def stop(res: StopResult, *, verbose: bool = False) -> None:
    """Render a stop report: short by default (what was found, signalled, killed, the
    verdict); ``verbose`` adds the nets, launchers and each process's timing."""
    r = res.report
    if isinstance(r, SlurmStopReport):  # its own text, or the no-op's one line
        print(res.message or slurm_stop(res.name, res.run, r))
        _warnings(res)
        return
    if res.message:  # a no-op: one line, and the GPUs it checked again
        print(res.message)
        _warnings(res)
        for g in r.gpus:
            print(f"  {gpu_line(g)}")
        return
    if r.already_stopped:
        why = r.reason
        print(
            f"{res.name}: {why}"
            if "backoff" in why
            else f"{res.name}: no process of run {res.run} was alive; nothing to stop"
        )
        return
    escaped = f", {r.escaped} escaped the tree" if r.escaped else ""
    print(
        f"stopped {res.name} run {res.run} via {res.via} ({r.mode} mode): "
        f"{r.found} process(es){escaped}"
    )
    if verbose:
        nets = ", ".join(f"{k} {v}" for k, v in sorted(r.by_net.items()))
        print(f"  found      by {nets}")
    if r.late_joiners:
        print(
            f"  late       {r.late_joiners} found after the signal (new forks, or outside "
            "the cgroup) and signalled too"
        )
    _stop_details(r, verbose=verbose)
    if r.stacks:
        print(f"  stacks     of what outlived the grace, read before the SIGKILL: {r.stacks}")
    if r.zombies and verbose:
        print(f"  zombies    {len(r.zombies)} exited, waiting for their parent to reap them")
    for sv in r.survivors:
        print(survivor_line(sv))
    for g in r.gpus:
        print(f"  {gpu_line(g)}")
    code = "" if res.exit_code is None else f", main exit code {res.exit_code}"
    print(f"  total      {r.total_s:.2f} s — {r.verdict()}{code}")
    if r.cause is not None:
        print(f"  cause      {clean(r.cause.summary)}")
    _warnings(res)


NAMED_LINES = 8  # processes named one by one in the human report; --json has up to 64


def cmd_cell(cmd: str, used: int) -> str:
    """A job's command in a report line that has ``used`` columns already: cut in the
    middle to fit a terminal, whole when piped (term.width is unlimited then)."""
    return term.middle(clean(cmd), max(20, term.width() - used))


def _stop_details(r: StopReport, *, verbose: bool) -> None:
    """Who got the signal and when, who exited on it, who was launcher, who was killed."""
    for launcher in r.launchers if verbose else ():
        head, why = f"  launcher   pid {launcher.pid} ", launcher.why or ""
        print(f"{head}{cmd_cell(launcher.cmd, len(head) + len(why) + 3)} ({why})")
        print("             skipped for its workers; it gets the signal only if it outlives them")
    named = _signalled_lines(r, verbose=verbose)
    if not r.killed and not verbose:
        return
    print(f"  SIGKILL    {r.killed} killed after the {r.grace_s:g} s grace")
    rest = [p for p in r.killed_procs if p.pid not in named]  # each pid is named once
    for p in rest[:NAMED_LINES]:
        head = f"    pid {p.pid:<7} "
        print(f"{head}{cmd_cell(p.cmd, len(head))}")
    if len(rest) > NAMED_LINES:
        print(f"    ... and {len(rest) - NAMED_LINES} more (--json names up to 64)")


def _signalled_lines(r: StopReport, *, verbose: bool) -> set[int]:
    """The stop signal's line (and, verbose, each process's); the SIGKILLed pids named."""
    ex = r.exit_s
    if ex and ex["first"] != ex["last"] and verbose:
        timing = f" in {ex['first']:.2f}-{ex['last']:.2f} s (median {ex['median']:.2f} s)"
    elif ex:
        timing = f" within {ex['last']:.2f} s"
    else:
        timing = ""
    print(
        f"  {r.signal:<10} {r.signalled} signalled (order {r.order}), "
        f"{r.exited_on_signal} exited on it{timing}"
    )
    named: set[int] = set()
    for p in r.sent[:NAMED_LINES] if verbose else ():
        if p.exit_s is None:
            gone = "still running"
        elif p.killed:
            gone = f"SIGKILLed {p.exit_s:.2f} s later"
            named.add(p.pid)
        else:
            gone = f"exited after {p.exit_s:.2f} s"
        head = f"    pid {p.pid:<7} at +{p.at_s or 0:.2f} s, {gone}: "
        print(f"{head}{cmd_cell(p.cmd, len(head))}")
    if verbose and (len(r.sent) > NAMED_LINES or r.signalled > len(r.sent)):
        more = r.signalled - min(len(r.sent), NAMED_LINES)
        print(f"    ... and {more} more (--json names up to 64)")
    if r.exited_unsignalled and verbose:
        print(
            f"  unsignalled {r.exited_unsignalled} exited without the signal (a parent "
            "shut its children down, or a launcher exited once its workers were gone)"
        )
    return named


def slurm_stop(name: str, run: int, r: SlurmStopReport) -> str:
    """The human report of a Slurm job's stop."""
    how = (
        "did not leave the queue within the grace: cancelled (scancel)"
        if r.cancelled_after_grace
        else "left the queue within the grace"
    )
    lines = [
        f"stopped {name} run {run} via slurm (job {r.slurm.state}, exit code {r.slurm.exit_code})",
        f"  {r.signal:<10} through each node's agent; the job {how} ({r.grace_s:g} s grace)",
        f"  this node  {r.local_leftovers} leftover process(es) of the job "
        "stopped by marker (what Slurm's proctrack missed)",
    ]
    for n in r.nodes:
        if n.ok and n.found is not None:
            said = f"nothing left ({n.by}: {n.found} found, {n.killed} SIGKILLed)"
        elif n.ok:
            said = f"nothing left ({n.by})"
        else:
            said = "NOT VERIFIED: its agent sent no stop report"
        lines.append(f"  node {n.node:<8} {said}")
    lines += [survivor_line(sv) for sv in r.survivors]
    verdict = "nothing of the job is alive" if r.ok else "the job did NOT end cleanly"
    lines.append(f"  total      {r.total_s:.2f} s — {verdict}")
    return "\n".join(lines)


def as_written(path: str, glob: str, cwd: str) -> str:
    """A checkpoint's path as the user wrote its glob: an absolute glob's stays absolute
    (relative to a snapshot folder it read ../../../../out2/ckpt.pt), a relative one's
    is relative to the job's directory."""
    return path if os.path.isabs(glob) else os.path.relpath(path, cwd)


def checkpoint_line(ck: Checkpoint | None, glob: str, cwd: str) -> str:
    """One human line about the newest checkpoint."""
    if ck is None:
        return f"no checkpoint yet (matching {glob!r})"
    # as the user wrote the glob: an absolute one stays absolute (relative to a snapshot
    # folder it read ../../../../out/ckpt.pt)
    shown = as_written(ck.path, glob, cwd)
    at = "" if ck.step is None else f"step {ck.step:g}, "
    return f"newest complete checkpoint: {shown} ({at}{age(ck.age_s)} old)"


_CARET = {i: f"^{chr(i + 64)}" for i in range(32)} | {0x7F: "^?"}
_CARET.update({i: "?" for i in range(0x80, 0xA0)})  # C1 controls (CSI, OSC as one byte)
_CARET[9] = " "  # a tab is harmless, but would break the columns


def clean(text: str) -> str:
    """Make text from a job (its output, argv, error lines) safe to show on a terminal.

    Control characters are shown in caret notation (ESC as ``^[``), so an escape sequence
    in a log line or a command line can neither retitle the window, clear the screen nor
    fake a line of trainctl's own output. The one sanitizer for every such field.
    """
    return text.translate(_CARET)


def survivor_line(s: Survivor) -> str:
    """One report line for a process that outlived the stop."""
    why = f" ({s.why})" if s.why else ""
    return f"  SURVIVOR   pid {s.pid} state {s.state} wchan {s.wchan or '-'}{why}: {clean(s.cmd)}"


def _warnings(res: StopResult) -> None:
    for line in res.warnings:
        sys.stderr.write(f"trainctl: {line}\n")


def stop_summary(ls: StopReport | SlurmStopReport) -> str:
    """A stop's outcome in one line (`attach`'s last word on a stopped run)."""
    verdict = ls.verdict() if isinstance(ls, StopReport) else "ended"
    return f"{verdict} ({_stop_verdict(ls)}, {ls.total_s:.2f} s, {ls.reason})"


def _stop_verdict(ls: StopReport | SlurmStopReport) -> str:
    """`clean` only when every process left on the stop signal; otherwise who did not."""
    if not ls.ok:
        return f"{len(ls.survivors)} SURVIVED"
    if not ls.killed:
        return "clean"
    who = _few(ls.killed_procs, 40, with_pid=True)
    more = f" and {ls.killed - 3} more" if ls.killed > 3 else ""
    return f"{ls.killed} needed SIGKILL ({who}{more})"


def status(s: Status) -> None:
    """Render one job's status."""
    if s.state == "queued" and s.queue is not None:
        _queued_status(s, s.queue)
        return
    if s.never_ran:
        _never_ran(s)
        return
    _status_head(s)
    ended = s.ended_at is not None and s.state in ENDED_STATES
    when = f"ran {duration(s.uptime_s)}, ended {ago(s.ended_at)}" if ended else "uptime"
    up = "" if ended else f" {duration(s.uptime_s)}"
    escaped = f", {s.escaped} escaped the tree" if s.escaped else ""
    print(f"  {when}{up}   members {s.members}{escaped}   mode {s.mode}")
    if s.unit:
        print(f"  unit {s.unit}")
    if s.adopted:
        a = s.adopted
        at = a.at
        when = time.strftime("%H:%M:%S", time.localtime(at)) if at is not None else "?"
        print(f"  adopted {a.how} at {when}: {a.containment()}")
    _status_details(s)
    if s.argv:
        cmd = clean(term.argv_line(s.argv, s.cwd))
        print(f"  cmd  {term.middle(cmd, term.width() - 7)}")
    _settings_lines(s)
    print(f"  log  {s.log}")
    if s.last_log_line:
        print(f"  last {term.middle(clean(s.last_log_line), term.width() - 7)}")
    if s.last_stop and s.state in ("stopped", "exited", "failed"):
        _last_stop_lines(s.last_stop)
    if s.queue is not None:
        print(f"  next run {s.run + 1} queued: waiting for {'; '.join(s.queue.waits_for)}")


def _queued_status(s: Status, q: QueueView) -> None:
    """A job that waits in the queue: its place, what it waits for, what it will run."""
    print(f"{s.name}: {term.phase('queued', 'queued')}, run {s.run}, position {q.position}")
    print(f"  waiting for {'; '.join(q.waits_for) or 'its turn (the dispatcher looks now)'}")
    since = time.strftime("%H:%M:%S", time.localtime(q.queued_at))
    asked = [f"gpus {q.gpus}"] if q.gpus else []
    asked += [f"after {a}" for a in q.after]
    asked += [f"singleton ({q.singleton})"] if q.singleton else []
    asked += ["backfill"] if q.backfill else []
    print(f"  queued at {since} ({duration(s.uptime_s)} ago): {', '.join(asked) or '-'}")
    if not q.waiter_alive:
        print("  no waiter is running (a reboot?): `trainctl queue resume` dispatches it again")
    if s.argv:
        cmd = clean(term.argv_line(s.argv, s.cwd))
        print(f"  cmd  {term.middle(cmd, term.width() - 7)}")


def _settings_lines(s: Status) -> None:
    """Where the job runs and how it stops and restarts (from its spec)."""
    if s.cwd:
        snap = f"  (a snapshot of {s.source})" if s.source else ""
        print(f"  cwd  {s.cwd}{snap}")
    if s.settings is None:
        return
    js = s.settings
    print(
        f"  stop grace {human_duration(js.grace_s)} ({js.stop_signal}, order "
        f"{js.stop_order}); restart {js.restart}"
    )
    if js.checkpoint and s.checkpoint is None:
        print(f"  ckpt nothing matches {js.checkpoint} yet")
    if js.tty and s.state in ("running", "starting", "stopping"):
        print(f"  tty  a terminal: trainctl attach {s.name}")


def _few(procs: list[Any], used: int, *, with_pid: bool) -> str:
    """The first three processes' commands on one line that has ``used`` columns already:
    each cut in the middle to its share of a terminal, whole when piped."""
    each = max(20, (term.width() - used) // 3)
    return ", ".join(
        (f"{p.pid} " if with_pid else "") + term.middle(clean(p.cmd), each) for p in procs[:3]
    )


def _last_stop_lines(ls: StopReport | SlurmStopReport) -> None:
    print(f"  last stop: {_stop_verdict(ls)}, {ls.total_s:.2f} s ({ls.reason})")
    if isinstance(ls, StopReport) and ls.reason == "main exited" and ls.found:
        names = _few(ls.sent, 60, with_pid=False)
        more = f" and {ls.found - 3} more" if ls.found > 3 else ""
        print(f"  leftovers {ls.found} process(es) outlived main, stopped: {names}{more}")
    if getattr(ls, "stacks", None):
        print(f"  stacks before SIGKILL: {getattr(ls, 'stacks', '')}")


def _never_ran(s: Status) -> None:
    """A run that was recorded and never started (its dependency can never be met): what
    it waits no more for, and nothing of the fields that have no value."""
    why = s.cause.summary if s.cause is not None else (s.error or "it was never started")
    print(f"{s.name}: {term.phase(s.state, s.state)}, run {s.run}: never ran: {clean(why)}")
    if s.argv:
        cmd = clean(term.argv_line(s.argv, s.cwd))
        print(f"  cmd  {term.middle(cmd, term.width() - 7)}")
    print(f"  recorded {ago(s.ended_at)}; `trainctl start {s.name}` runs it now")


def _status_head(s: Status) -> None:
    """The job's state, why it ended or how its stop goes, and its processes' ids."""
    code = "" if s.exit_code is None else f" (exit code {s.exit_code})"
    boot = " — recorded before the last reboot (from a previous boot)" if s.previous_boot else ""
    backoff = s.restart_in_s is not None and s.state == "starting"
    shown = f"waiting to restart (run {s.run + 1} in {age(s.restart_in_s or 0)})" if backoff else ""
    head = term.phase(shown or s.state, s.state)
    print(f"{s.name}: {head}{'' if backoff else code}, run {s.run}{boot}")
    if s.cause is not None:
        print(f"  cause {term.middle(clean(s.cause.summary), term.width() - 8)}")
    if s.stop_since is not None and s.state == "stopping":
        by = f" ({s.stop_by})" if s.stop_by else ""
        left = f"{age(s.grace_left_s or 0)} of grace left" if s.grace_left_s else "grace over"
        print(f"  stop since {time.strftime('%H:%M:%S', time.localtime(s.stop_since))}{by}: {left}")
    if s.slurm is not None:
        return
    sup = f"{s.supervisor_pid} ({'alive' if s.supervisor_alive else 'gone'})"
    if backoff:
        print(f"  main pid -   (run {s.run} ended; its supervisor {sup} relaunches it)")
    else:
        main = "-" if s.main_pid is None else s.main_pid
        pgid = "-" if s.pgid is None else s.pgid
        print(f"  main pid {main}   pgid {pgid}   supervisor {sup}")


def job_table(rows: list[Status | tuple[str, str]], home: str) -> None:
    """Render `trainctl list`: columns sized to their content, the table to the terminal."""
    if not rows:
        print(f"no jobs in {home}")
        return
    cells = []
    for row in rows:
        if isinstance(row, tuple):
            cells.append((row[0], "?", "?", "", "", "", "", row[1]))
            continue
        code = f"({row.exit_code})" if row.exit_code is not None else ""
        main = str(row.main_pid) if row.main_pid else "-"
        up = time_cell(row)
        last = clean(row.last_log_line if row.cause is None else f"({row.cause.summary})")
        if row.state == "queued" and row.queue is not None:
            last = f"(#{row.queue.position}: {'; '.join(row.queue.waits_for) or 'its turn'})"
        cells.append(
            (row.name, row.state + code, row.state, str(row.run), main, str(row.members), up, last)
        )
    heads = ("NAME", "STATE", "", "RUN", "MAIN", "MEMBERS", "TIME")
    w = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    left = term.width() - (sum(w) - w[2] + 2 * 5 + 2)  # what the last log line may take
    print(
        f"{'NAME':<{w[0]}}  {'STATE':<{w[1]}}  {'RUN':>{w[3]}}  {'MAIN':>{w[4]}}  "
        f"{'MEMBERS':>{w[5]}}  {'TIME':<{w[6]}}  {'LAST LOG LINE'[: max(4, left)]}"
    )
    for name, shown, ph, run, main, members, up, last in cells:
        state_cell = term.phase(f"{shown:<{w[1]}}", ph)
        print(
            f"{name:<{w[0]}}  {state_cell}  {run:>{w[3]}}  {main:>{w[4]}}  "
            f"{members:>{w[5]}}  {up:<{w[6]}}  {term.middle(last, max(0, left))}".rstrip()
        )


def ps(rows: list[PsRow], cwd: str | None = None) -> None:
    """Render `trainctl ps` as an indented tree (a GPU column when any process holds one).

    Commands are shown relative to the job's cwd and without their bin/ directories, and
    cut in the middle to fit the terminal; `ps --json` keeps them whole.
    """
    if not rows:
        print("no live process")
        return
    if any(r.node for r in rows):  # published by node agents: where, who, what
        node_w = max(4, *(len(r.node or "") for r in rows))
        print(f"{'NODE':<{node_w}} {'PID':>7} {'PPID':>7} S  CMD")
        for r in rows:
            room = max(20, term.width() - node_w - 21)
            cmd = term.middle(clean(term.short_cmd(r.cmd, cwd)), room)
            print(f"{r.node or '-':<{node_w}} {r.pid:>7} {r.ppid:>7} {r.state}  {cmd}")
        return
    with_gpu = any(r.gpu_holder for r in rows)
    gpu_head = f" {'GPU MEM':>9}" if with_gpu else ""
    head = f"{'PID':>7} {'PPID':>7} {'PGID':>7} {'SID':>7} S {'CPU%':>5} {'RSS':>7}{gpu_head}  "
    print(f"{head}CMD")
    for r in rows:
        flag = "  [escaped]" if r.escaped else ""
        if r.stop_role.startswith("launcher"):
            flag += f"  [{r.stop_role}]"
        gpu = f" {gib(r.gpu_bytes) if r.gpu_holder else '-':>9}" if with_gpu else ""
        indent = "  " * r.depth
        room = max(20, term.width() - len(head) - len(indent) - len(flag))
        cmd = term.middle(clean(term.short_cmd(r.cmd, cwd)), room)
        print(
            f"{r.pid:>7} {r.ppid:>7} {r.pgid:>7} {r.sid:>7} {r.state} {r.cpu_percent:>5.1f} "
            f"{size(r.rss_bytes):>7}{gpu}  {indent}{cmd}{term.paint(flag, 'yellow')}"
        )


def stacks(r: StackReport) -> None:
    """Render `trainctl stack`: each distinct stack once, with who stands at it."""
    n = len({t.pid for g in r.groups for t in g.threads})
    print(
        f"{r.name} run {r.run}: {n} Python process(es), {len(r.groups)} distinct "
        f"stack(s) ({r.elapsed_s:.2f} s)"
    )
    for g in sorted(r.groups, key=lambda g: -len(g.threads)):
        who = ", ".join(
            f"pid {t.pid}"
            + (f" rank {t.rank}" if t.rank is not None else "")
            + (f" thread {clean(t.thread)}" if not t.thread.isdigit() else "")
            for t in g.threads[:NAMED_LINES]
        )
        more = f" and {len(g.threads) - NAMED_LINES} more" if len(g.threads) > NAMED_LINES else ""
        print(f"\n  {len(g.threads)} thread(s): {who}{more}")
        for f in g.frames:
            where = f"{clean(f.filename)}:{f.line}" if f.line is not None else clean(f.filename)
            print(f"    {clean(f.name)} ({where})")
    for sk in r.skipped:
        print(f"\n  skipped pid {sk.pid} {clean(sk.cmd)[:60]}: {sk.why}")


def write(text: str) -> None:
    """Write raw log text."""
    sys.stdout.write(text)
    sys.stdout.flush()


def gib(nbytes: int | None) -> str:
    """Format bytes as GiB with one decimal ('?' when unknown)."""
    return "?" if nbytes is None else f"{nbytes / (1 << 30):.1f} GiB"


def gpu_line(g: GpuRelease) -> str:
    """One line of a stop report about a GPU's release."""
    if g.ok:
        released = (
            f"released {gib(g.released_bytes)}" if g.released_bytes else "free"
        )  # no figure where none was freed or the memory in use was never seen
        return (
            f"GPU {g.label}  {released} after {g.seconds or 0:.1f} s (now "
            f"{gib(g.used_bytes)}, baseline {gib(g.baseline_bytes)})"
            + (f"; {g.note}" if g.note else "")
        )
    if g.error is not None:
        return f"GPU {g.label}  not verified: {g.error}"
    who = "; ".join(_holder_text(h) for h in g.holders)
    return (
        f"GPU {g.label}  NOT RELEASED: {gib(g.used_bytes)} used vs baseline "
        f"{gib(g.baseline_bytes)}; " + (who or g.note or "")
    )


def _holder_text(h: GpuHolder) -> str:
    if h.cmd is None:  # NVML's pid, not confirmed here: never read, never signalled
        return f"pid {h.pid} ({h.owner or 'not visible here'})"
    return f"pid {h.pid} ({h.owner or 'foreign'}) {h.cmd}"


# Idle memory that needs no explanation: the driver reserves some on every GPU.
_IDLE_NOTE_BYTES = 1 << 30


def gpus(inv: GpuInventory) -> None:
    """Render `trainctl gpus`: the driver, a line a GPU, its processes, the warnings."""
    d = inv.driver
    print(f"driver {d.driver_version or '?'}  NVML {d.nvml_version or '?'}")
    for v in inv.views:
        if v.unhealthy is not None:
            print(f"GPU {v.label}  {term.paint(v.unhealthy.upper()[:9], 'red')}{v.unhealthy[9:]}")
        if v.error is not None:
            print(f"GPU {v.label}  {term.paint('ERROR', 'red')}: {v.error}")
            continue
        util = "?" if v.utilization_pct is None else f"{v.utilization_pct}%"
        lease = f"leased by {v.leased_by}" if v.leased_by else "free"
        if v.mig_mode:
            lease = "MIG mode (bound per instance)"
        modes = "" if v.persistence is not False else "  persistence off"
        indent = "  " if v.mig is not None else ""
        print(
            f"{indent}GPU {v.label}  {v.name}  {gib(v.memory_used_bytes)} / "
            f"{gib(v.memory_total_bytes)}  util {util}  {lease}{modes}  {v.uuid}"
        )
        for p in v.processes:
            kind = f" [{p.seen.split(' ')[1]}]" if p.seen.startswith("nvml+fd ") else ""
            print(
                f"{indent}    pid {p.pid:>7}  {gib(p.used_bytes):>9}  {p.owner or '':<22} "
                f"{(p.cmd or '')[:80]}{kind}"
            )
        if not v.processes and not v.mig_mode and v.memory_used_bytes > _IDLE_NOTE_BYTES:
            print(f"{indent}    (no process listed: NVML may not see other PID namespaces)")
    for w in inv.warnings:
        sys.stderr.write(f"trainctl: warning: {w}\n")


def hosts(rows: list[HostRow]) -> None:
    """Render `trainctl hosts`."""
    for r in rows:
        h = r.host
        line = f"{h.name:<16} {h.target}"
        if h.port:
            line += f":{h.port}"
        if h.prefix:
            line += f"  via `{' '.join(h.prefix)}`"
        if r.check is not None:
            if r.check.error:
                line += f"  FAIL: {r.check.error}"
            else:
                ok = "ok" if r.check.compatible else "INCOMPATIBLE"
                line += f"  trainctl {r.check.version} ({ok})"
        print(line)


def health(name: str, run: int, h: Health) -> None:
    """The health window's verdict on a restarted run."""
    if not h.died:
        print(f"{name} run {run} is up after its {h.window_s:g} s health window")
        return
    if h.superseded_by is not None:
        print(
            f"{name} run {run} was replaced by run {h.superseded_by} (another restart) within "
            f"its {h.window_s:g} s health window: not a failure"
        )
        return
    why = clean(h.cause.summary) if h.cause else "it ended"
    if h.cause is not None and h.cause.kind == "stopped" and h.cause.by == "restart":
        print(
            f"{name} run {run} was stopped by another restart within its {h.window_s:g} s "
            "health window: not a failure"
        )
        return
    if h.ok:
        print(f"{name} run {run} ended within its {h.window_s:g} s health window: {why}")
        return
    sys.stderr.write(
        f"trainctl: {name} run {run} died within the {h.window_s:g} s health window: {why}\n"
    )
    for text in h.last_lines:
        sys.stderr.write(f"  | {clean(text)}\n")


def _changed_lines(s: Status) -> None:
    """The run's code, and what changed on disk since it started: code, spec file."""
    if s.code is not None and s.state not in ("queued",):
        untracked = len(s.code.untracked) + s.code.untracked_more
        more = f", {untracked} untracked file(s) not in it" if untracked else ""
        print(f"  code {s.code.line()}{more}")
    if s.probation:
        print(f"  probation {s.probation}")
    if s.code_changed:
        print(
            f"  CODE CHANGED on disk since start ({'; '.join(s.code_changed)}) — "
            f"`trainctl deploy {s.name}` to run it"
        )
    if s.spec_changed:
        edited = os.path.basename(s.spec_file or "") or "the spec file"
        print(
            f"  SPEC CHANGED ({edited} edited: {', '.join(s.spec_changed)}) — "
            f"`trainctl restart {s.name} --reload` to take it"
        )


def _restart_lines(s: Status) -> None:
    """The restart count, the last failure, and why each recent restart was made."""
    lf = s.last_failure or Failure()
    nxt = f", next run in {s.restart_in_s:.0f}s" if s.restart_in_s is not None else ""
    why = lf.cause.summary if lf.cause else f"{lf.reason}, exit code {lf.exit_code}"
    print(f"  restarts {s.restarts}; last failure: run {lf.run} ({clean(why)}){nxt}")
    for h in s.restart_history[-5:]:
        when = time.strftime("%H:%M:%S", time.localtime(h.at)) if h.at else "?"
        met = f" [restart_on {h.matched}]" if h.matched else ""
        print(f"    run {h.run} ended {when}: {clean(h.cause or h.kind or '?')}{met}")


def memory_line(m: MemoryView) -> str:
    """`1.2 GiB of 64.0 GiB (memory_max), high 48.0 GiB; 1 OOM kill`."""
    parts = []
    if m.used_bytes is not None:
        cap = f" of {size(m.max_bytes)} (memory_max)" if m.max_bytes else ""
        parts.append(f"{size(m.used_bytes)}{cap}")
    elif m.max_bytes:
        parts.append(f"cap {size(m.max_bytes)}")
    if m.high_bytes:
        parts.append(f"high {size(m.high_bytes)}")
    text = ", ".join(parts) or "memory cap"
    if m.oom_kills:
        text += f"; {m.oom_kills} OOM kill(s) in the job"
    return text


def progress_line(p: Progress, ended: str | None = None) -> str:
    """`step 687/2000 (34%) loss 2.0900 ▇▆▅▄▃ 3.2 steps/s ETA 6m50s`; for a run that
    ended (``ended``: its state), `stopped at step 290/500 (58%) loss ...`, no rate."""
    step, total = p.step, p.total_steps
    past = bool(total and step is not None and step > total)
    of_total = ""
    if total and step is not None:
        of_total = f"/{total} (past total)" if past else f"/{total} ({100 * step / total:.0f}%)"
    parts = [(f"{ended} at " if ended else "") + f"step {step:g}" + of_total]
    for k, v in list(p.metrics.items())[:3]:
        parts.append(f"{k} {v:.4g}")
    if len(p.history) > 1:
        parts.append(sparkline(p.history))
    if p.steps_per_s:
        parts.append(f"{p.steps_per_s:.2f} steps/s")
    if p.eta_s is not None and not past:  # past its total: no estimate means anything
        parts.append(f"ETA {duration(p.eta_s)}")
    return "  ".join(parts)


def _gpu_lines(s: Status) -> None:
    """The run's GPUs, and the faults the supervisor saw on them."""
    if s.gpus:
        print(f"  gpus {','.join(s.gpu_labels or map(str, s.gpus))}")
    if s.gpus_note:
        print(f"  {term.paint('GPUs', 'yellow')} {s.gpus_note}")
    for fault in s.gpu_faults[-3:]:
        print(f"  {term.paint('GPU FAULT', 'red')} {fault}")


def _stall_lines(s: Status) -> None:
    if s.stall_deadline_s is not None:
        print(f"  stall deadline {duration(s.stall_deadline_s)} (stall_timeout = auto: learned)")
    if s.stalled_for_s is not None:
        print(f"  STALLED: no progress and no log output for {duration(s.stalled_for_s)}")
        if s.stall_stacks:
            print(f"  stacks at the stall: {s.stall_stacks} (now: trainctl stack {s.name})")


def _checkpoint_lines(ck: CheckpointSeen) -> None:
    at = "" if ck.step is None else f"step {ck.step:g}, "
    if ck.path:
        print(f"  ckpt {ck.path} ({at}{age(ck.age_s)} old, complete)")
    if ck.partial:
        print(f"  ckpt {ck.partial}: partial ({ck.partial_why}); never resumed from")


def _status_details(s: Status) -> None:
    """The optional lines of `status`: Slurm, GPUs, restarts, training, notes."""
    if s.slurm:
        sl = s.slurm
        reason = f" ({sl.reason})" if sl.reason not in (None, "None") else ""
        print(f"  slurm job {sl.job_id}: {sl.state}{reason} on {sl.nodes or '-'}")
        for a in sl.agents:
            how = (
                "stopped"
                if a.stopped
                else f"NOT REPORTING for {a.age_s:.0f} s"
                if a.stale
                else f"{a.members} process(es)"
            )
            print(f"    node {a.node} (rank {a.rank}, {a.host}): {how}")
    _gpu_lines(s)
    for line in s.handed_off[-3:]:
        print(f"  {term.paint('OUTSIDE', 'yellow')} {line}")
    if s.mounts_not_kept:
        print(
            f"  {term.paint('MOUNTS', 'yellow')}  {', '.join(s.mounts_not_kept)}: written by "
            "the job, not kept mounted by its scope; a host shutdown may unmount them while "
            "the job saves (`trainctl restart` orders a new run before them)"
        )
    if s.restarts or s.restart_in_s is not None:
        _restart_lines(s)
    if s.memory is not None:
        print(f"  mem  {memory_line(s.memory)}")
    if s.checkpoint:
        _checkpoint_lines(s.checkpoint)
    if s.progress:
        print(f"  prog {progress_line(s.progress, s.state if s.state in ENDED_STATES else None)}")
    _changed_lines(s)
    _stall_lines(s)
    if s.error:
        print(f"  note {clean(s.error)}")


def doctor(checks: list[Check], *, as_json: bool) -> None:
    """Render `trainctl doctor`: one line per check, a hint under what needs action."""
    if as_json:
        emit_json([dataclasses.asdict(ch) for ch in checks])
        return
    width = max(len(ch.name) for ch in checks)
    for ch in checks:
        print(f"{'ok  ' if ch.ok else 'FIX '} {ch.name:<{width}}  {ch.value}")
        if ch.hint:
            print(f"     {'':<{width}}  -> {ch.hint}")


# ---------------------------------------------------------------- deploy, history


def deploy_plan(p: DeployPlan) -> None:
    """`deploy --dry-run`: every step it would take, and what it would touch."""
    old = p.from_code.line() if p.from_code else "not recorded"
    new = p.to_code.line() if p.to_code else "not recorded"
    print(f"deploy {p.name}: run {p.from_run} ({old}) -> the code on disk ({new})")
    print(f"  changes     {clean('; '.join(p.changes))}")
    if p.at == "next-checkpoint":
        print(
            f"  checkpoint  wait for the trainer's own next save (nothing is signalled), at most "
            f"{human_duration(p.checkpoint_timeout_s)}; newest now: {p.newest_checkpoint or 'none'}"
        )
    elif p.at == "checkpoint":
        seen = (
            "none yet"
            if p.newest_checkpoint is None
            else (f"{p.newest_checkpoint}, {age(p.newest_age_s or 0.0)} old")
        )
        print(
            f"  checkpoint  ask for one ({p.checkpoint_signal}), wait at most "
            f"{human_duration(p.checkpoint_timeout_s)}; newest now: {seen}"
        )
    else:
        print("  checkpoint  none asked for (--at now)")
    gpus = f" on GPU(s) {', '.join(p.gpus)}" if p.gpus else ""
    print(f"  stop        run {p.from_run}: main pid {p.main_pid}, {p.members} member(s){gpus}")
    resume = (
        ""
        if p.newest_step is None
        else f", its first step at or past {p.newest_step - p.resume_tolerance:g}"
    )
    print(f"  gate        progress past its first step within {human_duration(p.health_s)}{resume}")
    print(
        f"  probation   until its first complete checkpoint, at most "
        f"{human_duration(p.probation_s)}: a crash or stall rolls back"
    )
    back = p.rollback_to if p.rollback_to else f"none ({p.no_rollback_why})"
    print(f"  rollback    {p.rollback}: {back}")


def deploy_step(step: DeployStep) -> None:
    """One step of a deploy, as it happens."""
    left = f" ({human_duration(step.left_s)} at most)" if step.left_s else ""
    print(f"  [{step.step}] {clean(step.line)}{left}", flush=True)


def deploy_report(r: DeployReport) -> None:
    """How a deploy ended (on stderr as well when it did not deploy)."""
    line = f"deploy {r.name}: {r.outcome}: {clean(r.summary)}"
    if r.ok:
        print(line)
        if r.probation_until is not None:
            until = time.strftime("%H:%M:%S", time.localtime(r.probation_until))
            print(
                f"  on probation until {until} or its first complete checkpoint: a crash or "
                f"stall meanwhile rolls back (`trainctl status {r.name}`)"
            )
        return
    sys.stderr.write(f"trainctl: {line}\n")
    for text in r.last_lines[-10:]:
        sys.stderr.write(f"  | {clean(text)}\n")


def goodput(g: Goodput) -> None:
    """`trainctl report NAME`: goodput, the lost time by bucket, each interruption."""
    state = "running" if g.running else "ended"
    if g.goodput is None:
        print(f"{g.name}: {duration(g.wall_s)} since its first start, {g.runs} run(s), {state}")
    else:
        print(
            f"{g.name}: goodput {g.goodput:.2f}: productive {duration(g.productive_s or 0.0)} "
            f"of {duration(g.wall_s)} since its first start, {g.runs} run(s), {state}"
        )
    lost = [f"{k.replace('_', ' ')} {duration(v)}" for k, v in g.lost_s.items() if v >= 0.05]
    steps = "" if not g.steps_lost else f" ({g.steps_lost:g} steps redone)"
    print(f"  lost      {', '.join(lost) or 'nothing'}{steps}")
    if g.typical_step_s:
        print(f"  step      {duration(g.typical_step_s)} typical")
    for i in g.interruptions:
        when = time.strftime("%m-%d %H:%M:%S", time.localtime(i.at))
        print(
            f"  run {i.run:<4} {when}  lost {duration(i.lost_s):>8}, {i.steps_lost:g} steps: "
            f"{clean(i.cause)}"
        )
    if g.needs_progress:
        print(
            "  no progress reported: productive time, goodput, start-up, restore, saves and "
            "steps redone need $TRAINCTL_PROGRESS or progress_regex (docs/training.md)"
        )


def history(name: str, rows: list[HistoryRow]) -> None:
    """`trainctl history NAME`: a run a row, oldest first."""
    print(f"{'RUN':>4}  {'STARTED':<19}  {'TOOK':>8}  {'CODE':<28}  {'STEPS':>8}  END")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started_at or 0))
        took = duration(r.duration_s) if r.duration_s is not None else "-"
        steps = f"{r.steps:g}" if r.steps is not None else "-"
        end = r.phase or "running"
        if r.cause:
            end += f": {r.cause}"
        marks = f"  [{'; '.join(r.marks)}]" if r.marks else ""
        print(
            f"{r.run:>4}  {when:<19}  {took:>8}  {clean(r.code or '-'):<28}  {steps:>8}  "
            f"{term.middle(clean(end + marks), max(20, term.width() - 78))}"
        )
    if not rows:
        print(f"job {name} has no recorded run yet")


# ---------------------------------------------------------------- --all-hosts


def fleet_jobs(answers: list[HostAnswer]) -> None:
    """`list --all-hosts`: one table, a HOST column; a host that did not answer, a row."""
    print(f"{'HOST':<14} {'NAME':<20} {'STATE':<13} {'RUN':>4} {'MAIN':>7} {'MEMBERS':>7}  LAST")
    for a in answers:
        if a.error is not None:
            print(f"{a.host:<14} {'-':<20} {'?':<13} {'':>4} {'':>7} {'':>7}  {clean(a.error)}")
            continue
        jobs = a.doc if isinstance(a.doc, list) else []
        if not jobs:
            print(f"{a.host:<14} {'-':<20} {'(no jobs)':<13}")
        for j in jobs:
            if not isinstance(j, dict):
                continue
            cause = j.get("cause") or {}
            last = cause.get("summary") if isinstance(cause, dict) and cause else None
            last = last or j.get("last_log_line") or j.get("error") or ""
            main = j.get("main_pid") if j.get("main_pid") is not None else "-"
            print(
                f"{a.host:<14} {j.get('name')!s:<20} {j.get('state')!s:<13} "
                f"{j.get('run', '-')!s:>4} {main!s:>7} {j.get('members', 0)!s:>7}  "
                f"{term.middle(clean(str(last)), max(20, term.width() - 72))}"
            )


def fleet_gpus(answers: list[HostAnswer]) -> None:
    """`gpus --all-hosts`: per host, each GPU free or held (and by which job)."""
    print(f"{'HOST':<14} {'GPU':<6} {'USED':>9} {'TOTAL':>9}  HELD BY")
    for a in answers:
        if a.error is not None:
            print(f"{a.host:<14} {'-':<6} {'':>9} {'':>9}  {clean(a.error)}")
            continue
        doc = a.doc
        rows = doc if isinstance(doc, list) else []
        if isinstance(doc, dict):  # no driver there: {"gpus": [], "error": ...}
            said = clean(str(doc.get("error") or "no GPUs"))
            print(f"{a.host:<14} {'-':<6} {'':>9} {'':>9}  {said}")
            continue
        free = 0
        for g in rows:
            if not isinstance(g, dict):
                continue
            held = g.get("leased_by") or ("foreign use" if g.get("processes") else None)
            free += held is None
            used, total = g.get("memory_used_bytes") or 0, g.get("memory_total_bytes") or 0
            print(
                f"{a.host:<14} {g.get('label') or g.get('index')!s:<6} {gib(used):>9} "
                f"{gib(total):>9}  {held or 'free'}"
            )
        if rows:
            print(f"{a.host:<14} {free} of {len(rows)} free")


def fleet_top(answers: list[HostAnswer]) -> None:
    """`top --all-hosts`: every host's jobs, then every host's GPUs, from one frame each."""

    def part(a: HostAnswer, key: str) -> HostAnswer:
        if a.error is not None or not isinstance(a.doc, dict):
            return a
        if key == "gpus" and a.doc.get("gpus_error"):
            return dataclasses.replace(a, doc={"error": a.doc["gpus_error"]})
        return dataclasses.replace(a, doc=a.doc.get(key) or [])

    print(time.strftime("trainctl top --all-hosts  %H:%M:%S"))
    fleet_jobs([part(a, "jobs") for a in answers])
    print()
    fleet_gpus([part(a, "gpus") for a in answers])
