"""Where a home keeps its jobs, spelt once: the names of the folders and files, the job
names they may hold, and the supervisor's command line.

Plain strings and the standard library's C parts only (no pathlib, no re): the stop's
request goes out through :mod:`trainctl.launcher.early` before anything else of trainctl
is imported, and it finds the job's socket and checks its supervisor with these.
state.py, control.py, tree/launch.py and the queue's entries build their paths from
them.
"""

from __future__ import annotations

import os

JOBS = "jobs"  # <home>/jobs/<name>/: one directory a job
QUEUE = "queue"  # <home>/queue/<name>.json: a queued job's entry
SOCK_NAME = "control.sock"  # <home>/jobs/<name>/control.sock: the supervisor's socket
DEPLOY_LOCK = "deploy.lock"  # <home>/jobs/<name>/deploy.lock: held by a live deployer
DEPLOYS = "deploys"  # <home>/jobs/<name>/deploys/<id>.*: a deploy's plan, steps, report
DEPLOY_VAR = "TRAINCTL_DEPLOY"  # the deploy's id, in its new run's environment
# <home>/jobs/<name>/deploys/<id>.previous.json: the spec of the run a deploy replaced,
# written before its new code starts; the way back once the deployer is gone (the new
# code's supervisor rolls back to it when the code keeps failing after its probation)
PREVIOUS_SPEC = "{id}.previous.json"
SUPERVISOR_MODULE = "trainctl.supervisor"  # python -m <this> --home HOME --name NAME ...

NAME_MAX = 64
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def name_ok(name: str) -> bool:
    """A job name: 1-64 of letters, digits, '.', '_' and '-', starting with a letter or
    digit (so never '.', '..' or an option)."""
    return 0 < len(name) <= NAME_MAX and name[0] not in "._-" and set(name) <= _NAME_CHARS


def followed_home(path: str) -> str:
    """The directory a home that is the user's own symlink points at (`ln -s
    /scratch/me/trainctl ~/.local/state/trainctl`, for a small home quota); else ``path``
    as it is. A link someone else owns is not followed: the home's checks refuse it.

    Every path of the job (the supervisor's ``--home`` included) is then built from the
    real directory, so the link can be moved or replaced without misleading a run."""
    try:
        st = os.lstat(path)
    except OSError:
        return path
    if st.st_mode & 0o170000 == 0o120000 and st.st_uid == os.geteuid():
        return os.path.realpath(path)
    return path


def job_dir(home: str, name: str) -> str:
    """``<home>/jobs/<name>`` (the name not checked here)."""
    return f"{home}/{JOBS}/{name}"


def control_path(home: str, name: str) -> str:
    """The job's control socket."""
    return f"{job_dir(home, name)}/{SOCK_NAME}"


def queue_entry(home: str, name: str) -> str:
    """The job's queue entry, while it is queued."""
    return f"{home}/{QUEUE}/{name}.json"


def supervisor_args(home: str, name: str) -> list[str]:
    """What follows the interpreter on the supervisor's command line: how a process is
    known as this job's supervisor (`early.py` checks a socket's peer by it)."""
    return ["-m", SUPERVISOR_MODULE, "--home", home, "--name", name]
