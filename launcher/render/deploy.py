"""`deploy` (plan, steps, report), `report` (goodput) and `history`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from trainctl.launcher import term
from trainctl.launcher.inputs import human_duration

if TYPE_CHECKING:
    from trainctl.launcher.results.ops import (
        CodeCheck,
        DeployPlan,
        Goodput,
        HistoryRow,
        InterruptionParts,
    )
    from trainctl.supervisor.model.deploys import DeployReport, DeployStep


from .base import Said, age, clean, duration


def deploy_plan(p: DeployPlan) -> str:
    """`deploy --dry-run`: every step it would take, and what it would touch."""
    o: list[str] = []
    old = p.from_code.line() if p.from_code else "not recorded"
    new = p.to_code.line() if p.to_code else "not recorded"
    o.append(f"deploy {p.name}: run {p.from_run} ({old}) -> the code on disk ({new})")
    o.append(f"  changes     {clean('; '.join(p.changes))}")
    o.append(f"  new code    {clean(code_check(p.code_check))}")
    if p.at == "next-checkpoint":
        o.append(
            f"  checkpoint  wait for the trainer's own next save (nothing is signalled), at most "
            f"{human_duration(p.checkpoint_timeout_s)}; newest now: {p.newest_checkpoint or 'none'}"
        )
    elif p.at == "checkpoint":
        seen = (
            "none yet"
            if p.newest_checkpoint is None
            else (f"{p.newest_checkpoint}, {age(p.newest_age_s or 0.0)} old")
        )
        o.append(
            f"  checkpoint  ask for one ({p.checkpoint_signal}), wait at most "
            f"{human_duration(p.checkpoint_timeout_s)}; newest now: {seen}"
        )
    else:
        o.append("  checkpoint  none asked for (--at now)")
    gpus = f" on GPU(s) {', '.join(p.gpus)}" if p.gpus else ""
    o.append(f"  stop        run {p.from_run}: main pid {p.main_pid}, {p.members} member(s){gpus}")
    resume = (
        ""
        if p.newest_step is None
        else f", its first step at or past {p.newest_step - p.resume_tolerance:g}"
    )
    o.append(
        f"  gate        progress past its first step within {human_duration(p.health_s)}{resume}"
    )
    o.append(
        f"  probation   until its first complete checkpoint, at most "
        f"{human_duration(p.probation_s)}: a crash or stall rolls back"
    )
    back = p.rollback_to if p.rollback_to else f"none ({p.no_rollback_why})"
    o.append(f"  rollback    {p.rollback}: {back}")
    return "\n".join(o)


def code_check(c: CodeCheck | None) -> str:
    """The look at the new code before the stop, in a line."""
    if c is None:
        return "not looked at (--no-check)"
    if c.python is None or (c.unchecked and not c.files):
        return f"not looked at: {c.unchecked}"
    by = f"{c.python} ({c.version})" if c.version else c.python
    beside = f" and {c.files - 1} module(s) beside it" if c.files > 1 else ""
    seen = f"{c.entry}{beside} compile; {c.imports} import(s) placed, by {by}"
    return f"{seen}; {c.unchecked}" if c.unchecked else seen


def deploy_step(step: DeployStep) -> str:
    """One step of a deploy, as it happens."""
    o: list[str] = []
    left = f" ({human_duration(step.left_s)} at most)" if step.left_s else ""
    o.append(f"  [{step.step}] {clean(step.line)}{left}")
    return "\n".join(o)


def deploy_report(r: DeployReport) -> Said:
    """How a deploy ended (on stderr as well when it did not deploy)."""
    o: list[str] = []
    line = f"deploy {r.name}: {r.outcome}: {clean(r.summary)}"
    if r.ok:
        o.append(line)
        if r.probation_until is not None:
            until = time.strftime("%H:%M:%S", time.localtime(r.probation_until))
            o.append(
                f"  on probation until {until} or its first complete checkpoint: a crash or "
                f"stall meanwhile rolls back (`trainctl status {r.name}`)"
            )
        return Said("\n".join(o))
    err = [f"trainctl: {line}"]
    if r.kept:  # where the handed checkpoint is, whatever became of the original
        back = "put back over the original, " if r.restored else ""
        err.append(f"  checkpoint {r.checkpoint}: {back}a copy is kept in {r.kept}")
    err.extend(f"  | {clean(text)}" for text in r.last_lines[-10:])
    return Said(err="\n".join(err))


def parts_line(p: InterruptionParts) -> str:
    """``detect 1.2s, stop 0.4s, down 1.1s (backoff 1.0s), restore 4.1s, redo 2.0s``."""
    backoff = f" (backoff {duration(p.backoff)})" if p.backoff else ""
    return (
        f"detect {duration(p.detect)}, stop {duration(p.stop)}, down {duration(p.down)}"
        f"{backoff}, restore {duration(p.restore)}, redo {duration(p.redo)}"
    )


def goodput_line(g: Goodput) -> str:
    """A job's goodput in one line (`report`'s first, the web page's charts' caption)."""
    state = "running" if g.running else "ended"
    if g.goodput is None:
        return f"{duration(g.wall_s)} since its first start, {g.runs} run(s), {state}"
    return (
        f"goodput {g.goodput:.2f}: productive {duration(g.productive_s or 0.0)} of "
        f"{duration(g.wall_s)} since its first start, {g.runs} run(s), {state}"
    )


def goodput(g: Goodput) -> str:
    """`trainctl report NAME`: goodput, the lost time by bucket, each interruption."""
    o: list[str] = [f"{g.name}: {goodput_line(g)}"]
    if g.stopped_s >= 0.05:  # not lost: out of the goodput's denominator
        o.append(f"  stopped   by you {duration(g.stopped_s)} (not counted against it)")
    lost = [f"{k.replace('_', ' ')} {duration(v)}" for k, v in g.lost_s.items() if v >= 0.05]
    steps = "" if not g.steps_lost else f" ({g.steps_lost:g} steps redone)"
    o.append(f"  lost      {', '.join(lost) or 'nothing'}{steps}")
    if g.typical_step_s:
        o.append(f"  step      {duration(g.typical_step_s)} typical")
    for i in g.interruptions:
        when = time.strftime("%m-%d %H:%M:%S", time.localtime(i.at))
        o.append(
            f"  run {i.run:<4} {when}  lost {duration(i.lost_s):>8}, {i.steps_lost:g} steps: "
            f"{clean(i.cause)}"
        )
        if i.parts is not None:
            o.append(f"{'':<26}{parts_line(i.parts)}")
    if g.needs_progress:
        o.append(
            "  no progress reported: productive time, goodput, start-up, restore, saves and "
            "steps redone need $TRAINCTL_PROGRESS or progress_regex (docs/training.md)"
        )
    return "\n".join(o)


def history(name: str, rows: list[HistoryRow]) -> str:
    """`trainctl history NAME`: a run a row, oldest first."""
    o: list[str] = []
    o.append(f"{'RUN':>4}  {'STARTED':<19}  {'TOOK':>8}  {'CODE':<28}  {'STEPS':>8}  END")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started_at or 0))
        took = duration(r.duration_s) if r.duration_s is not None else "-"
        steps = f"{r.steps:g}" if r.steps is not None else "-"
        end = r.phase or "running"
        if r.cause:
            end += f": {r.cause}"
        marks = f"  [{'; '.join(r.marks)}]" if r.marks else ""
        o.append(
            f"{r.run:>4}  {when:<19}  {took:>8}  {clean(r.code or '-'):<28}  {steps:>8}  "
            f"{term.middle(clean(end + marks), max(20, term.width() - 78))}"
        )
    if not rows:
        o.append(f"job {name} has no recorded run yet")
    return "\n".join(o)
