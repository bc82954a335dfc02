"""`trainctl deploy NAME...`: the code on disk into a running job, gated, with a way back."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import parse_duration, parse_seconds
from trainctl.launcher.ops import deploy as ops
from trainctl.launcher.ops import deployfiles as files
from trainctl.launcher.results.ops import DeployPlan
from trainctl.supervisor.errors import ConfigError, SpawnError
from trainctl.supervisor.model.deploys import DeployReport
from trainctl.supervisor.model.state import job_dir

from . import Invocation

FOLLOW_S = 0.1
# after the deployer handed over: the gate, a stop and a rollback run's first step, at most
VERDICT_SLACK_S = 900.0


def run(
    inv: Invocation,
    names: list[str],
    *,
    at: str | None = None,
    resume_tolerance: str = "2",
    probation: str | None = None,
    health: str | None = None,
    rollback: str = "auto",
    reload: bool = False,
    dry_run: bool = False,
    force: bool = False,
    checkpoint_timeout: str = "5m",
    grace: str | None = None,
    rolling: bool = False,
    as_json: bool = False,
    no_check: bool = False,
) -> int:
    """Deploy into job NAME (or, with --rolling, each NAME in turn); 0 when deployed."""
    if len(names) > 1 and not rolling:
        raise ConfigError("deploy takes one NAME; --rolling deploys several, one at a time")
    health_s = None if health is None else parse_duration(health, "--health")
    if health_s is not None and health_s <= 0:
        raise ConfigError("--health must be more than 0: the gate is the point of a deploy")
    timeout_s = parse_duration(checkpoint_timeout, "--checkpoint-timeout")
    grace_s = None if grace is None else parse_seconds(grace, "--grace")
    tolerance = _steps(resume_tolerance)
    probation_s = None if probation is None else parse_duration(probation, "--probation")

    def plan(name: str) -> DeployPlan:
        return ops.plan_deploy(
            inv.home, name, inv.cfg, at=at, health_s=health_s, rollback=rollback,
            reload=reload, force=force, checkpoint_timeout_s=timeout_s, grace_s=grace_s,
            resume_tolerance=tolerance, probation_s=probation_s, dry_run=dry_run,
            check=not no_check,
        )  # fmt: skip

    if dry_run:
        return _show_plans(inv, [plan(n) for n in names], rolling=rolling, as_json=as_json)
    reports = _one_by_one(inv, names, plan, rolling=rolling, quiet=as_json)
    if as_json:
        docs = [r.to_doc() for r in reports]
        untouched = names[len(reports) :]
        inv.reply({"deploys": docs, "untouched": untouched} if rolling else docs[0])
    deployed = all(r.ok for r in reports) and len(reports) == len(names)
    return ExitCode.OK if deployed else ExitCode.FAILED


def _show_plans(inv: Invocation, plans: list[DeployPlan], *, rolling: bool, as_json: bool) -> int:
    """--dry-run: each deploy's plan; nothing changed."""
    if as_json:
        docs = [p.to_doc() for p in plans]
        inv.reply({"dry_run": True, "plans": docs} if rolling else docs[0])
    else:
        for p in plans:
            render.show(render.deploy_plan(p))
    return ExitCode.OK


def _one_by_one(
    inv: Invocation,
    names: list[str],
    plan: Callable[[str], DeployPlan],
    *,
    rolling: bool,
    quiet: bool,
) -> list[DeployReport]:
    """Deploy into each job in turn, planned just before its turn; the first that fails
    ends the round (the rest are named, untouched)."""
    reports: list[DeployReport] = []
    for i, name in enumerate(names):
        rep = _deploy(inv, plan(name), quiet=quiet)
        reports.append(rep)
        if not rep.ok and rolling and names[i + 1 :]:
            sys.stderr.write(
                f"trainctl: --rolling stops here; not touched: {', '.join(names[i + 1 :])}\n"
            )
        if not rep.ok:
            break
    return reports


def _steps(raw: str) -> float:
    """--resume-tolerance: a number of steps, 0 or more."""
    try:
        steps = float(raw)
    except ValueError:
        steps = -1.0
    if not steps >= 0 or steps == float("inf"):
        raise ConfigError(f"--resume-tolerance {raw!r}: expected a number of steps, 0 or more")
    return steps


def _deploy(inv: Invocation, plan: DeployPlan, *, quiet: bool) -> DeployReport:
    """Hand the deploy to its deployer; follow its steps until its report is written (by
    the deployer, or by the supervisor that judges the new code once it runs)."""
    jdir = job_dir(inv.home, plan.name)
    ops.write_plan(jdir, plan)
    proc = ops.spawn_deployer(inv.home, plan.name, plan.id)
    seen, stopped = 0, False
    verdict_by: float | None = None  # the deployer handed over: the verdict comes by then
    if not quiet:
        render.line(f"deploy {plan.name} ({plan.id}): deployer pid {proc.pid}")
        render.line(f"  [new code] {render.code_check(plan.code_check)}")
    try:
        while True:
            for step in files.read_steps(jdir, plan.id, seen):
                seen += 1
                stopped = stopped or step.step != "checkpoint"
                if not quiet:
                    render.show(render.deploy_step(step), flush=True)
            rep = files.read_report(jdir, plan.id)
            if rep is not None:
                proc.poll()  # detached on purpose: it may still be on its way out
                if not quiet:
                    render.show(render.deploy_report(rep))
                return rep
            if verdict_by is None and proc.poll() is not None:
                if proc.returncode != 0:
                    raise SpawnError(
                        f"the deployer of {plan.name} exited ({proc.returncode}) without a "
                        f"report; see {jdir / 'events.jsonl'}"
                    )
                verdict_by = time.monotonic() + plan.health_s + VERDICT_SLACK_S
            if verdict_by is not None and time.monotonic() > verdict_by:
                raise SpawnError(
                    f"no verdict on the deploy of {plan.name} from its run's supervisor within "
                    f"{plan.health_s + VERDICT_SLACK_S:g} s; `trainctl history {plan.name}` "
                    "shows how it ends"
                )
            time.sleep(FOLLOW_S)
    except KeyboardInterrupt:
        return _interrupted(jdir, plan, proc.pid, stopped=stopped)


def _interrupted(where: Path, plan: DeployPlan, pid: int, *, stopped: bool) -> DeployReport:
    """Ctrl-C: before the stop, the deploy is cancelled; after it, it goes on by itself."""
    if not stopped:
        files.cancel_path(where, plan.id).touch()
        for _ in range(100):  # the deployer sees it before its stop (or is past it)
            rep = files.read_report(where, plan.id)
            if rep is not None:
                render.show(render.deploy_report(rep))
                return rep
            time.sleep(FOLLOW_S)
    sys.stderr.write(
        f"trainctl: the deploy of {plan.name} goes on without this terminal (its deployer, "
        f"pid {pid}, then the new run's supervisor); `trainctl history {plan.name}` shows "
        "how it ends\n"
    )
    raise SystemExit(ExitCode.INTERRUPTED)
