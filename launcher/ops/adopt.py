"""`adopt`: find the processes of a run trainctl did not start, and refuse what is not one.

A run already going in a tmux pane or under nohup is taken over as it is: its members are
found here (the session of the process or pane, and every descendant), shown, checked
against what must never be adopted, and handed to a new supervisor, which watches them by
pidfd, moves them into a job cgroup where the host allows it, and stops them with the
same stop sequence as any job. Nothing is signalled here.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from trainctl.launcher.config import Config
from trainctl.launcher.gpus import gpu_views
from trainctl.launcher.results.ops import AdoptResult, Found, Plan
from trainctl.launcher.specfile import SpecDraft, parse_sets
from trainctl.supervisor import ids
from trainctl.supervisor.errors import ConfigError, GpuError
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model import state
from trainctl.supervisor.model.state import TRAINCTL_VARS, GpuLease, JobState, Phase
from trainctl.supervisor.records import replace
from trainctl.supervisor.tree.launch import AdoptRequest, Handover, launch_supervisor
from trainctl.supervisor.tree.proctree import alive, descendants, scan, target_of

from .jobs import current_phase, existing_job
from .start import refuse_if_live, resolve_spec

MARKER_VAR = b"TRAINCTL_JOB="


def _handover(plan: Plan) -> AdoptRequest:
    """What the new supervisor gets (boot.adopt): identities, group, session, log."""
    return AdoptRequest(
        how=plan.how,
        main=(plan.main.pid, plan.main.start_ticks),
        members=tuple((m.pid, m.start_ticks) for m in plan.members),
        pgid=plan.pgid,
        sid=plan.sid,
        log_source=plan.log_source,
    )


def plan_pid(pid: int) -> Plan:
    """`--pid PID`: its session (unless it is the caller's own) and every descendant."""
    st = _stat_or_refuse(pid, f"--pid {pid}")
    return _plan(f"--pid {pid}", [st], [], [])


def plan_tmux(target: str, socket: str | None) -> Plan:
    """`--tmux TARGET`: the tree of each pane of a session, window or pane."""
    if not shutil.which("tmux"):
        raise ConfigError("--tmux: tmux is not installed here")
    tmux = ["tmux", *(["-S", socket] if socket else [])]
    if target.startswith("%"):
        listing = [*tmux, "display-message", "-p", "-t", target, "#{pane_id} #{pane_pid}"]
    elif ":" in target:
        listing = [*tmux, "list-panes", "-t", target, "-F", "#{pane_id} #{pane_pid}"]
    else:
        listing = [*tmux, "list-panes", "-s", "-t", target, "-F", "#{pane_id} #{pane_pid}"]
    out = _run(listing, f"--tmux {target}")
    panes, roots = [], []
    shells: dict[int, str] = {}
    for line in out.splitlines():
        pane, _, pid = line.partition(" ")
        if pid.isdigit():
            panes.append(pane)
            root = _stat_or_refuse(int(pid), f"--tmux {target}: pane {pane}")
            job = _foreground_job(root, f"--tmux {target}: pane {pane}")
            if job is not None:  # a shell at whose prompt the run was typed: the run only
                shells[root.pid] = "it is the pane's interactive shell (its job is adopted)"
            roots += job or [root]
    if not roots:
        raise ConfigError(f"--tmux {target}: no pane found")
    server = _run([*tmux, "display-message", "-p", "#{pid}"], f"--tmux {target}").strip()
    refuse = {int(server): "it is the tmux server"} if server.isdigit() else {}
    return _plan(f"--tmux {target}", roots, panes, tmux, refuse, shells=shells)


def _foreground_job(root: procfs.Stat, where: str) -> list[procfs.Stat] | None:
    """A pane whose process is a shell running a job in the foreground (`python train.py
    | tee log` typed at a bash prompt): that job's processes (its process group), never
    the shell, which ignores SIGTERM and lives on at its prompt. None: the pane runs the
    command itself (`tmux new 'python train.py'`)."""
    fg = procfs.foreground_pgid(root.pid)
    if fg is None or fg == root.pgid:
        return None
    job = [
        s for pid in procfs.list_pids() if (s := procfs.read_stat(pid)) is not None and s.pgid == fg
    ]
    if not job:
        raise ConfigError(f"{where}: its shell runs no job now (nothing to adopt)")
    return job


def plan_gpu(home: Path, indices: str) -> Plan:
    """`--gpu INDEX[,INDEX...]`: every process holding those GPUs, with its session and
    tree (a holder of a job is refused, as any member of another job)."""
    wanted = _gpu_indices(indices)
    views = {v.index: v for v in gpu_views(home)}
    missing = [i for i in wanted if i not in views]
    if missing:
        have = ", ".join(map(str, sorted(views))) or "none"
        raise ConfigError(f"--gpu {indices}: no GPU {missing[0]} here (GPUs: {have})")
    roots: list[procfs.Stat] = []
    for i in wanted:
        for holder in views[i].processes:
            st = procfs.read_stat(holder.pid)
            if st is not None and st.state != "Z" and st.pid not in {r.pid for r in roots}:
                roots.append(st)
    if not roots:
        raise ConfigError(f"--gpu {indices}: no process holds it; nothing to adopt")
    return _plan(f"--gpu {indices}", roots, [], [])


def _gpu_indices(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise ConfigError(f"--gpu {text!r}: expected GPU indices such as 0 or 0,3")
    return sorted({int(p) for p in parts})


def gpu_leases(home: Path, pids: set[int]) -> tuple[GpuLease, ...]:
    """The GPUs the adopted processes hold, as leases: the baseline is what the GPU uses
    without them, so that the stop's release check waits for their memory to go."""
    try:
        views = gpu_views(home)
    except GpuError:
        return ()  # no driver, or NVML failing: nothing to lease, nothing to verify
    out = []
    for v in views:
        theirs = [h for h in v.processes if h.pid in pids]
        if theirs:
            held = sum(h.used_bytes or 0 for h in theirs)
            out.append(GpuLease(v.index, v.uuid, v.name, max(0, v.memory_used_bytes - held)))
    return tuple(out)


def _run(argv: list[str], what: str) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"{what}: {argv[0]} failed: {e}") from None
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        raise ConfigError(f"{what}: {why}")
    return p.stdout


def _stat_or_refuse(pid: int, what: str) -> procfs.Stat:
    st = procfs.read_stat(pid) if pid > 0 else None
    if st is None or st.state == "Z":
        raise ConfigError(f"{what}: no such process")
    return st


def _plan(
    how: str,
    roots: list[procfs.Stat],
    panes: list[str],
    tmux: list[str],
    refuse: dict[int, str] | None = None,
    *,
    shells: dict[int, str] | None = None,
) -> Plan:
    shells = shells or {}
    stats = {s.pid: s for pid in procfs.list_pids() if (s := procfs.read_stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for s in stats.values():
        children.setdefault(s.ppid, []).append(s.pid)
    mine = _callers_line()
    found: dict[int, str] = {r.pid: "root" for r in roots}
    sessions = _own_sessions(roots, stats, mine, shells)
    for s in stats.values():
        if s.sid in sessions and s.pid not in found and s.state != "Z":
            found[s.pid] = "session"
    for pid in list(found):
        for d in descendants(children, pid):
            found.setdefault(d, "descendant")
    members = [_found(stats[p], how_) for p, how_ in found.items() if p in stats]
    members = [m for m in members if stats[m.pid].state != "Z"]
    _refuse(members, stats, mine, refuse or {})
    main = min(
        (
            m
            for m in members
            if m.pid in {r.pid for r in roots} or (m.sid in sessions and m.pid == m.sid)
        ),
        key=lambda m: m.start_ticks,
    )
    pids = {m.pid for m in members}
    # A group or session is named only when all of it is adopted (its leader included):
    # the stop's pgroup and session nets must never reach the caller's shell.
    whole_group = all(s.pid in pids for s in stats.values() if s.pgid == main.pgid)
    whole_session = all(s.pid in pids for s in stats.values() if s.sid == main.sid)
    return Plan(
        how=how,
        main=main,
        members=sorted(members, key=lambda m: m.start_ticks),
        pgid=main.pgid if whole_group and main.pgid in pids else None,
        sid=main.sid if whole_session and main.sid in pids else None,
        log_source=_stdout_file(main.pid),
        panes=panes,
        tmux=tmux,
    )


def _own_sessions(
    roots: list[procfs.Stat], stats: dict[int, procfs.Stat], mine: set[int], shells: dict[int, str]
) -> set[int]:
    """The roots' sessions that are the run's own and taken whole: not the caller's, not
    led by one of the caller's ancestors (a nohup from this very shell shares its
    session), nor a pane's interactive shell's (the job typed at its prompt is taken
    alone)."""
    me = stats.get(os.getpid())
    return {
        r.sid
        for r in roots
        if (me is None or r.sid != me.sid)
        and r.sid not in mine
        and r.sid not in shells
        and r.sid in stats
    }


def _found(s: procfs.Stat, how: str) -> Found:
    found = Found.of(s, (how,))
    return found if found.cmd else replace(found, cmd=f"[{s.comm}]")


def _callers_line() -> set[int]:
    """This process and every ancestor of it (the caller's shell, sshd, tmux, ...)."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        st = procfs.read_stat(pid)
        if st is None:
            break
        pid = st.ppid
    return out


def _refuse(
    members: list[Found],
    stats: dict[int, procfs.Stat],
    mine: set[int],
    refuse: dict[int, str],
) -> None:
    """One line, exit 2, nothing changed: for any member that must never be adopted."""
    uid = os.getuid()
    for m in members:
        if not procfs.is_alive(m.pid, m.start_ticks):
            continue  # exited since it was found: the supervisor leaves it out too
        why = refuse.get(m.pid) or _why_not(m, stats[m.pid], uid, mine)
        if why:
            raise ConfigError(f"will not adopt pid {m.pid} ({m.cmd[:60]}): {why}; nothing changed")


def _why_not(m: Found, st: procfs.Stat, uid: int, mine: set[int]) -> str | None:
    owner = procfs.read_uid(m.pid)
    checks = (
        (m.pid == 1, "it is PID 1 (init)"),
        # every kernel thread is a child of kthreadd (pid 2); an empty command line is not
        # a sign of one: it is also what a process that just exited shows
        (m.pid == 2 or st.ppid == 2, "it is a kernel thread"),
        (owner is not None and owner != uid, f"it belongs to another user (uid {owner})"),
        (m.pid in mine, "it is this command's own shell or one of its ancestors"),
        (st.comm == "sshd" or st.comm.startswith("sshd-"), "it is sshd"),
        (st.comm.startswith("tmux"), "it is a tmux server or client (adopt panes: --tmux)"),
    )
    for hit, why in checks:
        if hit:
            return why
    if procfs.has_env_prefix(m.pid, (MARKER_VAR,)):
        return "it is already a member of a trainctl job (see trainctl list)"
    return None


def _stdout_file(pid: int) -> str | None:
    """The regular file main writes its output to (nohup.out, a redirect), if any."""
    try:
        path = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None
    try:
        return path if path.startswith("/") and Path(path).is_file() else None
    except OSError:
        return None


def proc_command(pid: int) -> tuple[list[str], str, dict[str, str]]:
    """argv, cwd and environment of ``pid`` (for the spec a later `restart` runs)."""
    argv = procfs.read_argv(pid)
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError as e:
        raise ConfigError(f"pid {pid}: cannot read its cwd: {e.strerror}") from None
    env: dict[str, str] = {}
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError as e:
        raise ConfigError(f"pid {pid}: cannot read its environment: {e.strerror}") from None
    for item in raw.split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep and key and key not in TRAINCTL_VARS:
            env[key] = value
    return argv, cwd, env


# what an adopted run's spec takes from its main process, or cannot change
_NOT_SET = ("name", "argv", "cwd", "env", "backend", "gpus", "tty", "share", "force")


def adopt_sets(sets: tuple[str, ...]) -> SpecDraft:
    """`adopt --set KEY=VALUE ...`, checked (each key and value, as `start --set`)."""
    draft = parse_sets(sets)
    given = [k for k in draft.given() if k in _NOT_SET]
    if given:
        raise ConfigError(
            f"adopt --set {given[0]}: an adopted run's argv, cwd and env are read from its "
            "process, and its name, backend, gpus and tty are fixed; set the others "
            "(checkpoint, progress_regex, grace, restart ...)"
        )
    return draft


def adopt_job(
    home: Path, name: str, plan: Plan, cfg: Config, sets: SpecDraft | None = None
) -> AdoptResult:
    """Hand the planned members to a new supervisor as run N of job ``name``.

    The spec is read from main's /proc (argv, cwd, environment: CUDA_VISIBLE_DEVICES
    included), so that `restart` relaunches the run under trainctl proper. A live job of
    that name is refused; a finished one gets its next run.
    """
    argv, cwd, env = proc_command(plan.main.pid)
    if not argv:
        raise ConfigError(f"pid {plan.main.pid}: no command line (it exited?); nothing changed")
    draft = (sets or SpecDraft()).merged(SpecDraft(name=name, argv=argv, cwd=cwd, env=env))
    spec = replace(resolve_spec(draft, cfg), env=env)
    state.ensure_home(home)
    jdir = state.check_not_symlink(state.job_dir(home, name))
    created = not jdir.exists()
    jdir.mkdir(mode=0o700, exist_ok=True)
    try:
        with state.job_lock(jdir, 10.0):
            prev = state.read_state(jdir) if state.JobDir(jdir).has_run else None
            if prev is not None:
                refuse_if_live(jdir, prev)
            run = prev.run + 1 if prev else 1
            log = state.log_path(jdir, run)
            ho = Handover(
                run,
                ids.new_marker(),
                gpus=gpu_leases(home, {m.pid for m in plan.members}),
                restarts=0,
                adopt=_handover(plan),
            )
            reply = launch_supervisor(home, jdir, spec, ho, cfg.ready_timeout_s)
            piped = _pipe_panes(plan, log)
    except BaseException:
        if created and not state.JobDir(jdir).has_run:
            shutil.rmtree(jdir, ignore_errors=True)
        raise
    st = state.read_state(jdir)
    source = plan.log_source if plan.log_source else ("tmux pipe-pane" if piped else None)
    return AdoptResult.of(st, plan, reply.mode, source)


def _pipe_panes(plan: Plan, log: Path) -> bool:
    """tmux copies each adopted pane's output into the run's log from now on (`pipe-pane
    -o`: a pane already piped elsewhere keeps its pipe). True when any pane is piped."""
    if not plan.panes:
        return False
    log.parent.mkdir(mode=0o700, exist_ok=True)
    with os.fdopen(state.open_append(log), "a") as f:  # 0600 whatever the umask
        f.write(f"==> trainctl: adopted {plan.how}; earlier output is in the pane <==\n")
    done = False
    for pane in plan.panes:
        cmd = [*plan.tmux, "pipe-pane", "-o", "-t", pane, f"cat >> {shlex.quote(str(log))}"]
        done |= subprocess.run(cmd, capture_output=True, timeout=10, check=False).returncode == 0
    return done


def plan_lost(home: Path, name: str) -> tuple[Plan, JobState]:
    """`adopt NAME` alone: a lost job (its supervisor gone) gets its live members back
    under a new supervisor. They still carry the job's marker, which finds them all."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    phase = current_phase(jdir, st)
    if phase != Phase.LOST:
        raise ConfigError(
            f"job {name} is {phase}: adopt NAME alone takes back a lost job (its supervisor "
            "gone); give --pid PID or --tmux TARGET to adopt something else"
        )
    live = alive(scan(target_of(st)))
    if not live:
        raise ConfigError(f"job {name}: nothing of run {st.run} is alive; nothing to adopt")
    stats = {pid: m.stat for pid, m in live.items()}
    found = [_found(s, "+".join(sorted(live[s.pid].nets))) for s in stats.values()]
    mine = _callers_line()
    own = f"TRAINCTL_JOB={st.marker}".encode()
    _refuse([m for m in found if not procfs.has_marker(m.pid, own)], stats, mine, {})
    for m in found:  # its own members carry its marker: only the rest of the checks apply
        why = _why_not(m, stats[m.pid], os.getuid(), mine)
        if why and not why.startswith("it is already a member"):
            raise ConfigError(f"will not adopt pid {m.pid} ({m.cmd[:60]}): {why}; nothing changed")
    main_ok = st.main is not None and st.main.pid in live and live[st.main.pid].ref == st.main
    main = (
        next(m for m in found if m.pid == st.main.pid)
        if main_ok and st.main
        else min(found, key=lambda m: m.start_ticks)
    )
    plan = Plan(
        how=f"lost run {st.run}",
        main=main,
        members=sorted(found, key=lambda m: m.start_ticks),
        pgid=st.pgid if main_ok else None,
        sid=st.sid if main_ok else None,
        log_source=None,  # they still write to the run's own log
    )
    return plan, st


def readopt_job(home: Path, name: str, plan: Plan, st: JobState, cfg: Config) -> AdoptResult:
    """Give a lost run a new supervisor: same run, marker, spec, GPUs and cgroup."""
    jdir = state.job_dir(home, name)
    spec = state.read_spec(jdir)
    with state.job_lock(jdir, 10.0):
        if state.supervisor_alive(jdir, state.read_state(jdir)):
            raise ConfigError(f"job {name} has a live supervisor again; nothing changed")
        ho = Handover(
            st.run,
            st.marker,
            gpus=st.gpus,
            restarts=st.restarts,
            last_failure=st.last_failure,
            restart_history=st.restart_history,
            adopt=replace(_handover(plan), cgroup=st.cgroup),
        )
        reply = launch_supervisor(home, jdir, spec, ho, cfg.ready_timeout_s)
    now = state.read_state(jdir)
    return AdoptResult.of(now, plan, reply.mode, str(state.log_path(jdir, st.run)))
