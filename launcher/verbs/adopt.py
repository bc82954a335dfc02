"""`trainctl adopt NAME --pid PID | --tmux TARGET`: take over a run trainctl did not start."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import confirm
from trainctl.launcher.ops.adopt import (
    adopt_job,
    adopt_sets,
    plan_gpu,
    plan_lost,
    plan_pid,
    plan_tmux,
    readopt_job,
)
from trainctl.launcher.results.ops import Plan
from trainctl.supervisor.errors import ConfigError
from trainctl.supervisor.model import state
from trainctl.supervisor.model.state import JobState

from . import Invocation


def run(
    inv: Invocation,
    name: str,
    *,
    pid: int | None = None,
    tmux: str | None = None,
    tmux_socket: str | None = None,
    gpu: str | None = None,
    sets: tuple[str, ...] = (),
    dry_run: bool = False,
    yes: bool = False,
    as_json: bool = False,
) -> int:
    """Show the members found, then (unless --dry-run) hand them to a new supervisor."""
    given = adopt_sets(sets)  # checked before anything is looked at
    plan, lost = _planned(inv, name, pid, tmux, tmux_socket, gpu)
    if lost is not None and sets:
        raise ConfigError(
            f"adopt {name} alone keeps the job's recorded spec; --set is for --pid, --tmux or --gpu"
        )
    if dry_run:
        if as_json:
            inv.reply({"dry_run": True, **plan.to_doc()})
        else:
            _show(name, plan)
            render.line("dry run: nothing changed")
        return ExitCode.OK
    if not as_json:
        _show(name, plan)
    confirm(f"adopt these {len(plan.members)} process(es) as job {name}?", yes=yes, flag="--yes")
    if lost is not None:
        res = readopt_job(inv.home, name, plan, lost, inv.cfg)
    else:
        res = adopt_job(inv.home, name, plan, inv.cfg, given)
    if as_json:
        found = plan.to_doc()
        found["processes"] = found.pop("members")  # `members` is the count, as in status
        inv.reply({**found, **res.to_doc()})
        return ExitCode.OK
    render.line(
        f"adopted {res.name} run {res.run}: main pid {res.main_pid}, {res.members} "
        f"process(es), {res.containment}"
    )
    if res.log_from:
        render.line(f"log: from now on, copied from {res.log_from} (trainctl logs {name})")
    else:
        render.line("log: none (its output goes to a terminal or a pipe trainctl cannot read)")
    return ExitCode.OK


def _planned(
    inv: Invocation,
    name: str,
    pid: int | None,
    tmux: str | None,
    socket: str | None,
    gpu: str | None,
) -> tuple[Plan, JobState | None]:
    """What to adopt, checked: a pid's session, tmux panes, GPU holders, or a lost job."""
    state.check_name(name)
    if sum(x is not None for x in (pid, tmux, gpu)) > 1:
        raise ConfigError("adopt: give one of --pid PID, --tmux TARGET or --gpu INDEX")
    if socket is not None and tmux is None:
        raise ConfigError("adopt: --tmux-socket goes with --tmux")
    if pid is not None:
        return plan_pid(pid), None
    if tmux is not None:
        return plan_tmux(tmux, socket), None
    if gpu is not None:
        return plan_gpu(inv.home, gpu), None
    return plan_lost(inv.home, name)  # a lost job of trainctl's own


def _show(name: str, plan: Plan) -> None:
    render.line(f"job {name} would take {len(plan.members)} process(es) ({plan.how}):")
    width = max(len(str(m.pid)) for m in plan.members)
    for m in plan.members:
        mark = " (main)" if m.pid == plan.main.pid else ""
        cmd = render.cmd_cell(m.cmd, width + 18)
        render.line(f"  {m.pid:>{width}}  {'+'.join(m.nets):<10}  {cmd}{mark}")
