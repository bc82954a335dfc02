"""Start and restart: validate the spec, refuse a busy name, hand the run to its backend."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from trainctl.launcher import backends
from trainctl.launcher.config import HOOK_KEYS, Config
from trainctl.launcher.inputs import parse_duration, parse_env, parse_seconds, parse_signal
from trainctl.launcher.results import EndedAtOnce, GpuRequest, StartResult, StopResult
from trainctl.launcher.results.ops import Health, RestartPlan
from trainctl.launcher.specfile import KEYS, SpecDraft, load_spec_file
from trainctl.supervisor.errors import ConfigError, JobConflictError, SpawnError
from trainctl.supervisor.gpu import health
from trainctl.supervisor.life import hooks
from trainctl.supervisor.life import lifecycle as lc
from trainctl.supervisor.life.causes import check_restart_on
from trainctl.supervisor.life.hooks import EVENTS as HOOK_EVENTS
from trainctl.supervisor.linux.cgroup import find_mount
from trainctl.supervisor.linux.memory import find_home as memory_home
from trainctl.supervisor.linux.poll import poll_until
from trainctl.supervisor.model import relaunch, state
from trainctl.supervisor.model.reports import StopReport
from trainctl.supervisor.model.schema import build_document
from trainctl.supervisor.model.spec import (
    SLURM_KEYS,
    GpuBinding,
    Hooks,
    Isolation,
    LogPolicy,
    MemoryCap,
    RestartPolicy,
    SnapshotPolicy,
    Spec,
    StopPolicy,
    Watch,
)
from trainctl.supervisor.model.state import TRAINCTL_VARS, TRANSPORT_VARS, JobState
from trainctl.supervisor.model.tail import tail_lines
from trainctl.supervisor.records import replace
from trainctl.supervisor.watch import guard
from trainctl.supervisor.watch.drift import entry_script

from .jobs import current_phase, existing_job, live_members
from .queue import queued_names
from .stop import stop_job

T = TypeVar("T")


def _check_command(argv: list[str], cwd: str, env: dict[str, str]) -> None:
    if not argv or not argv[0]:
        raise ConfigError("no command given: put the job's command after `--`")
    if not os.path.isdir(cwd):
        raise SpawnError(f"working directory {cwd} does not exist")
    exe = argv[0]
    if "/" in exe:
        path = os.path.join(cwd, exe)
        if not os.path.isfile(path):
            raise SpawnError(f"command not found: {exe} (in {cwd})")
        if not os.access(path, os.X_OK):
            raise SpawnError(f"permission denied executing {exe} (in {cwd})")
    elif shutil.which(exe, path=env.get("PATH", os.defpath)) is None:
        raise SpawnError(f"command not found: {exe}")


def build_spec(
    name: str,
    argv: list[str],
    cfg: Config,
    *,
    cwd: str | None = None,
    env: tuple[str, ...] = (),
    grace_s: str | float | None = None,
    stop_signal: str | None = None,
) -> Spec:
    """Validate start flags and resolve them into a Spec (nothing is touched on disk)."""
    draft = SpecDraft(
        name=name,
        argv=list(argv),
        env=parse_env(env),
        cwd=os.path.abspath(os.path.expanduser(cwd)) if cwd else None,
        grace=None if grace_s is None else parse_seconds(grace_s, "--grace"),
        stop_signal=parse_signal(stop_signal) if stop_signal else None,
    )
    return resolve_spec(draft, cfg)


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


def default_name(home: Path, d: SpecDraft) -> str:
    """A readable name for a start without --name: the entry script's stem (``train`` for
    ``torchrun ... train.py``), else the command's; ``-2``, ``-3`` ... when it is taken."""
    probe = Spec(name="x", argv=tuple(d.argv or ()), cwd=d.cwd or os.getcwd(), env={})
    script = entry_script(probe)
    base = Path(script or (d.argv or ["job"])[0]).name
    stem = base.rsplit(".", 1)[0] if "." in base[1:] else base
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip(".-_")[:48] or "job"
    if not stem[0].isalnum():
        stem = f"job-{stem}"
    taken = {*state.list_jobs(home), *queued_names(home)} if home.is_dir() else set()
    name, n = stem, 1
    while name in taken:
        n += 1
        name = f"{stem}-{n}"
    return name


def resolve_spec(d: SpecDraft, cfg: Config, spec_file: str | None = None) -> Spec:
    """Turn a merged draft (file < --set < flags) into a Spec, the config filling the rest."""
    if not d.name:
        raise ConfigError("no job name: give --name or set name in the job spec")
    state.check_name(d.name)
    argv = list(d.argv or [])
    inherited = (*TRAINCTL_VARS, *TRANSPORT_VARS)
    full_env = {k: v for k, v in os.environ.items() if k not in inherited}
    full_env.update(d.env or {})
    workdir = d.cwd or os.getcwd()
    given = d.given()
    spec = Spec(
        name=d.name,
        argv=tuple(argv),
        cwd=workdir,
        env=full_env,
        stop=_stop_policy(d, cfg),
        restart=_restart_policy(d),
        watch=_watch(d, cfg),
        logs=LogPolicy(
            max_bytes=_or(d.log_max_size, cfg.log_max_mib << 20),
            keep=_or(d.log_keep, cfg.log_keep),
        ),
        isolation=Isolation(cgroup=cfg.cgroup, systemd=cfg.systemd),
        gpu=GpuBinding(
            timeout_s=_or(d.gpu_timeout, cfg.gpu_timeout_s),
            tolerance_mib=cfg.gpu_tolerance_mib,
            min_gpus=_min_gpus(d),
        ),
        hooks=_hooks(d, cfg),
        memory=MemoryCap(max_bytes=d.memory_max, high_bytes=d.memory_high),
        snapshot=_snapshot_policy(d),
        causes=dict(cfg.causes),
        backend=_or(d.backend, "local"),
        slurm={k: given[k] for k in sorted(SLURM_KEYS) if k in given} or None,
        spec_file=spec_file,
        tty=bool(d.tty),
    )
    _check_command(argv, workdir, full_env)
    check_keeper(spec, cfg)
    return spec


def _min_gpus(d: SpecDraft) -> int | None:
    """``min_gpus``, checked against the GPUs asked (a count, or the GPUs named)."""
    n = d.min_gpus
    if n is None:
        return None
    if not d.gpus:
        raise ConfigError("min_gpus needs --gpus: it is the least of the GPUs the job is given")
    if n < 1:
        raise ConfigError("min_gpus must be at least 1")
    if not backends.backend(d.backend).can.gpu_healing:
        raise ConfigError("min_gpus is for the local backend (Slurm replaces a node's GPUs)")
    req = d.gpus.strip()
    asked = int(req) if req.isdigit() and int(req) >= 1 else None
    if asked is None and req != "all":
        asked = len([t for t in req.split(",") if t.strip()])
    if asked is not None and n > asked:
        raise ConfigError(f"min_gpus {n} is more than the {asked} GPU(s) asked (--gpus {req})")
    return n


def _snapshot_policy(d: SpecDraft) -> SnapshotPolicy:
    base = SnapshotPolicy()
    if d.snapshot_keep is not None and d.snapshot_keep < 1:
        raise ConfigError("snapshot_keep must be at least 1 (the running run's own snapshot)")
    return SnapshotPolicy(
        mode=_or(d.snapshot, base.mode),
        keep=_or(d.snapshot_keep, base.keep),
        max_bytes=_or(d.snapshot_max, base.max_bytes),
        exclude=base.exclude if d.snapshot_exclude is None else tuple(d.snapshot_exclude),
    )


def _stop_policy(d: SpecDraft, cfg: Config) -> StopPolicy:
    return StopPolicy(
        signal=d.stop_signal or parse_signal(cfg.stop_signal),
        grace_s=_or(d.grace, cfg.grace_s),
        kill_wait_s=_or(d.kill_wait, cfg.kill_wait_s),
        order=_or(d.stop_order, cfg.stop_order),
    )


def _restart_policy(d: SpecDraft) -> RestartPolicy:
    backoff = _or(d.restart_backoff, 5.0)
    return RestartPolicy(
        mode=_restart_mode(d),
        max_restarts=_or(d.max_restarts, 3),
        backoff_s=backoff,
        backoff_max_s=max(backoff, _or(d.restart_backoff_max, 300.0)),
        exit_codes=None if d.restart_exit_codes is None else tuple(d.restart_exit_codes),
        on=tuple(d.restart_on or ("failure",)),
        window_s=d.restart_window,
        no_progress=_or(d.restart_no_progress, 3),
    )


def _watch(d: SpecDraft, cfg: Config) -> Watch:
    return Watch(
        checkpoint=d.checkpoint,
        checkpoint_signal=_or(d.checkpoint_signal, "SIGUSR2"),
        progress_regex=d.progress_regex,
        total_steps=d.total_steps,
        stall_timeout_s=None if isinstance(d.stall_timeout, str) else d.stall_timeout,
        stall_auto=d.stall_timeout == "auto",
        on_stall=d.stall_action or (d.on_stall if isinstance(d.on_stall, str) else "mark"),
        stall_grace_s=d.stall_grace,
        snapshot_interval_s=cfg.snapshot_interval_s,
        sample_interval_s=cfg.sample_interval_s,
        checkpoint_keep_max=_or(d.checkpoint_keep_max, Watch().checkpoint_keep_max),
        resume_tolerance=(
            None
            if d.resume_tolerance == "off"
            else d.resume_tolerance
            if isinstance(d.resume_tolerance, float)
            else Watch().resume_tolerance
        ),
    )


def _restart_mode(d: SpecDraft) -> str:
    """``restart_on`` alone means restarting on those causes; with ``never`` it conflicts."""
    if d.restart_on is not None and d.restart == "never":
        raise ConfigError('restart_on is set but restart = "never": drop one of them')
    if d.restart is None and (d.restart_on is not None or d.restart_window is not None):
        return "on-failure"
    return _or(d.restart, "never")


def _hooks(d: SpecDraft, cfg: Config) -> Hooks:
    """The hook keys: the job's own, else the config's [hooks] (checked the same way)."""
    base = {k: KEYS[k](raw, where) for k, (raw, where) in cfg.hooks.items()}
    given = {k: v for k, v in d.given().items() if k in HOOK_KEYS}
    if isinstance(d.on_stall, str):
        given.pop("on_stall")  # the older form: the watchdog's action, not a hook
    keys = {**base, **given}

    def cmd(key: str) -> tuple[str, ...] | None:
        value = keys.get(key)
        return tuple(value) if isinstance(value, list) else None

    return Hooks(
        **{f"on_{e}": cmd(f"on_{e}") for e in HOOK_EVENTS},
        checkpoint_stale_s=keys.get("checkpoint_stale"),
        notify=keys.get("notify"),
        timeout_s=float(keys.get("hook_timeout", 30.0)),
    )


def check_keeper(spec: Spec, cfg: Config) -> None:
    """Refuse, in one line each, what the run keeper could not do as asked."""
    problems = check_restart_on(spec.restart.on, spec.causes)
    if problems:
        raise ConfigError(f"restart_on: {problems[0]}")
    h = spec.hooks
    for event in HOOK_EVENTS:
        argv = h.command(event)
        if argv is not None:
            _check_hook(f"on_{event}", list(argv), spec.cwd, spec.env)
    if h.on_checkpoint_stale is not None and h.checkpoint_stale_s is None:
        raise ConfigError("on_checkpoint_stale needs checkpoint_stale (how old is too old)")
    if h.checkpoint_stale_s is not None and not spec.watch.checkpoint:
        raise ConfigError("checkpoint_stale needs checkpoint (the glob of the job's checkpoints)")
    _check_memory(spec, cfg)


def _check_hook(key: str, argv: list[str], cwd: str, env: dict[str, str]) -> None:
    try:
        _check_command(argv, cwd, env)
    except SpawnError as e:
        raise ConfigError(f"{key}: {e}") from None


def _check_memory(spec: Spec, cfg: Config) -> None:
    m = spec.memory
    if not m.wanted:
        return
    if not backends.backend(spec.backend).can.memory_caps:
        raise ConfigError(
            "memory_max/memory_high are for local jobs; on Slurm ask for memory with "
            'sbatch_args = ["--mem=64G"]'
        )
    if m.max_bytes is not None and m.high_bytes is not None and m.high_bytes > m.max_bytes:
        raise ConfigError("memory_high is above memory_max: the cap would never throttle")
    if not cfg.cgroup or not spec.isolation.cgroup or find_mount() is None:
        raise ConfigError(
            "memory_max/memory_high need cgroup mode, and this job would run in signals mode "
            "(cgroup = false in the config, or no cgroup v2 here)"
        )
    home = memory_home()
    if isinstance(home, str):
        raise ConfigError(f"memory_max/memory_high cannot be set: {home}")


def start_job(
    home: Path,
    spec: Spec,
    cfg: Config,
    gpus: GpuRequest | None = None,
    *,
    from_scratch: bool = False,
) -> StartResult:
    """Start a run of ``spec`` under a new detached supervisor; return once main has exec'd.

    The run is handed the newest complete checkpoint and guarded (watch/guard.py) unless
    ``from_scratch``."""
    state.ensure_home(home)
    jdir = state.check_not_symlink(state.job_dir(home, spec.name))
    created = not jdir.exists()
    jdir.mkdir(mode=0o700, exist_ok=True)
    try:
        with state.job_lock(jdir, 10.0):
            return start_locked(home, jdir, spec, cfg, gpus, from_scratch=from_scratch)
    except BaseException:
        if created and not state.JobDir(jdir).has_run:
            shutil.rmtree(jdir, ignore_errors=True)
        raise


def start_locked(
    home: Path,
    jdir: Path,
    spec: Spec,
    cfg: Config,
    gpus: GpuRequest | None = None,
    *,
    keep_cwd: bool = False,
    from_scratch: bool = False,
    rolled_back: str | None = None,
) -> StartResult:
    """Start a run; the caller holds the job lock. ``rolled_back``: the run goes back to
    the code a deploy replaced (a deploy's rollback), why."""
    t0 = time.monotonic()
    prev = state.read_state(jdir) if state.JobDir(jdir).has_run else None
    if prev is not None:
        refuse_if_live(jdir, prev)
        state.require_known(spec.name, prev)
    if from_scratch and not backends.backend(spec.backend).can.deploy:
        raise ConfigError(
            f"--from-scratch is for local jobs; {spec.name} runs under {spec.backend}"
        )
    req = backends.StartRequest(
        home, jdir, spec, cfg, gpus, prev, t0,
        keep_cwd=keep_cwd, from_scratch=from_scratch, rolled_back=rolled_back,
    )  # fmt: skip
    return backends.backend(spec.backend).start(req)


def refuse_if_live(jdir: Path, prev: JobState) -> None:
    """A job of that name still runs (or left processes): refuse, naming them."""
    backends.of(prev).refuse_if_live(jdir, prev)
    left = live_members(prev)
    if state.supervisor_alive(jdir, prev) or (left and not prev.phase.ended):
        main = f", main pid {prev.main.pid}" if prev.main else ""
        raise JobConflictError(
            f"job {prev.name} is running (run {prev.run}{main}); "
            "stop it first or choose another name"
        )
    if left:
        raise JobConflictError(
            f"{len(left)} process(es) of job {prev.name} run {prev.run} are still alive "
            f"(pids {', '.join(map(str, sorted(left)[:8]))}); run `trainctl stop {prev.name}`"
        )


_GPU_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def reloaded_spec(spec: Spec, cfg: Config) -> Spec:
    """The spec rebuilt from its file as it is now, plus the --set and flags of the start.

    Checked in full before anything is stopped: a broken file refuses the restart.
    """
    if not spec.spec_file:
        raise ConfigError(f"job {spec.name} was not started from a spec file: nothing to reload")
    file_draft = load_spec_file(spec.spec_file)
    cli = build_document(SpecDraft, spec.cli_keys or {}, f"job {spec.name}: cli_keys")
    merged = file_draft.merged(cli)
    if merged.name != spec.name:
        raise ConfigError(
            f"{spec.spec_file}: name is now {merged.name!r}; `restart --reload` keeps the "
            f"job's name ({spec.name!r}): start the new name instead"
        )
    new = resolve_spec(merged, cfg, spec.spec_file)
    # the environment of the first start, with what the file and flags say now on top
    env = {**spec.env, **(merged.env or {})}
    return replace(
        new,
        env=env,
        file_keys=file_draft.given(),
        cli_keys=cli.given(),
        file_mtime=os.stat(spec.spec_file).st_mtime,
        gpu=spec.gpu,
    )


def restart_gpus(home: Path, spec: Spec, held: frozenset[int] = frozenset()) -> GpuRequest | None:
    """The GPUs a restart asks for: the same as before (they were just verified free).
    With ``min_gpus``, the run's GPUs before any fault took one away, less those still
    unhealthy and those the stop found ``held`` (never started onto): the run grows back
    onto a GPU healthy again."""
    if not spec.gpu.indices:
        return None
    # "1,3," names GPUs 1 and 3 (not a count); MIG instances by their MIG-… uuid
    if spec.gpu.min_gpus is None:
        return GpuRequest(spec.gpu.indices + ",")
    asked = tuple((spec.gpu.asked or spec.gpu.indices).split(","))
    sick = {str(i) for i in health.unhealthy(home)}
    facts = relaunch.Facts(
        asked=asked,
        unhealthy=frozenset(t for t in asked if t in sick),
        held=frozenset(t for t in asked if t.isdigit() and int(t) in held),
        min_gpus=spec.gpu.min_gpus,
    )
    p = relaunch.plan(facts)  # the supervisor's relaunch asks the same planner
    use = p.gpus if p.refused is None else asked  # too few: the start refuses, saying why
    return GpuRequest(",".join(use) + ",", asked=",".join(asked))


def restart_job(
    home: Path,
    name: str,
    cfg: Config,
    *,
    grace_s: float | None = None,
    reload: bool = False,
    verb: str = "restart",
    respec: Callable[[Spec], Spec] | None = None,
    keep_cwd: bool = False,
    after_stop: Callable[[], None] | None = None,
    from_scratch: bool = False,
    rolled_back: str | None = None,
) -> tuple[StopResult, StartResult]:
    """Stop the job (verified), then start its recorded spec again (new code on disk).

    ``reload``: take the spec file as it is now (see :func:`reloaded_spec`). ``respec``:
    the spec the new run takes, made from that one (a deploy's resume point, a rollback's
    old code). ``keep_cwd``: run where the spec says, taking no new snapshot (a rollback
    into the previous run's snapshot).
    """
    jdir = existing_job(home, name)
    spec = state.read_spec(jdir)
    if state.JobDir(jdir).has_run:  # a newer trainctl's job: refused before the stop
        state.require_known(name, state.read_state(jdir), spec)
    if reload:
        spec = reloaded_spec(spec, cfg)
    if respec is not None:
        spec = respec(spec)
    with state.job_lock(jdir, 30.0):
        stopped = stop_job(home, name, grace_s=grace_s, lock_held=True, verb=verb)
        st = state.read_state(jdir)
        held = _refuse_survivors(name, st, stopped, spec)
        if after_stop is not None:  # a rollback puts the checkpoint back: nothing writes now
            after_stop()
        gpus = restart_gpus(home, spec, held)
        # a plain restart resumes from the newest complete checkpoint as the stop just left
        # it: the new run's supervisor hands it and guards it (watch/guard.py); the spec
        # never carries a stale one from an earlier restart or deploy
        drop = (*_GPU_VARS, *(() if respec is not None else (state.RESUME_VAR,)))
        env = {k: v for k, v in spec.env.items() if k not in drop}
        new = replace(spec, env=env)
        started = start_locked(
            home, jdir, new, cfg, gpus,
            keep_cwd=keep_cwd, from_scratch=from_scratch, rolled_back=rolled_back,
        )  # fmt: skip
    return stopped, started


def _refuse_survivors(name: str, st: JobState, stopped: StopResult, spec: Spec) -> frozenset[int]:
    """Never relaunch beside what outlived the stop: a process, or GPU memory held (each
    held GPU named with its holders). The GPUs to leave out: those still held after the
    stop's release wait (it waited up to the GPU timeout) when ``min_gpus`` of the others
    are free; never started onto."""
    left = live_members(st)
    report = stopped.report if isinstance(stopped.report, StopReport) else None  # not Slurm's
    out = lc.gpus_left_out(report, spec, None) if report and not left and not stopped.ok else None
    if report and out:
        stopped.warnings.append(
            f"leaving GPU(s) {', '.join(map(str, sorted(out)))} out of the new run "
            f"(min_gpus {spec.gpu.min_gpus}): {report.held_line()}"
        )
        return frozenset(out)
    if left or not stopped.ok:
        line = report.held_line() if report is not None else None
        # another GPU was released: min_gpus would have let the restart go on without these
        hint = report is not None and spec.gpu.min_gpus is None and any(g.ok for g in report.gpus)
        why = (
            f"{len(left)} process(es) of run {st.run} survived the stop (pids "
            f"{', '.join(map(str, sorted(left)[:8]))})"
            if left or not line
            else line + (" (min_gpus lets a restart leave a held GPU out)" if hint else "")
        )
        raise JobConflictError(f"not restarting {name}: {why}")
    return frozenset()


def plan_restart(home: Path, name: str, *, from_scratch: bool = False) -> RestartPlan:
    """What a restart of ``name`` would hand the new run, keep aside and guard (the same
    rule the new run's supervisor applies: watch/guard.py); nothing is touched."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    spec = state.read_spec(jdir)
    plan = RestartPlan(name, st.run, str(current_phase(jdir, st)), spec.watch.checkpoint,
                       from_scratch=from_scratch)  # fmt: skip
    if from_scratch or not spec.watch.checkpoint:
        return plan
    g = guard.plan(jdir, spec, st.run + 1, None, st.started_at)
    if g is None:
        return plan
    flag = guard.scratch_flag(spec.argv)
    warning = None
    if flag is not None and g.floor is not None:
        warning = (f"its command line says {flag}: if the new run starts over, the guard "
                   f"stops it at its first step (use --from-scratch to start over)")  # fmt: skip
    return replace(
        plan, checkpoint=g.path, checkpoint_step=g.step, step_estimated=g.estimated,
        keep=guard.would_keep(g, spec), floor=g.floor, warning=warning,
    )  # fmt: skip


HEALTH_POLL_S = 0.05


def watch_health(home: Path, name: str, run: int, window_s: float) -> Health:
    """Watch run ``run`` for ``window_s``: did it end (or get relaunched) within it?

    Broken code is the most common restart failure (a SyntaxError, an import error): it
    dies in the first second, long before anyone looks at `status`.
    """
    jdir = existing_job(home, name)
    if not _ends_within(jdir, run, window_s, HEALTH_POLL_S):
        return Health(window_s)
    st = state.read_state(jdir)  # once, for how it ended
    lines = hooks.last_lines(state.log_path(jdir, run), 10)
    relaunched = any(e.run == run for e in st.restart_history)
    if st.run > run and not relaunched:  # not the restart policy: a later restart
        return Health(window_s, died=True, superseded_by=st.run, last_lines=lines)
    return Health(window_s, died=True, cause=st.cause, last_lines=lines)


def _ends_within(jdir: Path, run: int, within_s: float, every_s: float) -> bool:
    """Whether run ``run`` ends (or is relaunched) within ``within_s``, as its backend's
    watch says (the supervisor's events; the scheduler): state.json is not polled."""
    watch = backends.of(state.read_state(jdir)).watch_run(jdir, run)
    if within_s <= 0:
        return watch.over()
    return poll_until(lambda: True if watch.over() else None, within_s, every_s) is not None


# How long `start` watches a new run before it returns (--no-wait: not at all). A command
# that cannot run (`python3 nosuch.py`, a bad flag, an ImportError in the entry script)
# ends within a few hundred ms of its exec on these machines (Python's start is ~30 ms,
# an import error of a torch script ~1 s is the exception); 1.5 s catches those while a
# person at the prompt barely notices, and a script that starts many jobs says --no-wait.
START_WATCH_S = 1.5
WATCH_VAR = "TRAINCTL_START_WATCH"  # another watch (a duration; 0: none, as --no-wait)


def start_watch_s() -> float:
    """How long `start` watches a new run: $TRAINCTL_START_WATCH, else START_WATCH_S."""
    raw = os.environ.get(WATCH_VAR)
    return START_WATCH_S if raw is None else parse_duration(raw, WATCH_VAR)


def ended_at_once(home: Path, name: str, run: int, within_s: float) -> EndedAtOnce | None:
    """Watch run ``run`` for up to ``within_s``; how it ended, if it did (None: it runs).

    A run the restart policy is about to start again counts as ended ("restarting"):
    the user still learns at once that their command fails."""
    jdir = state.job_dir(home, name)
    if not _ends_within(jdir, run, within_s, 0.05):
        return None
    st = state.read_state(jdir)  # once, for how it ended
    restarting = st.run != run or st.restart_at is not None
    phase = "restarting" if restarting else str(current_phase(jdir, st))
    cause = st.cause.summary if st.cause is not None else f"exit code {st.exit_code}"
    failure = st.last_failure
    if restarting and failure is not None and failure.cause is not None:
        cause = failure.cause.summary
    lines = [x.rstrip("\n")[-300:] for x in tail_lines(state.log_path(jdir, run), 4096)][-5:]
    failed = phase == "failed" or (phase == "exited" and bool(st.exit_code))
    return EndedAtOnce(name, run, phase, cause, st.exit_code, failed, lines)
