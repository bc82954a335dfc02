"""systemd hosts: each run's supervisor in its own delegated scope, outside the login session.

A job started from an ssh login would otherwise live in that login's ``session-N.scope``:
with logind's ``KillUserProcesses=yes`` it dies at logout, and trainctl's sub-cgroups
would sit inside a scope that systemd owns, against its delegation rules. So, when PID 1
is systemd and its manager answers, the supervisor is started through

    systemd-run [--user] --scope --unit trainctl-NAME-rRUN-XXXXXXXX
                --slice trainctl.slice -p Delegate=yes --collect -- <supervisor>

``systemd-run`` is the system's own tool (no new Python dependency, and the same code
path for the system and the user manager); ``--scope`` keeps the supervisor our child
until it execs, so the readiness handshake over inherited fds works unchanged. The job's
cgroup is created below the scope, where the delegation makes it ours to manage. The
scope ends with its last process, so a stopped job leaves no unit behind.

Hosts without systemd (containers whose PID 1 is something else) keep the plain launch.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

from trainctl.supervisor.records import record

from . import cgroup, dbus

SLICE = "trainctl.slice"


@record(frozen=True)
class Systemd:
    """How this host's systemd can take a supervisor: which manager, and its caveats."""

    user: bool  # the per-user manager (non-root), not the system one
    warning: str | None = None  # e.g. linger is off: the job dies at logout


def booted() -> bool:
    """Tell whether PID 1 is systemd (sd_booted(3): /run/systemd/system exists)."""
    return os.path.isdir("/run/systemd/system")


def detect() -> Systemd | None:
    """Return how to place a supervisor under systemd here, or None to launch it plainly."""
    if not booted() or shutil.which("systemd-run") is None:
        return None
    user = os.geteuid() != 0
    if not _manager_answers(user):
        return None
    warning = None
    if user and not linger_enabled():
        warning = (
            "linger is off for this user: with logind's KillUserProcesses=yes the job will "
            f"be killed when you log out; run `loginctl enable-linger {_user_name()}`"
        )
    return Systemd(user=user, warning=warning)


def _manager_answers(user: bool) -> bool:
    argv = ["systemctl", *(["--user"] if user else []), "show-environment"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def linger_enabled(user: str | None = None) -> bool:
    """Tell whether logind keeps this user's manager (and its units) after logout."""
    return Path("/var/lib/systemd/linger", user or _user_name()).exists()


def unit_name(name: str, run: int, marker: str) -> str:
    """The scope of one run: unique, and readable in `systemctl list-units`."""
    return f"trainctl-{name}-r{run}-{marker[:8]}.scope"


# What systemd sends every process of a run's scope when it stops the scope (a host
# shutdown, a reboot, `systemctl stop`): a signal whose default action is to do nothing,
# so no process of the job dies of it. The supervisor takes it as "stop the job", and runs
# the job's own stop (top-down, with its grace) instead of systemd's all-at-once SIGTERM.
STOP_SIGNAL = "SIGURG"
# Beyond the job's grace, kill wait and GPU check: the scope's stop is then SIGKILLed.
STOP_SLACK_S = 30


# At shutdown systemd stops units in the reverse order of After=. A transient scope gets
# only Conflicts=/Before=shutdown.target, so it is stopped side by side with the file
# systems and the network: a checkpoint written to /data while /data is unmounted is
# lost. Ordered after these, the scope's stop (the job's own, with its grace) finishes
# before any of them goes away.
ORDER_AFTER = "local-fs.target remote-fs.target network.target"


def mounts_for(paths: list[str]) -> list[str]:
    """The paths a run's scope must keep mounted (RequiresMountsFor), one per directory.

    A path with white space cannot be written in the property's space-separated list:
    it is left out (`status` then names it as not covered).
    """
    out: list[str] = []
    for p in paths:
        if p and os.path.isabs(p) and not any(c.isspace() for c in p) and p not in out:
            out.append(p)
    return out


def scope_argv(
    sd: Systemd,
    unit: str,
    stop_budget_s: float | None = None,
    kill_signal: str = STOP_SIGNAL,
    keep_mounted: list[str] | None = None,
) -> list[str]:
    """The systemd-run prefix that puts the command in a new delegated scope.

    ``stop_budget_s``: how long the job's own stop may take; the scope's TimeoutStopSec
    (how long systemd waits after KillSignal before SIGKILL) leaves it that much.
    ``kill_signal``: what systemd sends when it stops the scope (a queued job's waiter
    has nothing to save: SIGTERM ends it at once, and its entry stays queued on disk).
    ``keep_mounted``: the directories the job writes to (cwd, home, log, checkpoints):
    on the system manager the scope is ordered after the file systems and the network
    and requires those mounts, so a shutdown stops it before unmounting them. (A user
    manager has no mount units to order against.)
    """
    budget = [] if stop_budget_s is None else ["-p", f"TimeoutStopSec={int(stop_budget_s)}s"]
    order: list[str] = []
    if not sd.user and keep_mounted is not None:
        order = ["-p", f"After={ORDER_AFTER}"]
        paths = mounts_for(keep_mounted)
        if paths:
            order += ["-p", f"RequiresMountsFor={' '.join(paths)}"]
    return [
        "systemd-run",
        *(["--user"] if sd.user else []),
        "--scope",
        "--quiet",
        "--collect",
        "--unit",
        unit,
        "--slice",
        SLICE,
        "-p",
        "Delegate=yes",
        "-p",
        f"KillSignal={kill_signal}",
        *budget,
        *order,
        "--",
    ]


def properties(names: tuple[str, ...], unit: str | None = None) -> dict[str, str]:
    """Properties of a unit (or, without one, of the manager) of this user's manager;
    empty where systemctl cannot say."""
    user = ["--user"] if os.geteuid() != 0 else []
    props = [a for n in names for a in ("-p", n)]
    argv = ["systemctl", *user, "show", *props, *([unit] if unit else [])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if done.returncode != 0:
        return {}
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def show(prop: str, unit: str | None = None) -> str | None:
    """One property of a unit (or of the manager); None where it is empty or unknown."""
    return properties((prop,), unit).get(prop) or None


def unit_active_state(unit: str) -> str | None:
    """``active``, ``deactivating``, ... of a unit (None: unknown)."""
    return show("ActiveState", unit)


def default_stop_timeout() -> str | None:
    """The manager's DefaultTimeoutStopSec (what other units get at shutdown), as it says."""
    return show("DefaultTimeoutStopUSec")


def own_unit() -> str | None:
    """Return the trainctl scope this process runs in, if any (read from /proc/self/cgroup)."""
    leaf = (cgroup.own_cgroup() or "").rsplit("/", 1)[-1]
    return leaf if leaf.startswith("trainctl-") and leaf.endswith(".scope") else None


def manager_socket() -> str:
    """The private socket of this user's manager (the system one's, for root)."""
    if os.geteuid() == 0:
        return "/run/systemd/private"
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.geteuid()}"
    return f"{runtime}/systemd/private"


def attach(unit: str, subcgroup: str, pids: list[int], timeout_s: float = 20.0) -> str | None:
    """Ask the manager to move ``pids`` into ``subcgroup`` of ``unit`` (a delegated scope).

    This is how a non-root user's processes leave a login's ``session-N.scope``, which the
    kernel does not let the user write: the user's manager asks the system manager, which
    moves processes of the caller's own uid into the caller's own delegated subtree (the
    same path ``systemd-run --user --scope`` takes for its own pid). Returns None when the
    manager did it, else what it said.
    """
    try:
        dbus.call(
            manager_socket(),
            None,
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "AttachProcessesToUnit",
            "ssau",
            (unit, subcgroup, pids),
            timeout_s=timeout_s,  # the manager asks the system manager in turn: can be slow
        )
    except dbus.DBusError as e:
        return str(e)
    return None
