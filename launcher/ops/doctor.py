"""`trainctl doctor`: what on this host decides whether jobs survive logout and stop cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from trainctl.launcher.results.ops import Check
from trainctl.supervisor import ids
from trainctl.supervisor.errors import GpuError, TrainctlError
from trainctl.supervisor.gpu import PERSISTENCE_OFF, NoDriverError, open_backend
from trainctl.supervisor.linux import cgroup, systemd
from trainctl.supervisor.model import control, state
from trainctl.supervisor.tree import mounts, stacks


def run_doctor(home: Path) -> list[Check]:
    """Look at init, logind, linger, cgroups and the live jobs' units; change nothing."""
    checks = [_init()]
    if systemd.booted():
        checks += [_logind(), _linger(), *_units(home)]
    checks += [_cgroup_mode(), _cgroup_writable(), _pidfd(), _stacks(), *_adopted(home)]
    checks += _older_supervisors(home)
    checks += _gpus()
    return checks


def _stacks() -> Check:
    """py-spy, which `stack` and the supervisor's stall and before-SIGKILL stacks need."""
    found = stacks.pyspy_path()
    if found is None:
        return Check("stacks", "py-spy not found: no stacks of a hung run", False, stacks.MISSING)
    return Check("stacks", f"py-spy at {found}: `trainctl stack`, stall and kill stacks", True)


def _gpus() -> list[Check]:
    """The driver, its versions, and each GPU's persistence and MIG modes."""
    try:
        backend = open_backend()
    except NoDriverError as e:
        return [Check("gpus", str(e), True, "only jobs started with --gpus need one")]
    except GpuError as e:
        return [Check("gpus", str(e), False, "jobs without --gpus are unaffected")]
    try:
        gpus, info = backend.gpus(), backend.driver()
    except GpuError as e:
        return [Check("gpus", str(e), False, "jobs without --gpus are unaffected")]
    finally:
        backend.close()
    whole = [g for g in gpus if g.mig is None]
    out = [
        Check(
            "gpus",
            f"driver {info.driver_version or '?'}, NVML {info.nvml_version or '?'}, "
            f"{len(whole)} GPU(s)",
            info.note is None,
            info.note or "",
        )
    ]
    for g in whole:
        if g.error is not None:
            out.append(Check(f"GPU {g.label}", g.error, False, "the other GPUs keep working"))
            continue
        instances = sum(1 for m in gpus if m.index == g.index and m.mig is not None)
        mig = f", MIG on ({instances} instance(s), bound per instance)" if g.mig_mode else ""
        persistence = {True: "persistence on", False: "persistence OFF", None: "persistence ?"}
        hint = PERSISTENCE_OFF if g.persistence is False else ""
        out.append(
            Check(f"GPU {g.label}", f"{g.name}, {persistence[g.persistence]}{mig}", not hint, hint)
        )
    return out


def _live_states(home: Path) -> Iterator[tuple[str, state.JobState]]:
    """(name, state) of every job whose recorded run is not over; unreadable ones skipped."""
    for name in state.list_jobs(home):
        try:
            st = state.read_state(state.job_dir(home, name))
        except TrainctlError:
            continue
        if not st.phase.ended:
            yield name, st


def _older_supervisors(home: Path) -> list[Check]:
    """Live jobs whose supervisor is older than this CLI (started before an upgrade):
    they keep running and answer status, stop and restart; a restart brings them up to
    date. Asked over each one's socket (a ping: its protocol)."""
    out = []
    for name, st in _live_states(home):
        if st.supervisor is None:  # no supervisor of trainctl's own (a Slurm job's)
            continue
        try:
            pong = control.ping(state.job_dir(home, name), PING_S)
        except (control.ControlUnavailableError, TrainctlError, OSError):
            continue  # no supervisor answers: `status` says lost
        if pong.protocol >= control.PROTOCOL:
            continue
        out.append(Check(
            f"job {name}",
            f"its supervisor (pid {pong.pid}) is older than this trainctl (control protocol "
            f"{pong.protocol}; this one speaks {control.PROTOCOL})",
            False,
            f"status, logs, stop and restart work as ever; `trainctl restart {name}` (or "
            f"`stop --at next-checkpoint` and a start) brings it up to date",
        ))  # fmt: skip
    return out


PING_S = 2.0  # doctor's wait for each live supervisor's ping


def _adopted(home: Path) -> list[Check]:
    """Live adopted jobs: contained in their own cgroup, or tracked by their tree only."""
    out = []
    for name, st in _live_states(home):
        if st.adopted is None:
            continue
        how = st.adopted.how
        said = st.adopted.containment()
        if st.adopted.contained:
            out.append(Check(f"job {name}", f"adopted ({how}), {said}", True))
            continue
        hint = (
            "its tree, session and process group are watched; a process that leaves all "
            "three (setsid + double fork) after adoption is not found. Adopt as root, from "
            "a delegated cgroup subtree, or on a systemd host (its manager moves the "
            "processes), to contain it"
        )
        out.append(
            Check(f"job {name}", f"adopted ({how}), {said.removeprefix('adopted, ')}", True, hint)
        )
    return out


def _init() -> Check:
    if systemd.booted():
        sd = systemd.detect()
        if sd is None:
            return Check(
                "init",
                "systemd, but its manager does not answer",
                False,
                "jobs start without a scope and share your login's fate",
            )
        manager = "user manager (systemd-run --user)" if sd.user else "system manager"
        return Check("init", f"systemd; each run gets its own scope via the {manager}", True)
    try:
        comm = Path("/proc/1/comm").read_text().strip()
    except OSError:
        comm = "unknown"
    return Check("init", f"{comm} (not systemd): jobs run in their own session, no unit", True)


def _busctl_property(name: str) -> str | None:
    argv = [
        "busctl",
        "get-property",
        "org.freedesktop.login1",
        "/org/freedesktop/login1",
        "org.freedesktop.login1.Manager",
        name,
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _logind() -> Check:
    kill = _busctl_property("KillUserProcesses")
    exclude = _busctl_property("KillExcludeUsers") or ""
    if kill is None:
        return Check("logind", "not reachable", True, "no logind: logout kills nothing")
    on = kill.endswith("true")
    value = f"KillUserProcesses={'yes' if on else 'no'}, KillExcludeUsers={exclude or '-'}"
    hint = "a job outside a trainctl scope dies at logout" if on else ""
    return Check("logind", value, True, hint)


def _linger() -> Check:
    if os.geteuid() == 0:
        return Check("linger", "not needed (root: the system manager holds the scopes)", True)
    on = systemd.linger_enabled()
    hint = "" if on else "run `loginctl enable-linger` so your jobs survive logout"
    return Check("linger", "on" if on else "off", on, hint)


def _units(home: Path) -> list[Check]:
    out = []
    for name, st in _live_states(home):
        if st.unit is None:
            continue
        props = systemd.properties(("Delegate", "KillSignal", "TimeoutStopUSec"), st.unit)
        delegated = props.get("Delegate") == "yes"
        out.append(
            Check(f"job {name}", f"{st.unit}, Delegate={'yes' if delegated else 'no'}", delegated)
        )
        out.append(_shutdown_check(home, name, props))
        out.append(_ordering_check(home, name, st))
    return out


def _ordering_check(home: Path, name: str, st: state.JobState) -> Check:
    """At a host shutdown: is this run's scope stopped before the mounts it writes to?"""
    props = systemd.properties(("After", "RequiresMountsFor"), st.unit)
    after = set(props.get("After", "").split())
    ordered = set(systemd.ORDER_AFTER.split()) <= after
    kept = props.get("RequiresMountsFor", "").split()
    try:
        spec = state.read_spec(state.job_dir(home, name))
        left = mounts.uncovered(
            mounts.written_dirs(home, state.job_dir(home, name), spec), st.mounts_kept
        )
    except TrainctlError:
        left = []
    value = (
        f"stopped before {', '.join(sorted(systemd.ORDER_AFTER.split()))}"
        if ordered
        else "not ordered before the file systems and the network"
    )
    value += f"; keeps mounted {', '.join(kept) or '-'}"
    if left:
        value += f"; NOT kept: {', '.join(left)}"
    hint = (
        ""
        if ordered and not left
        else "a shutdown may unmount what the job saves to: `trainctl restart` it (a run "
        "started now is ordered), or, on a user manager, keep checkpoints on /"
    )
    return Check(f"job {name} ordering", value, ordered and not left, hint)


def _shutdown_check(home: Path, name: str, props: dict[str, str]) -> Check:
    """At a host shutdown: does this run get its own stop, within a budget that fits?"""
    try:
        grace = state.read_spec(state.job_dir(home, name)).stop.grace_s
    except TrainctlError:
        grace = None
    own_stop = props.get("KillSignal") == str(int(signal.Signals[systemd.STOP_SIGNAL]))
    budget = props.get("TimeoutStopUSec", "?")
    default = systemd.default_stop_timeout() or "?"
    how = "its own graceful stop" if own_stop else "SIGTERM to every process at once"
    value = (
        f"at shutdown: {how}"
        f" within TimeoutStopSec={budget} (grace {grace:g} s; DefaultTimeoutStopSec={default})"
        if grace is not None
        else f"at shutdown: TimeoutStopSec={budget}"
    )
    hint = (
        ""
        if own_stop
        else "started by an older trainctl: `trainctl restart` it to get its own stop"
    )
    return Check(f"job {name} shutdown", value, own_stop, hint)


def _cgroup_mode() -> Check:
    mount = cgroup.find_mount()
    if mount is None:
        return Check("cgroups", "no cgroup v2 mounted: signals mode", True)
    mode = "unified" if str(mount) == "/sys/fs/cgroup" else f"hybrid (v2 at {mount})"
    return Check("cgroups", mode, True)


def _cgroup_writable() -> Check:
    probe = cgroup.create_job_cgroup(f"doctor-{ids.short_id()}")
    if probe is None:
        return Check(
            "job cgroups",
            "cannot create one here: stop freezes with SIGSTOP and kills by pidfd",
            True,
            "root, or a delegated scope (systemd), makes cgroup.freeze/kill available",
        )
    cgroup.remove(probe)
    return Check("job cgroups", "writable: cgroup.freeze and cgroup.kill in use", True)


def _pidfd() -> Check:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as e:
        return Check("pidfd", f"unavailable ({e.strerror})", False, "needs Linux >= 5.3")
    return Check("pidfd", "available: no signal can reach a recycled pid", True)
