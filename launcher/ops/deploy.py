"""`trainctl deploy`: a code change into a running run, checkpoint-gated, with a way back.

The verb plans and checks (:func:`plan_deploy`: nothing is touched), then hands the deploy
to a detached deployer process (launcher/deployer.py, :func:`execute`), which holds
``<job>/deploy.lock`` for its whole life and writes each step to
``<job>/deploys/<id>.steps.jsonl`` and its outcome to ``<id>.report.json``. The verb only
follows those files: a closed terminal, a Ctrl-C after the stop began, or a SIGKILLed
CLI changes nothing about the outcome (the supervisor could not hold the gate: it is
replaced along with the run it supervises).

The steps, in order:

1. ``--at checkpoint`` (the default when the job names a ``checkpoint`` glob): ask for a
   checkpoint through the job's own channel, as ``stop --checkpoint`` does, and wait
   until one newer than the request is complete. None within ``--checkpoint-timeout``:
   nothing is stopped, the deploy fails.
2. A Ctrl-C of the verb before this point cancels the deploy; nothing changed.
3. The verified stop and the GPU release proof (``restart``'s), then the new run with the
   code on disk (a new snapshot of it, with ``snapshot = git|copy``);
   ``TRAINCTL_RESUME_FROM`` names the checkpoint (``trainer.resume_from()`` reads it).
4. The gate: the new run must report a step past the first one it reports (it resumed
   and advanced), or write a checkpoint, within ``--health`` (10 min at most by
   default). It fails when the run ends with a failure, or when nothing comes.
5. On failure, with ``--rollback auto`` and a snapshot of the previous run: that code
   starts again, from the same checkpoint; ``on_deploy_failed`` and ``notify`` are told
   both commits and the cause. Without a snapshot there is no way back: the report says so.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

from trainctl.launcher import backends, codecheck, snapshot
from trainctl.launcher.checkpoint import (
    newest_checkpoint,
    wait_complete,
    wait_new_checkpoint,
    wait_next_save,
    with_step,
)
from trainctl.launcher.config import Config
from trainctl.launcher.results import Checkpoint
from trainctl.launcher.results.ops import DeployPlan
from trainctl.supervisor import ids
from trainctl.supervisor.errors import (
    ConfigError,
    JobConflictError,
    ProcessTreeError,
    TrainctlError,
)
from trainctl.supervisor.life import hooks
from trainctl.supervisor.model import deploys, keepsafe, layout, state
from trainctl.supervisor.model.deploys import DeployReport
from trainctl.supervisor.model.layout import PREVIOUS_SPEC
from trainctl.supervisor.model.reports import GATE, Cause, Trial
from trainctl.supervisor.model.schema import build_document
from trainctl.supervisor.model.sections import CodeRecord
from trainctl.supervisor.model.spec import Spec, spec_to_doc
from trainctl.supervisor.model.state import JobState, Phase
from trainctl.supervisor.records import asdict, field, record, replace
from trainctl.supervisor.tree.proctree import alive, scan, target_of
from trainctl.supervisor.watch.drift import code_version, drift

from . import queue
from .deployfiles import (
    LOCK,
    cancel_path,
    deploys_dir,
    plan_path,
)
from .jobs import current_phase, existing_job, live_members
from .plan import at_options
from .start import reloaded_spec, restart_job
from .stop import ask_checkpoint

RESUME_VAR = state.RESUME_VAR
DEPLOY_VAR = layout.DEPLOY_VAR  # the deploy's id, in the new run's environment
DEFAULT_HEALTH_S = 600.0
DEFAULT_RESUME_TOLERANCE = 2.0  # steps: a trainer may report its save's step +-1
DEFAULT_PROBATION_S = 1800.0
DEFAULT_PROBATION_NO_GLOB_S = 120.0


# ---------------------------------------------------------------- the plan (the verb)


def plan_deploy(
    home: Path,
    name: str,
    cfg: Config,
    *,
    at: str | None,
    health_s: float | None,
    rollback: str,
    reload: bool,
    force: bool,
    checkpoint_timeout_s: float,
    grace_s: float | None = None,
    resume_tolerance: float = DEFAULT_RESUME_TOLERANCE,
    probation_s: float | None = None,
    dry_run: bool = False,
    check: bool = True,
) -> DeployPlan:
    """Check that ``name`` can take a deploy now, and decide every step; change nothing.
    ``check``: look at the new code first (launcher/codecheck.py), and refuse code that
    cannot start."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    state.require_known(name, st)
    _refuse_unless_running(name, st, current_phase(jdir, st), home)
    if not backends.of(st).can.deploy:
        raise ConfigError(f"job {name} runs under {st.backend}: deploy is for local jobs")
    spec = state.read_spec(jdir)
    new_spec = reloaded_spec(spec, cfg) if reload else spec
    to_code, changes = _new_code(name, st, spec, new_spec, force=force)
    if state.is_locked(jdir, LOCK):
        raise JobConflictError(f"a deploy of {name} is already running; wait for it to end")
    if st.trial is not None and st.trial.stage == GATE and not dry_run:
        # on probation, a new deploy ends the probation (its stop); at the gate it waits
        raise JobConflictError(
            f"deploy {st.trial.id} of {name} is at its gate (run {st.run}); wait for its verdict"
        )
    _refuse_blind(name, spec, jdir, st.run)
    can, cannot = at_options(spec, list(alive(scan(target_of(st))).values()))
    at = _when(name, spec, at, cannot)
    back = _rollback_target(jdir, spec, rollback)
    ck = _resume_point(name, spec, jdir, st.run, at=at, force=force)
    return DeployPlan(
        code_check=(
            codecheck.refuse_broken(name, new_spec, snapshot.source_of(new_spec), verb="deploys")
            if check
            else None
        ),
        newest_step=ck.step if ck else None,
        resume_tolerance=resume_tolerance,
        probation_s=_probation(spec, probation_s),
        keep_max=spec.watch.checkpoint_keep_max,
        can_at=can,
        id=f"{int(time.time())}-{ids.short_id()}",
        name=name,
        from_run=st.run,
        from_code=st.code,
        to_code=to_code,
        changes=changes or (["--reload: the spec file as it is now"] if reload else ["--force"]),
        at=at,
        checkpoint_glob=spec.watch.checkpoint,
        checkpoint_signal=spec.watch.checkpoint_signal,
        newest_checkpoint=ck.path if ck else None,
        newest_age_s=round(ck.age_s, 1) if ck else None,
        checkpoint_timeout_s=checkpoint_timeout_s,
        main_pid=st.main.pid if st.main else None,
        members=len(live_members(st)),
        gpus=[g.label for g in st.gpus],
        health_s=DEFAULT_HEALTH_S if health_s is None else health_s,
        rollback=rollback if back[0] is not None else "never",
        rollback_to=back[0],
        no_rollback_why=back[1],
        snapshot=spec.snapshot.mode,
        reload=reload,
        grace_s=grace_s,
    )


def _new_code(
    name: str, st: JobState, spec: Spec, new_spec: Spec, *, force: bool
) -> tuple[CodeRecord | None, list[str]]:
    """The code a deploy brings (its version) and what changed; refused when nothing did
    (unless --force or --reload) or the new code cannot be snapshotted."""
    source = replace(new_spec, cwd=snapshot.source_of(new_spec))
    changes = drift(st.code, spec)
    if not changes and not force and new_spec is spec:
        raise ConfigError(
            f"job {name}: its code has not changed since run {st.run} started "
            f"({st.code.line() if st.code else 'nothing recorded'}); --force to deploy anyway"
        )
    snapshot.check(replace(new_spec, source=None, cwd=source.cwd))
    return code_version(source), changes


def _resume_point(
    name: str, spec: Spec, jdir: Path, run: int, *, at: str, force: bool
) -> Checkpoint | None:
    """The newest complete checkpoint the new code resumes from; refused when a deploy
    `--at now` would have none (unless --force), or when it is not kept safe."""
    ck = newest_checkpoint(spec, jdir, run)
    if spec.watch.checkpoint and at == "now" and ck is None and not force:
        raise ConfigError(
            f"job {name}: nothing complete matches its checkpoint glob "
            f"{spec.watch.checkpoint!r}: the new code would have nothing to resume from; "
            "--at next-checkpoint waits for one (--force deploys anyway)"
        )
    _refuse_unprotected(name, spec, ck)
    return ck


def _refuse_blind(name: str, spec: Spec, jdir: Path, run: int) -> None:
    """A job that shows no progress (no checkpoint glob, no progress_regex, not a line in
    its $TRAINCTL_PROGRESS) gives a gate nothing to pass on: refused in the plan, before
    anything stops (it used to stop the run, fail "no progress within 5 s" and roll
    back: two restarts for a gate that could never pass)."""
    if spec.watch.checkpoint or spec.watch.progress_regex:
        return
    try:
        reported = state.progress_path(jdir, run).stat().st_size > 0
    except OSError:
        reported = False
    if not reported:
        raise ConfigError(
            f"job {name} reports no progress (no checkpoint glob, no progress_regex, nothing "
            "in $TRAINCTL_PROGRESS): a deploy's gate could never pass; `trainctl restart "
            f"{name}` brings in the code on disk (its --health watches the new run), or set "
            "progress_regex or checkpoint in the spec"
        )


def _when(name: str, spec: Spec, at: str | None, cannot: dict[str, str]) -> str:
    """--at: by default a checkpoint asked for by signal when a process catches it, else
    the trainer's own next save, when the job names a glob; else now."""
    if at is None:
        if not spec.watch.checkpoint:
            return "now"
        return "next-checkpoint" if "checkpoint" in cannot else "checkpoint"
    if at != "now" and not spec.watch.checkpoint:
        raise ConfigError(
            f"job {name} names no `checkpoint` glob: --at {at} cannot tell when one "
            "is written (use --at now, or set checkpoint in the spec)"
        )
    if at == "checkpoint" and "checkpoint" in cannot:
        raise JobConflictError(
            f"job {name}: {cannot['checkpoint']}; nothing was signalled "
            "(--at next-checkpoint waits for the trainer's own next save instead)"
        )
    return at


def _probation(spec: Spec, asked_s: float | None) -> float:
    """--probation: else until the new run's first complete checkpoint, at most 30 min;
    a job without a checkpoint glob: 2 min of running without a crash or a stall."""
    if asked_s is not None:
        return asked_s
    return DEFAULT_PROBATION_S if spec.watch.checkpoint else DEFAULT_PROBATION_NO_GLOB_S


def _refuse_unprotected(name: str, spec: Spec, ck: Checkpoint | None) -> None:
    """A checkpoint rewritten in place and too big to keep aside: refuse, before
    anything is stopped (new code that starts over would overwrite it for good)."""
    cap = spec.watch.checkpoint_keep_max
    if ck is None or ck.size <= cap or not keepsafe.rewritten_in_place(spec.watch.checkpoint):
        return
    raise ConfigError(
        f"job {name}: its checkpoint {ck.path} ({ck.size >> 20} MiB) is rewritten in place "
        f"and larger than checkpoint_keep_max ({cap >> 20} MiB): new code that started over "
        "would overwrite it with nothing kept; raise checkpoint_keep_max (a reflink costs "
        "no space where the file system has them), or save to a new name per step"
    )


def _refuse_unless_running(name: str, st: JobState, phase: Phase, home: Path) -> None:
    if queue.read_entry(home, name) is not None and phase.ended:
        raise JobConflictError(
            f"job {name} is queued, not running: nothing to deploy into (its queued start "
            "takes the code on disk when it starts)"
        )
    if phase == Phase.LOST:
        raise JobConflictError(
            f"job {name} is lost (its supervisor is gone): `trainctl stop {name}` first, "
            f"then `trainctl start`"
        )
    if phase.ended or phase == Phase.STOPPING:
        raise JobConflictError(
            f"job {name} is not running ({phase}): nothing to deploy into; "
            f"`trainctl restart {name}` starts it with the code on disk"
        )
    if st.restart_at is not None:
        raise JobConflictError(
            f"job {name} is waiting out a restart backoff: deploy once its run is up"
        )


def _rollback_target(jdir: Path, spec: Spec, rollback: str) -> tuple[str | None, str | None]:
    """The previous code to go back to: (its directory, None) or (None, why there is none)."""
    if rollback == "never":
        return None, "--rollback never"
    if spec.source is None or snapshot.run_of(spec, jdir) is None:
        return None, (
            "snapshot = none: the running code is not kept, so there is no way back "
            '(set snapshot = "git" or "copy" in the spec)'
        )
    if not Path(spec.cwd).is_dir():
        return None, f"the running run's snapshot {spec.cwd} is gone"
    return spec.cwd, None


def write_plan(jdir: Path, plan: DeployPlan) -> Path:
    deploys_dir(jdir).mkdir(mode=0o700, exist_ok=True)
    path = plan_path(jdir, plan.id)
    state.write_json_atomic(path, plan.to_doc())
    return path


def spawn_deployer(home: Path, name: str, did: str) -> subprocess.Popen[bytes]:
    """Start the detached deployer (its own session; the verb only follows its files)."""
    return subprocess.Popen(
        [sys.executable, "-m", "trainctl.launcher.deployer", str(home), name, did],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        cwd="/",
    )


# ---------------------------------------------------------------- the deployer


@record()
class _Deploy:
    """The deployer's working state for one deploy."""

    home: Path
    jdir: Path
    plan: DeployPlan
    cfg: Config
    previous: Spec  # the running run's spec: a rollback starts it again, in its snapshot
    started_at: float = field(default_factory=time.time)
    checkpoint: Checkpoint | None = None
    step: str = "checkpoint"
    kept: keepsafe.Kept | None = None
    restored: bool = False

    def say(self, step: str, line: str, left_s: float | None = None) -> None:
        self.step = step
        deploys.say(self.jdir, self.plan.id, step, line, left_s)

    def report_doc(self, outcome: str, summary: str, **more: object) -> DeployReport:
        """The deploy's report as it stands (not written)."""
        p = self.plan
        return DeployReport(
            id=p.id, name=p.name, outcome=outcome, step=self.step, summary=summary,
            from_run=p.from_run, from_commit=_commit(p.from_code), to_commit=_commit(p.to_code),
            checkpoint=self.checkpoint.path if self.checkpoint else None,
            checkpoint_step=self.checkpoint.step if self.checkpoint else None,
            kept=self.kept.path if self.kept else None, restored=self.restored,
            started_at=self.started_at, ended_at=time.time(),
            **more,  # type: ignore[arg-type]
        )  # fmt: skip

    def report(self, outcome: str, summary: str, **more: object) -> DeployReport:
        """Write the deploy's report (the verb's answer) and its event."""
        rep = self.report_doc(outcome, summary, **more)
        deploys.write_report(self.jdir, rep)
        return rep


def _commit(code: CodeRecord | None) -> str | None:
    """The code in a deploy's lines: the commit, with the uncommitted diff's hash beside it
    when dirty (``3f2a9c1e7b2d+5d41402a``); else the copied tree's or entry script's."""
    if code is None:
        return None
    if code.git_head:
        dirty = f"+{code.diff_sha[:8]}" if code.dirty and code.diff_sha else ""
        return code.git_head[:12] + dirty
    sha = code.tree_sha or code.entry_sha
    return sha[:12] if sha else None


def execute(home: Path, name: str, did: str, cfg: Config) -> DeployReport | None:
    """Run deploy ``did`` of job ``name`` until the new code runs (None: its supervisor
    judges it and writes the report) or the deploy ended here (its report, also on disk)."""
    jdir = existing_job(home, name)
    doc = json.loads(plan_path(jdir, did).read_text())
    plan = build_document(DeployPlan, doc, str(plan_path(jdir, did)))
    d = _Deploy(home, jdir, plan, cfg, state.read_spec(jdir))
    try:
        with state.flock_file(jdir / LOCK, 0.0, f"a deploy of {name} is already running"):
            return _run(d)
    except JobConflictError as e:
        return d.report("refused", str(e))


def _run(d: _Deploy) -> DeployReport | None:
    """Steps 1-3; then the new run's supervisor holds the new code to its gate and
    probation and writes the report (None here: handed over)."""
    p = d.plan
    ended = _checkpoint_step(d, d.previous) or _keep_aside(d)
    if ended is not None:
        return ended
    d.say("stop", f"stopping run {p.from_run} (verified), then starting the new code")
    resume = d.checkpoint.path if d.checkpoint else None
    with contextlib.suppress(OSError, TrainctlError):  # the way back (service.py)
        if p.rollback_to is not None:
            doc = spec_to_doc(d.previous)
            state.write_json_atomic(deploys_dir(d.jdir) / PREVIOUS_SPEC.format(id=p.id), doc)
    state.write_json_atomic(deploys.trial_path(d.jdir, p.id), asdict(_trial(d)))
    try:
        _, started = restart_job(
            d.home, p.name, d.cfg, grace_s=p.grace_s, reload=p.reload, verb="deploy",
            respec=lambda s: _resuming(s, resume, p.id),
        )  # fmt: skip
    except TrainctlError as e:
        st = state.read_state(d.jdir)
        if st.run == p.from_run and current_phase(d.jdir, st).ended:
            # the old run is stopped and the new code never started: go back all the same
            return _rollback(d, f"the new code did not start: {e}", resume)
        return d.report("failed", f"the stop failed, nothing was started: {e}")
    d.say("start", f"run {started.run} started (main pid {started.main_pid}); its "
          "supervisor holds it to the gate")  # fmt: skip
    d.say("gate", f"waiting for run {started.run} to make progress", p.health_s)
    return None


def _trial(d: _Deploy) -> Trial:
    """What the new run's supervisor holds the new code to (model/deploys.py)."""
    p, ck = d.plan, d.checkpoint
    return Trial(
        id=p.id, name=p.name, from_run=p.from_run, health_s=p.health_s,
        probation_s=p.probation_s, resume_tolerance=p.resume_tolerance,
        rollback=p.rollback == "auto" and p.rollback_to is not None,
        no_rollback_why=p.no_rollback_why, from_commit=_commit(p.from_code),
        to_commit=_commit(p.to_code), checkpoint=ck.path if ck else None,
        checkpoint_step=ck.step if ck else None, checkpoint_mtime=ck.mtime if ck else None,
        checkpoint_size=ck.size if ck else 0, checkpoint_glob=p.checkpoint_glob,
        kept=d.kept.path if d.kept else None, started_at=d.started_at, cwd=d.previous.cwd,
    )  # fmt: skip


def _checkpoint_step(d: _Deploy, spec: Spec) -> DeployReport | None:
    """Steps 1 and 2: the checkpoint (or the newest one, --at now), unless cancelled; a
    report when the deploy ends here (nothing was stopped)."""
    p = d.plan
    if p.at == "now":
        d.checkpoint = newest_checkpoint(spec)
        if d.checkpoint is None and p.newest_checkpoint is not None:
            # the plan saw one: a save in place is rewriting it now; its end comes soon
            d.say(
                "checkpoint",
                f"{p.newest_checkpoint} is being saved: waiting for it",
                p.checkpoint_timeout_s,
            )
            d.checkpoint = wait_complete(spec, p.checkpoint_timeout_s)
            if d.checkpoint is None:
                why = f"within {p.checkpoint_timeout_s:g} s; nothing was stopped"
                return d.report("failed", f"{p.newest_checkpoint} was not complete again {why}")
    else:
        if p.at == "checkpoint":
            d.say("checkpoint", f"asking {p.name} for a checkpoint ({p.checkpoint_signal})",
                  p.checkpoint_timeout_s)  # fmt: skip
        else:
            d.say("checkpoint", f"waiting for {p.name}'s own next save (nothing is signalled)",
                  p.checkpoint_timeout_s)  # fmt: skip
        try:
            wait = _await_checkpoint if p.at == "checkpoint" else _await_next_save
            d.checkpoint = wait(d, spec)
        except (_CancelledError, TrainctlError, TimeoutError) as e:
            if isinstance(e, _CancelledError) or cancel_path(d.jdir, p.id).exists():
                return d.report("cancelled", "cancelled before the stop; nothing changed")
            return d.report("failed", f"no checkpoint: {e}; nothing was stopped")
        if d.checkpoint is None:
            return d.report("failed", f"job {p.name} is not running any more; nothing stopped")
        d.say("checkpoint", f"checkpoint {d.checkpoint.path} written")
    d.checkpoint = with_step(d.checkpoint, d.jdir, p.from_run, spec.watch.progress_regex)
    if cancel_path(d.jdir, p.id).exists():
        return d.report("cancelled", "cancelled before the stop; nothing changed")
    return None


def _none() -> None:
    return None


def _await_next_save(d: _Deploy, spec: Spec) -> Checkpoint | None:
    p = d.plan
    watch = backends.of(state.read_state(d.jdir)).watch_run(d.jdir, p.from_run)

    def running() -> bool:
        return not watch.over()  # the supervisor's events: state.json is not polled

    return wait_next_save(
        spec, time.time(), p.checkpoint_timeout_s, running,
        lambda: cancel_path(d.jdir, p.id).exists(),
    )  # fmt: skip


def _keep_aside(d: _Deploy) -> DeployReport | None:
    """Keep the handed checkpoint safe until the new code passed (keepsafe.py); a report
    when the deploy ends here (nothing was stopped)."""
    ck, p = d.checkpoint, d.plan
    if ck is None:
        return None
    if ck.size > p.keep_max:
        if keepsafe.rewritten_in_place(p.checkpoint_glob):
            return d.report(
                "refused", f"checkpoint {ck.path} is rewritten in place and over "
                "checkpoint_keep_max: nothing would protect it; nothing was stopped",
            )  # fmt: skip
        d.say("keep", f"checkpoint {ck.path} is over checkpoint_keep_max: not kept aside "
              "(a new name per save: the new code cannot overwrite it)")  # fmt: skip
        return None
    try:
        d.kept = keepsafe.keep(ck, deploys_dir(d.jdir) / f"{p.id}.kept")
    except OSError as e:
        return d.report("failed", f"cannot keep checkpoint {ck.path} aside ({e.strerror}); "
                        "nothing was stopped")  # fmt: skip
    k = d.kept
    d.say("keep", f"checkpoint kept aside by {k.how} in {k.took_s:.2f} s ({k.size >> 20} MiB)")
    return None


class _CancelledError(Exception):
    """The verb was interrupted before the stop: the deploy ends, nothing changed."""


def _await_checkpoint(d: _Deploy, spec: Spec) -> Checkpoint | None:
    """Ask for a checkpoint and wait for it, a second at a time: a Ctrl-C of the verb
    (its cancel file) ends the wait, and the deploy, at once."""
    p = d.plan
    deadline = time.monotonic() + p.checkpoint_timeout_s
    asked_at = time.time()
    try:
        return ask_checkpoint(d.home, p.name, spec, min(1.0, p.checkpoint_timeout_s), _none)
    except ProcessTreeError:
        pass  # asked; not written yet
    while True:
        if cancel_path(d.jdir, p.id).exists():
            raise _CancelledError
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"no new checkpoint matching {spec.watch.checkpoint!r} within "
                f"{p.checkpoint_timeout_s:g} s after {spec.watch.checkpoint_signal}"
            )
        with contextlib.suppress(ProcessTreeError):
            return wait_new_checkpoint(spec, asked_at, min(1.0, left))


def _resuming(spec: Spec, resume: str | None, did: str) -> Spec:
    env = {**spec.env, DEPLOY_VAR: did}
    env.pop(RESUME_VAR, None)
    if resume is not None:
        env[RESUME_VAR] = resume
    return replace(spec, env=env)


def _save_progress(d: _Deploy) -> bool:
    """Before the old code runs again: put the handed checkpoint back if it changed, and
    move aside checkpoints that fell behind it. True when the kept copy went back."""
    restored, done = deploys.put_back(_trial(d), d.previous.cwd)
    for line in done:
        d.say("rollback", line)
    return restored


def _rollback(d: _Deploy, why: str, resume: str | None) -> DeployReport | None:
    """The old run is stopped and the new code never started (no supervisor judges it):
    the old code starts again, from the same checkpoint. Its supervisor writes the report
    once its checkpoint guard has judged it (the held report, model/deploys.py)."""
    p = d.plan
    old, new = _commit(p.from_code) or "?", _commit(p.to_code) or "?"
    if p.rollback != "auto" or p.rollback_to is None:
        with contextlib.suppress(OSError):  # put back what it overwrote, at least
            d.restored = _save_progress(d)
        no = p.no_rollback_why or "--rollback never"
        _tell(d, Cause(kind="deploy_failed", summary=f"deploy of {new} failed: {why}; "
                       f"not rolled back ({no})"))  # fmt: skip
        return d.report("failed", f"the new code failed its gate ({why}); not rolled back: {no}",
                        cause=why)  # fmt: skip
    d.say("rollback", f"{why}: rolling back to run {p.from_run}'s code ({old})")
    nxt = state.read_state(d.jdir).run + 1  # this deployer holds the job: the next run
    summary = f"deploy of {new} failed: {why}; rolled back to {old} (run {nxt})"
    held = d.report_doc("rolled-back", summary, cause=why, rollback_run=nxt)
    deploys.hold_rollback(d.jdir, held)
    try:
        restart_job(
            d.home, p.name, d.cfg, grace_s=p.grace_s, verb="deploy", keep_cwd=True,
            respec=lambda _new: _resuming(d.previous, resume, p.id),
            after_stop=lambda: _put_back(d),
            rolled_back=f"deploy {p.id} of {new} failed: {why}",
        )  # fmt: skip
    except TrainctlError as e:
        deploys.rollback_path(d.jdir, p.id).unlink(missing_ok=True)
        _tell(d, Cause(kind="deploy_failed", summary=f"deploy of {new} failed: {why}; "
                       f"the rollback to {old} failed too: {e}"))  # fmt: skip
        return d.report("failed", f"{why}; the rollback failed: {e}", cause=why)
    _tell(d, Cause(kind="deploy_failed", summary=summary))
    d.say("done", f"run {nxt} runs the previous code ({old})")
    return None  # the held report is the rollback run's to write


def _put_back(d: _Deploy) -> None:
    with contextlib.suppress(OSError):
        d.restored = _save_progress(d)


def _tell(d: _Deploy, cause: Cause) -> None:
    """on_deploy_failed and notify: both commits and the cause, in the summary."""
    with contextlib.suppress(TrainctlError, OSError):
        spec = state.read_spec(d.jdir)
        st = state.read_state(d.jdir)
        hooks.fire("deploy_failed", spec, d.jdir, st, cause)
