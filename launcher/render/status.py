"""`status`, `list` and `ps`: one job, the table of jobs, the processes."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from trainctl.launcher import term
from trainctl.launcher.inputs import human_duration
from trainctl.launcher.progress import sparkline
from trainctl.launcher.results import (
    ENDED_STATES,
    Checkpoint,
    CheckpointSeen,
    Failure,
    MemoryView,
    Progress,
    PsRow,
    QueueView,
    SlurmStopReport,
    Status,
    StopReport,
)
from trainctl.supervisor.records import JsonObject

if TYPE_CHECKING:
    from trainctl.launcher.results.ops import (
        Health,
    )


from .base import Said, _few, age, ago, clean, duration, gib, size, time_cell
from .stop import _stop_verdict


def status_doc(s: Status) -> JsonObject:
    """A status as `status --json` prints it."""
    return s.to_doc()


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


def newer_note(s: Status) -> str:
    """The one stderr line for a job written by a newer trainctl (stdout stays the status
    as ever); empty for any other."""
    return (
        "" if s.newer is None else f"trainctl: job {s.name}: {s.newer}: showing what this one knows"
    )


def status(s: Status) -> str:
    """Render one job's status."""
    o: list[str] = []
    if s.state == "queued" and s.queue is not None:
        o.extend(_queued_status(s, s.queue))
        return "\n".join(o)
    if s.never_ran:
        o.extend(_never_ran(s))
        return "\n".join(o)
    o.extend(_status_head(s))
    ended = s.ended_at is not None and s.state in ENDED_STATES
    when = f"ran {duration(s.uptime_s)}, ended {ago(s.ended_at)}" if ended else "uptime"
    up = "" if ended else f" {duration(s.uptime_s)}"
    escaped = f", {s.escaped} escaped the tree" if s.escaped else ""
    o.append(f"  {when}{up}   members {s.members}{escaped}   mode {s.mode}")
    if s.unit:
        o.append(f"  unit {s.unit}")
    if s.adopted:
        a = s.adopted
        at = a.at
        when = time.strftime("%H:%M:%S", time.localtime(at)) if at is not None else "?"
        o.append(f"  adopted {a.how} at {when}: {a.containment()}")
    o.extend(_status_details(s))
    if s.argv:
        cmd = clean(term.argv_line(s.argv, s.cwd))
        o.append(f"  cmd  {term.middle(cmd, term.width() - 7)}")
    o.extend(_settings_lines(s))
    o.append(f"  log  {s.log}")
    if s.last_log_line:
        o.append(f"  last {term.middle(clean(s.last_log_line), term.width() - 7)}")
    if s.last_stop and s.state in ("stopped", "exited", "failed"):
        o.extend(_last_stop_lines(s.last_stop))
    if s.queue is not None:
        o.append(f"  next run {s.run + 1} queued: waiting for {'; '.join(s.queue.waits_for)}")
    return "\n".join(o)


def _queued_status(s: Status, q: QueueView) -> list[str]:
    """A job that waits in the queue: its place, what it waits for, what it will run."""
    o: list[str] = []
    o.append(f"{s.name}: {term.phase('queued', 'queued')}, run {s.run}, position {q.position}")
    o.append(f"  waiting for {'; '.join(q.waits_for) or 'its turn (the dispatcher looks now)'}")
    since = time.strftime("%H:%M:%S", time.localtime(q.queued_at))
    asked = [f"gpus {q.gpus}"] if q.gpus else []
    asked += [f"after {a}" for a in q.after]
    asked += [f"singleton ({q.singleton})"] if q.singleton else []
    asked += ["backfill"] if q.backfill else []
    o.append(f"  queued at {since} ({duration(s.uptime_s)} ago): {', '.join(asked) or '-'}")
    if not q.waiter_alive:
        o.append("  no waiter is running (a reboot?): `trainctl queue resume` dispatches it again")
    if s.argv:
        cmd = clean(term.argv_line(s.argv, s.cwd))
        o.append(f"  cmd  {term.middle(cmd, term.width() - 7)}")
    return o


def _settings_lines(s: Status) -> list[str]:
    """Where the job runs and how it stops and restarts (from its spec)."""
    o: list[str] = []
    if s.cwd:
        snap = f"  (a snapshot of {s.source})" if s.source else ""
        o.append(f"  cwd  {s.cwd}{snap}")
    if s.settings is None:
        return o
    js = s.settings
    o.append(
        f"  stop grace {human_duration(js.grace_s)} ({js.stop_signal}, order "
        f"{js.stop_order}); restart {js.restart}"
    )
    if js.checkpoint and s.checkpoint is None:
        o.append(f"  ckpt nothing matches {js.checkpoint} yet")
    if js.tty and s.state in ("running", "starting", "stopping"):
        o.append(f"  tty  a terminal: trainctl attach {s.name}")
    return o


def _last_stop_lines(ls: StopReport | SlurmStopReport) -> list[str]:
    o: list[str] = []
    o.append(f"  last stop: {_stop_verdict(ls)}, {ls.total_s:.2f} s ({ls.reason})")
    if isinstance(ls, StopReport) and ls.reason == "main exited" and ls.found:
        names = _few(ls.sent, 60, with_pid=False)
        more = f" and {ls.found - 3} more" if ls.found > 3 else ""
        o.append(f"  leftovers {ls.found} process(es) outlived main, stopped: {names}{more}")
    if getattr(ls, "stacks", None):
        o.append(f"  stacks before SIGKILL: {getattr(ls, 'stacks', '')}")
    return o


def _never_ran(s: Status) -> list[str]:
    """A run that was recorded and never started (its dependency can never be met): what
    it waits no more for, and nothing of the fields that have no value."""
    o: list[str] = []
    why = s.cause.summary if s.cause is not None else (s.error or "it was never started")
    o.append(f"{s.name}: {term.phase(s.state, s.state)}, run {s.run}: never ran: {clean(why)}")
    if s.argv:
        cmd = clean(term.argv_line(s.argv, s.cwd))
        o.append(f"  cmd  {term.middle(cmd, term.width() - 7)}")
    o.append(f"  recorded {ago(s.ended_at)}; `trainctl start {s.name}` runs it now")
    return o


def _status_head(s: Status) -> list[str]:
    """The job's state, why it ended or how its stop goes, and its processes' ids."""
    o: list[str] = []
    code = "" if s.exit_code is None else f" (exit code {s.exit_code})"
    boot = " — recorded before the last reboot (from a previous boot)" if s.previous_boot else ""
    backoff = s.restart_in_s is not None and s.state == "starting"
    shown = f"waiting to restart (run {s.run + 1} in {age(s.restart_in_s or 0)})" if backoff else ""
    head = term.phase(shown or s.state, s.state)
    o.append(f"{s.name}: {head}{'' if backoff else code}, run {s.run}{boot}")
    if s.cause is not None:
        o.append(f"  cause {term.middle(clean(s.cause.summary), term.width() - 8)}")
    if s.stop_since is not None and s.state == "stopping":
        by = f" ({s.stop_by})" if s.stop_by else ""
        left = f"{age(s.grace_left_s or 0)} of grace left" if s.grace_left_s else "grace over"
        o.append(
            f"  stop since {time.strftime('%H:%M:%S', time.localtime(s.stop_since))}{by}: {left}"
        )
    if s.slurm is not None:
        return o
    sup = f"{s.supervisor_pid} ({'alive' if s.supervisor_alive else 'gone'})"
    if backoff:
        o.append(f"  main pid -   (run {s.run} ended; its supervisor {sup} relaunches it)")
    else:
        main = "-" if s.main_pid is None else s.main_pid
        pgid = "-" if s.pgid is None else s.pgid
        o.append(f"  main pid {main}   pgid {pgid}   supervisor {sup}")
    return o


def job_table(rows: list[Status | tuple[str, str]], home: str) -> str:
    """Render `trainctl list`: columns sized to their content, the table to the terminal."""
    o: list[str] = []
    if not rows:
        o.append(f"no jobs in {home}")
        return "\n".join(o)
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
    o.append(
        f"{'NAME':<{w[0]}}  {'STATE':<{w[1]}}  {'RUN':>{w[3]}}  {'MAIN':>{w[4]}}  "
        f"{'MEMBERS':>{w[5]}}  {'TIME':<{w[6]}}  {'LAST LOG LINE'[: max(4, left)]}"
    )
    for name, shown, ph, run, main, members, up, last in cells:
        state_cell = term.phase(f"{shown:<{w[1]}}", ph)
        o.append(
            f"{name:<{w[0]}}  {state_cell}  {run:>{w[3]}}  {main:>{w[4]}}  "
            f"{members:>{w[5]}}  {up:<{w[6]}}  {term.middle(last, max(0, left))}".rstrip()
        )
    return "\n".join(o)


def ps(rows: list[PsRow], cwd: str | None = None) -> str:
    """Render `trainctl ps` as an indented tree (a GPU column when any process holds one).

    Commands are shown relative to the job's cwd and without their bin/ directories, and
    cut in the middle to fit the terminal; `ps --json` keeps them whole.
    """
    o: list[str] = []
    if not rows:
        o.append("no live process")
        return "\n".join(o)
    if any(r.node for r in rows):  # published by node agents: where, who, what
        node_w = max(4, *(len(r.node or "") for r in rows))
        o.append(f"{'NODE':<{node_w}} {'PID':>7} {'PPID':>7} S  CMD")
        for r in rows:
            room = max(20, term.width() - node_w - 21)
            cmd = term.middle(clean(term.short_cmd(r.cmd, cwd)), room)
            o.append(f"{r.node or '-':<{node_w}} {r.pid:>7} {r.ppid:>7} {r.state}  {cmd}")
        return "\n".join(o)
    with_gpu = any(r.gpu_holder for r in rows)
    gpu_head = f" {'GPU MEM':>9}" if with_gpu else ""
    head = f"{'PID':>7} {'PPID':>7} {'PGID':>7} {'SID':>7} S {'CPU%':>5} {'RSS':>7}{gpu_head}  "
    o.append(f"{head}CMD")
    for r in rows:
        flag = "  [escaped]" if r.escaped else ""
        if r.stop_role.startswith("launcher"):
            flag += f"  [{r.stop_role}]"
        gpu = f" {gib(r.gpu_bytes) if r.gpu_holder else '-':>9}" if with_gpu else ""
        indent = "  " * r.depth
        room = max(20, term.width() - len(head) - len(indent) - len(flag))
        cmd = term.middle(clean(term.short_cmd(r.cmd, cwd)), room)
        o.append(
            f"{r.pid:>7} {r.ppid:>7} {r.pgid:>7} {r.sid:>7} {r.state} {r.cpu_percent:>5.1f} "
            f"{size(r.rss_bytes):>7}{gpu}  {indent}{cmd}{term.paint(flag, 'yellow')}"
        )
    return "\n".join(o)


def health(name: str, run: int, h: Health) -> Said:
    """The health window's verdict on a restarted run."""
    o: list[str] = []
    if not h.died:
        o.append(f"{name} run {run} is up after its {h.window_s:g} s health window")
        return Said("\n".join(o))
    if h.superseded_by is not None:
        o.append(
            f"{name} run {run} was replaced by run {h.superseded_by} (another restart) within "
            f"its {h.window_s:g} s health window: not a failure"
        )
        return Said("\n".join(o))
    why = clean(h.cause.summary) if h.cause else "it ended"
    if h.cause is not None and h.cause.kind == "stopped" and h.cause.by == "restart":
        o.append(
            f"{name} run {run} was stopped by another restart within its {h.window_s:g} s "
            "health window: not a failure"
        )
        return Said("\n".join(o))
    if h.ok:
        o.append(f"{name} run {run} ended within its {h.window_s:g} s health window: {why}")
        return Said("\n".join(o))
    err = [f"trainctl: {name} run {run} died within the {h.window_s:g} s health window: {why}"]
    err.extend(f"  | {clean(text)}" for text in h.last_lines)
    return Said(err="\n".join(err))


def _changed_lines(s: Status) -> list[str]:
    """The run's code, and what changed on disk since it started: code, spec file."""
    o: list[str] = []
    if s.code is not None and s.state not in ("queued",):
        untracked = len(s.code.untracked) + s.code.untracked_more
        more = f", {untracked} untracked file(s) not in it" if untracked else ""
        o.append(f"  code {s.code.line()}{more}")
    if s.probation:
        o.append(f"  probation {s.probation}")
    if s.code_changed and s.rolled_back:  # the code on disk is the code rolled back
        o.append(f"  code on disk differs ({'; '.join(s.code_changed)}): the code rolled back")
    elif s.code_changed:
        o.append(
            f"  CODE CHANGED on disk since start ({'; '.join(s.code_changed)}) — "
            f"`trainctl deploy {s.name}` to run it"
        )
    if s.spec_changed:
        edited = os.path.basename(s.spec_file or "") or "the spec file"
        o.append(
            f"  SPEC CHANGED ({edited} edited: {', '.join(s.spec_changed)}) — "
            f"`trainctl restart {s.name} --reload` to take it"
        )
    return o


def _restart_lines(s: Status) -> list[str]:
    """The restart count, the last failure, and why each recent restart was made."""
    o: list[str] = []
    lf = s.last_failure or Failure()
    nxt = f", next run in {s.restart_in_s:.0f}s" if s.restart_in_s is not None else ""
    why = lf.cause.summary if lf.cause else f"{lf.reason}, exit code {lf.exit_code}"
    o.append(f"  restarts {s.restarts}; last failure: run {lf.run} ({clean(why)}){nxt}")
    for h in s.restart_history[-5:]:
        when = time.strftime("%H:%M:%S", time.localtime(h.at)) if h.at else "?"
        met = f" [restart_on {h.matched}]" if h.matched else ""
        o.append(f"    run {h.run} ended {when}: {clean(h.cause or h.kind or '?')}{met}")
    return o


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


def _gpu_lines(s: Status) -> list[str]:
    """The run's GPUs, and the faults the supervisor saw on them."""
    o: list[str] = []
    if s.gpus:
        o.append(f"  gpus {','.join(s.gpu_labels or map(str, s.gpus))}")
    if s.gpus_note:
        o.append(f"  {term.paint('GPUs', 'yellow')} {s.gpus_note}")
    for fault in s.gpu_faults[-3:]:
        o.append(f"  {term.paint('GPU FAULT', 'red')} {fault}")
    return o


def _stall_lines(s: Status) -> list[str]:
    o: list[str] = []
    if s.stall_deadline_s is not None:
        o.append(f"  stall deadline {duration(s.stall_deadline_s)} (stall_timeout = auto: learned)")
    if s.stalled_for_s is not None:
        o.append(f"  STALLED: no progress and no log output for {duration(s.stalled_for_s)}")
        if s.stall_stacks:
            o.append(f"  stacks at the stall: {s.stall_stacks} (now: trainctl stack {s.name})")
    return o


def _checkpoint_lines(ck: CheckpointSeen) -> list[str]:
    o: list[str] = []
    about = "≈" if ck.step_estimated else ""
    at = "" if ck.step is None else f"step {about}{ck.step:g}, "
    if ck.path:
        o.append(f"  ckpt {ck.path} ({at}{age(ck.age_s)} old, complete)")
    if ck.partial:
        o.append(f"  ckpt {ck.partial}: partial ({ck.partial_why}); never resumed from")
    return o


def _guard_line(s: Status) -> list[str]:
    """The checkpoint guard of the run: what it was handed, whether it resumed, the copy."""
    o: list[str] = []
    g = s.guard
    if s.rolled_back:
        o.append(f"  {term.paint('ROLLED BACK', 'yellow')} {clean(s.rolled_back)}")
    if s.from_scratch:
        o.append("  guard off: started with --from-scratch")
    if g is None or g.tripped is not None:  # a tripped guard is the run's cause
        return o
    if g.first_step is not None:
        verdict = f"first step {g.first_step:g}: resumed"
    elif g.floor is not None:
        verdict = f"its first step must reach {g.floor:g}"
    else:
        verdict = "not armed (the checkpoint's step is unknown)"
    kept = f"; kept aside in {g.kept}" if g.kept else ""
    o.append(f"  guard handed {g.handed} ({g.step_text()}), {verdict}{kept}")
    return o


def _status_details(s: Status) -> list[str]:
    """The optional lines of `status`: Slurm, GPUs, restarts, training, notes."""
    o: list[str] = []
    if s.slurm:
        sl = s.slurm
        reason = f" ({sl.reason})" if sl.reason not in (None, "None") else ""
        o.append(f"  slurm job {sl.job_id}: {sl.state}{reason} on {sl.nodes or '-'}")
        for a in sl.agents:
            how = (
                "stopped"
                if a.stopped
                else f"NOT REPORTING for {a.age_s:.0f} s"
                if a.stale
                else f"{a.members} process(es)"
            )
            o.append(f"    node {a.node} (rank {a.rank}, {a.host}): {how}")
    o.extend(_gpu_lines(s))
    for line in s.handed_off[-3:]:
        o.append(f"  {term.paint('OUTSIDE', 'yellow')} {line}")
    if s.mounts_not_kept:
        o.append(
            f"  {term.paint('MOUNTS', 'yellow')}  {', '.join(s.mounts_not_kept)}: written by "
            "the job, not kept mounted by its scope; a host shutdown may unmount them while "
            "the job saves (`trainctl restart` orders a new run before them)"
        )
    if s.restarts or s.restart_in_s is not None:
        o.extend(_restart_lines(s))
    if s.memory is not None:
        o.append(f"  mem  {memory_line(s.memory)}")
    if s.checkpoint:
        o.extend(_checkpoint_lines(s.checkpoint))
    o.extend(_guard_line(s))
    if s.progress:
        o.append(
            f"  prog {progress_line(s.progress, s.state if s.state in ENDED_STATES else None)}"
        )
    o.extend(_changed_lines(s))
    o.extend(_stall_lines(s))
    if s.error:
        o.append(f"  note {clean(s.error)}")
    return o
