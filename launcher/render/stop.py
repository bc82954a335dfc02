"""A start and a stop as text: the stop's report, its plan, what survived, the GPUs released."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainctl.launcher import term
from trainctl.launcher.results import (
    CheckpointInfo,
    EndedAtOnce,
    GpuRelease,
    Queued,
    SlurmStopReport,
    StartResult,
    StopPlan,
    StopReport,
    StopResult,
    Survivor,
)
from trainctl.supervisor.model.reports import Guard
from trainctl.supervisor.records import JsonObject

if TYPE_CHECKING:
    from trainctl.launcher.results.ops import RestartPlan  # ~0.6 ms: not on status's path
    from trainctl.supervisor.model.reports import GpuHolder


from .base import NAMED_LINES, Said, _few, age, clean, cmd_cell, gib


def stop_doc(res: StopResult, checkpoint: CheckpointInfo | None = None) -> JsonObject:
    """A stop result as `stop --json` prints it."""
    return {
        "name": res.name,
        "run": res.run,
        "via": res.via,
        "ok": res.ok,
        "exit_code": res.exit_code,
        "message": res.message,
        "warnings": [str(w) for w in res.warnings],
        "report": res.report.to_doc(),
        "cause": None if (c := getattr(res.report, "cause", None)) is None else c.to_doc(),
        "checkpoint": None if checkpoint is None else checkpoint.to_doc(),
    }


def ended_at_once(e: EndedAtOnce, *, shown_log: bool = False) -> Said:
    """A run that ended within `start`'s first look: how, and its last lines."""
    o: list[str] = []
    err: list[str] = []
    code = (
        ""
        if e.exit_code is None or f"code {e.exit_code}" in e.cause
        else f" (exit code {e.exit_code})"
    )
    if e.state == "restarting":
        err.append(
            f"trainctl: {e.name} run {e.run} ended at once: {clean(e.cause)}; the restart "
            f"policy starts it again (`trainctl status {e.name}`)"
        )
    elif e.failed:
        err.append(f"trainctl: {e.name} run {e.run} ended at once{code}: {clean(e.cause)}")
    else:
        o.append(f"{e.name} run {e.run} already ended{code}: {clean(e.cause)}")
    if not shown_log:
        err.extend(f"  | {clean(line)}" for line in e.last_lines)
    return Said("\n".join(o), "\n".join(err))


def start(res: StartResult) -> Said:
    """Render a started run."""
    o: list[str] = []
    if res.gpus:
        o.append(f"GPUs {res.gpus} bound (CUDA_VISIBLE_DEVICES={res.gpus})")
    where = (
        f"main pid {res.main_pid}"
        if res.main_pid is not None
        else f"submitted as {res.mode} job {res.slurm_job_id}"
    )
    ms = res.elapsed_s * 1000
    o.append(f"started {res.name} run {res.run}: {where}, mode {res.mode} ({ms:.0f} ms)")
    o.append(f"log: {res.log}")
    if res.unit:
        o.append(f"unit: {res.unit} (systemd scope, outside your login session)")
    if res.from_scratch:
        o.append("from scratch: no checkpoint handed, no checkpoint guard")
    elif res.guard is not None:
        o.extend(guard_lines(res.guard))
    return Said("\n".join(o), _warnings(res))


def guard_lines(g: Guard) -> list[str]:
    """What a start handed and guards: the checkpoint, where its copy is, the floor."""
    lines = [f"resuming from {g.handed} ($TRAINCTL_RESUME_FROM)"
             + (f", {g.step_text()}" if g.handed == g.path else "")]  # fmt: skip
    if g.kept:
        lines.append(f"  kept aside by {g.kept_how}: {g.kept}")
    elif g.not_kept:
        lines.append(f"  not kept aside: {g.not_kept}")
    if g.floor is not None:
        lines.append(f"  guard: a first step below {g.floor:g} stops the run before it saves")
    else:
        lines.append("  guard: off (the checkpoint's step is unknown, or resume_tolerance is off)")
    return lines


def restart_plan(p: RestartPlan) -> str:
    """Render `restart --dry-run`: what the new run would be handed, kept and guarded by."""
    o: list[str] = []
    o.append(f"{p.name} run {p.run} ({p.state}): a restart would stop it (verified), then "
        f"start run {p.run + 1}")  # fmt: skip
    if p.from_scratch:
        o.append("  from scratch: no checkpoint handed, no checkpoint guard")
    elif not p.checkpoint_glob:
        o.append("  no checkpoint glob in the spec: nothing handed, no guard")
    elif p.checkpoint is None:
        o.append(f"  checkpoint: none complete matches {p.checkpoint_glob}: nothing handed")
    else:
        step = "unknown step" if p.checkpoint_step is None else (
            f"step {'≈' if p.step_estimated else ''}{p.checkpoint_step:g}")  # fmt: skip
        o.append(f"  handed: {p.checkpoint} ({step}) in $TRAINCTL_RESUME_FROM")
        o.append(f"  kept aside: {p.keep}")
        if p.floor is not None:
            o.append(f"  guard: a first step below {p.floor:g} stops the run before it saves")
        else:
            o.append("  guard: off (the step is unknown, or resume_tolerance is off)")
    if p.warning:
        o.append(f"  warning: {p.warning}")
    return "\n".join(o)


def stop_plan(p: StopPlan) -> str:
    """Render `stop --dry-run`: what the stop would do, in the order it would do it."""
    o: list[str] = []
    o.append(
        f"{p.name} run {p.run} ({p.state}): a stop would send {p.signal} in order {p.order}, "
        f"grace {age(p.grace_s)}, then SIGKILL; {len(p.members)} live member(s)"
    )
    if p.queued:
        o.append("  its queued next run would be dequeued first")
    for m in p.members:
        gpu = " [GPU]" if m.gpu else ""
        o.append(f"  {m.pid:>7}  {m.role:<28} {term.middle(clean(m.cmd), term.width() - 40)}{gpu}")
    if p.checkpoint_glob:
        if p.checkpoint is None:
            o.append(f"  checkpoint: none complete matches {p.checkpoint_glob}")
        else:
            at = "" if p.checkpoint_step is None else f"step {p.checkpoint_step:g}, "
            o.append(f"  checkpoint: {p.checkpoint} ({at}{age(p.checkpoint_age_s or 0)} old)")
    why_not = "; ".join(f"not {k}: {v}" for k, v in p.cannot_at.items())
    o.append(f"  --at: can {', '.join(p.can_at)}" + (f" ({why_not})" if why_not else ""))
    if p.gpus:
        o.append(f"  GPUs {', '.join(map(str, p.gpus))}: the stop waits until they are released")
    if p.dooms:
        o.append(f"  it would fail the queued job(s) waiting for it: {', '.join(p.dooms)}")
    o.append("  nothing was signalled (--dry-run)")
    return "\n".join(o)


def queued(q: Queued) -> str:
    """Render a start that was queued."""
    o: list[str] = []
    o.append(f"queued {q.name}: position {q.position}, waiting for {'; '.join(q.waits_for)}")
    o.append(f"  `trainctl status {q.name}` shows its place; `trainctl stop {q.name}` dequeues it")
    return "\n".join(o)


def stop(res: StopResult, *, verbose: bool = False) -> Said:
    """Render a stop report: short by default (what was found, signalled, killed, the
    verdict); ``verbose`` adds the nets, launchers and each process's timing."""
    o: list[str] = []
    r = res.report
    if isinstance(r, SlurmStopReport):  # its own text, or the no-op's one line
        o.append(res.message or slurm_stop(res.name, res.run, r))
        return Said("\n".join(o), _warnings(res))
    if res.message:  # a no-op: one line, and the GPUs it checked again
        o.append(res.message)
        o.extend(f"  {gpu_line(g)}" for g in r.gpus)
        return Said("\n".join(o), _warnings(res))
    if r.already_stopped:
        why = r.reason
        o.append(
            f"{res.name}: {why}"
            if "backoff" in why
            else f"{res.name}: no process of run {res.run} was alive; nothing to stop"
        )
        return Said("\n".join(o))
    escaped = f", {r.escaped} escaped the tree" if r.escaped else ""
    o.append(
        f"stopped {res.name} run {res.run} via {res.via} ({r.mode} mode): "
        f"{r.found} process(es){escaped}"
    )
    if verbose:
        nets = ", ".join(f"{k} {v}" for k, v in sorted(r.by_net.items()))
        o.append(f"  found      by {nets}")
    if r.late_joiners:
        o.append(
            f"  late       {r.late_joiners} found after the signal (new forks, or outside "
            "the cgroup) and signalled too"
        )
    o.extend(_stop_details(r, verbose=verbose))
    if r.stacks:
        o.append(f"  stacks     of what outlived the grace, read before the SIGKILL: {r.stacks}")
    if r.zombies and verbose:
        o.append(f"  zombies    {len(r.zombies)} exited, waiting for their parent to reap them")
    for sv in r.survivors:
        o.append(survivor_line(sv))
    for g in r.gpus:
        o.append(f"  {gpu_line(g)}")
    code = "" if res.exit_code is None else f", main exit code {res.exit_code}"
    o.append(f"  total      {r.total_s:.2f} s — {r.verdict()}{code}")
    if r.cause is not None:
        o.append(f"  cause      {clean(r.cause.summary)}")
    return Said("\n".join(o), _warnings(res))


def _stop_details(r: StopReport, *, verbose: bool) -> list[str]:
    """Who got the signal and when, who exited on it, who was launcher, who was killed
    (and, first, the save in progress the stop waited for)."""
    o: list[str] = []
    if r.save_waited_s is not None:
        o.append(
            f"  save       waited {r.save_waited_s:.2f} s before the first signal for the "
            "checkpoint being written to be whole"
        )
    for launcher in r.launchers if verbose else ():
        head, why = f"  launcher   pid {launcher.pid} ", launcher.why or ""
        o.append(f"{head}{cmd_cell(launcher.cmd, len(head) + len(why) + 3)} ({why})")
        o.append(
            "             skipped for its workers; it gets the signal only if it outlives them"
        )
    signalled, named = _signalled_lines(r, verbose=verbose)
    o.extend(signalled)
    if not r.killed and not verbose:
        return o
    o.append(f"  SIGKILL    {r.killed} killed after the {r.grace_s:g} s grace")
    rest = [p for p in r.killed_procs if p.pid not in named]  # each pid is named once
    for p in rest[:NAMED_LINES]:
        head = f"    pid {p.pid:<7} "
        o.append(f"{head}{cmd_cell(p.cmd, len(head))}")
    if len(rest) > NAMED_LINES:
        o.append(f"    ... and {len(rest) - NAMED_LINES} more (--json names up to 64)")
    return o


def _signalled_lines(r: StopReport, *, verbose: bool) -> tuple[list[str], set[int]]:
    """The stop signal's line (and, verbose, each process's); the SIGKILLed pids named."""
    o: list[str] = []
    ex = r.exit_s
    if ex and ex["first"] != ex["last"] and verbose:
        timing = f" in {ex['first']:.2f}-{ex['last']:.2f} s (median {ex['median']:.2f} s)"
    elif ex:
        timing = f" within {ex['last']:.2f} s"
    else:
        timing = ""
    o.append(
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
        o.append(f"{head}{cmd_cell(p.cmd, len(head))}")
    if verbose and (len(r.sent) > NAMED_LINES or r.signalled > len(r.sent)):
        more = r.signalled - min(len(r.sent), NAMED_LINES)
        o.append(f"    ... and {more} more (--json names up to 64)")
    if r.exited_unsignalled and verbose:
        o.append(
            f"  unsignalled {r.exited_unsignalled} exited without the signal (a parent "
            "shut its children down, or a launcher exited once its workers were gone)"
        )
    return o, named


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


def survivor_line(s: Survivor) -> str:
    """One report line for a process that outlived the stop."""
    why = f" ({s.why})" if s.why else ""
    return f"  SURVIVOR   pid {s.pid} state {s.state} wchan {s.wchan or '-'}{why}: {clean(s.cmd)}"


def _warnings(res: StopResult | StartResult) -> str:
    """The result's warnings, a ``trainctl:`` line each (for stderr)."""
    return "\n".join(f"trainctl: {line}" for line in res.warnings)


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
