"""Job directory layout, versioned spec/state documents, atomic writes, locks, trust checks.

Layout under ``$TRAINCTL_HOME`` (mode 0700)::

    jobs/<name>/spec.json        what to run (argv, cwd, env, grace, stop signal)
    jobs/<name>/state.json       live state, replaced atomically by its single writer
    jobs/<name>/events.jsonl     one JSON event per line
    jobs/<name>/control.sock     the supervisor's socket (0600, peer uid checked)
    jobs/<name>/lock             flock: held by start / restart / supervisor-less stop
    jobs/<name>/supervisor.lock  flock: held by the live supervisor for its whole life
    jobs/<name>/logs/run-N.log   stdout+stderr of run N
    jobs/<name>/stacks/run-N.*.json  Python stacks read at a stall / before a SIGKILL

Only one process writes state.json at a time: the supervisor while it lives (the CLI asks it
over the socket), otherwise the CLI holding ``lock``. Readers never need a lock because
every write is temp file + fsync + rename + fsync(dir).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainctl.supervisor import ids
from trainctl.supervisor.errors import (
    ConfigError,
    JobConflictError,
    JobNotFoundError,
    StateError,
    TrainctlError,
)
from trainctl.supervisor.linux import procfs

# re-exported (mypy's explicit form): every reader has always named them from here
from trainctl.supervisor.linux.files import dir_fd as dir_fd  # noqa: PLC0414  (state's names)
from trainctl.supervisor.linux.files import open_in as open_in  # noqa: PLC0414
from trainctl.supervisor.linux.poll import poll_until
from trainctl.supervisor.records import JsonObject, asdict, field_names, record, replace

from . import layout
from .phases import TERMINAL as TERMINAL  # noqa: PLC0414
from .phases import TRANSITIONS as TRANSITIONS  # noqa: PLC0414
from .phases import Phase as Phase  # noqa: PLC0414
from .procs import ERROR_FILE_VAR as ERROR_FILE_VAR  # noqa: PLC0414  (state's names)
from .procs import GPU_COUNT_VAR as GPU_COUNT_VAR  # noqa: PLC0414
from .procs import HELPER_VAR as HELPER_VAR  # noqa: PLC0414
from .procs import NODE_VAR as NODE_VAR  # noqa: PLC0414
from .procs import TRAINCTL_VARS as TRAINCTL_VARS  # noqa: PLC0414
from .procs import TRANSPORT_VARS as TRANSPORT_VARS  # noqa: PLC0414
from .procs import MemberSnap as MemberSnap  # noqa: PLC0414
from .procs import ProcRef as ProcRef  # noqa: PLC0414
from .reports import Cause, Failure, Guard, RestartEntry, SlurmStopReport, StopReport, Trial
from .schema import build_document, check_document
from .sections import Adoption, CodeRecord, SlurmRecord
from .spec import SCHEMA as SCHEMA  # noqa: PLC0414  (state's names)
from .spec import Spec, spec_from_doc


@record(frozen=True)
class GpuLease:
    """A GPU bound to a run, with its memory use when the run started (the baseline)."""

    index: int
    uuid: str
    name: str
    baseline_used_bytes: int
    mig: int | None = None  # a MIG instance of GPU ``index`` (bound by its MIG-… uuid)

    @property
    def label(self) -> str:
        """Return ``3``, or ``3/1`` for MIG device 1 of GPU 3."""
        return f"{self.index}" if self.mig is None else f"{self.index}/{self.mig}"

    @property
    def token(self) -> str:
        """How CUDA_VISIBLE_DEVICES and the spec name it: an index, or a MIG-… uuid."""
        return str(self.index) if self.mig is None else self.uuid


def gpu_env(leases: tuple[GpuLease, ...] | list[GpuLease]) -> dict[str, str]:
    """The environment that binds a run to its GPUs (indices as nvidia-smi shows them; a
    MIG instance by its MIG-… uuid, the only name CUDA takes for one), and their count
    for a process count that follows it (``torchrun --nproc_per_node=$TRAINCTL_GPU_COUNT``):
    a run restarted on fewer GPUs after a GPU fault (``min_gpus``) gets fewer."""
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(g.token for g in leases),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        GPU_COUNT_VAR: str(len(leases)),
    }


@record(frozen=True)
class JobState:
    """The live state of a job's current run (state.json)."""

    name: str
    run: int
    phase: Phase
    marker: str
    started_at: float
    supervisor: ProcRef | None = None
    main: ProcRef | None = None
    pgid: int | None = None
    sid: int | None = None
    mode: str = "signals"  # "cgroup" or "signals": how the tree is frozen and killed
    cgroup: str | None = None
    memory_cgroup: str | None = None  # the group holding memory.max (memory caps), if any
    ended_at: float | None = None
    exit_code: int | None = None  # 128+N when killed by signal N
    error: str | None = None
    members: tuple[MemberSnap, ...] = ()
    snapshot_at: float | None = None
    last_stop: StopReport | SlurmStopReport | None = None
    gpus: tuple[GpuLease, ...] = ()
    restarts: int = 0  # automatic relaunches so far (restart policy)
    last_failure: Failure | None = None  # the failed run the restart policy answered
    resumed_from: str | None = None  # the checkpoint a restart handed this run
    from_scratch: bool = False  # started with --from-scratch: nothing handed, no guard
    guard: Guard | None = None  # the checkpoint guard of this run (watch/guard.py)
    # a deploy's new code, held to its gate and probation by this supervisor (deploys.py)
    trial: Trial | None = None
    # this run went back to the code a deploy replaced, which kept failing: why
    rolled_back: str | None = None
    stall_deadline_s: float | None = None  # stall_timeout = "auto": the deadline learned
    # each automatic restart so far (newest last, at most 50)
    restart_history: tuple[RestartEntry, ...] = ()
    cause: Cause | None = None  # why the run ended (supervisor/life/causes.py)
    oom_kills: int = 0  # OOM kills the kernel counted in the job's memory group
    restart_at: float | None = None  # set while waiting out the restart backoff
    stalled_since: float | None = None  # stall watchdog: no progress nor output since
    code: CodeRecord | None = None  # code version of cwd at start (drift detection)
    # what changed on disk since then, kept current by the supervisor (status reads it)
    code_drift: tuple[str, ...] = ()
    # GPU faults seen during the run (Xid events, ECC errors, a lost GPU), newest last
    gpu_faults: tuple[str, ...] = ()
    # work the job handed to a tmux server outside it (supervisor/tree/handoff.py), as lines
    handed_off: tuple[str, ...] = ()
    # what the run's systemd scope keeps mounted until it has stopped (supervisor/tree/mounts.py)
    mounts_kept: tuple[str, ...] = ()
    drift_checked_at: float | None = None
    backend: str = "local"
    slurm: SlurmRecord | None = None  # the Slurm job it was submitted as (Slurm backend)
    unit: str | None = None  # the run's systemd scope (systemd hosts), else None
    # /proc/sys/kernel/random/boot_id when the run started: pids and start times mean
    # nothing after a reboot, so a state from another boot is never acted on by pid
    boot_id: str | None = None
    adopted: Adoption | None = None  # `trainctl adopt` (None: started by trainctl)
    schema: int = SCHEMA

    def from_other_boot(self) -> bool:
        """Tell whether this run was recorded before the machine last booted."""
        return self.boot_id is not None and self.boot_id != current_boot_id()

    def member_nets(self) -> dict[ProcRef, tuple[str, ...]]:
        """Return the nets of each member in the last snapshot."""
        return {ProcRef(m.pid, m.start_ticks): m.nets for m in self.members}

    def moved(self, phase: Phase, **changes: Any) -> JobState:
        """Return a copy in ``phase``; refuse moves the TRANSITIONS table forbids."""
        if phase != self.phase and phase not in TRANSITIONS[self.phase]:
            raise StateError(f"job {self.name}: illegal phase move {self.phase} -> {phase}")
        return replace(self, phase=phase, **changes)


# ---------------------------------------------------------------- paths


def default_home() -> Path:
    """Return ``$XDG_STATE_HOME/trainctl`` (``~/.local/state/trainctl``)."""
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(xdg) / "trainctl"


def check_name(name: str) -> str:
    """Validate a job name (it becomes a directory name)."""
    if not layout.name_ok(name):
        empty = "" if name else " an empty value;"
        raise ConfigError(
            f"invalid job name {name!r}:{empty} "
            "use 1-64 of A-Z a-z 0-9 . _ -, starting alphanumeric"
        )
    return name


def jobs_dir(home: Path) -> Path:
    """Return the folder holding one directory per job."""
    return home / layout.JOBS


STATE_FILE = "state.json"  # <job>/state.json: the run as it stands (its supervisor writes it)
SPEC_FILE = "spec.json"  # <job>/spec.json: what to run
JOB_LOCK = "lock"  # flock: start, restart, a supervisor-less stop
SUPERVISOR_LOCK = "supervisor.lock"  # flock: held by the live supervisor for its whole life


@record(frozen=True)
class JobDir:
    """One job's directory: every file and lock of it, named once (issue 55 §3; the names
    themselves are layout.py's and the constants above)."""

    path: Path

    @property
    def state(self) -> Path:
        return self.path / STATE_FILE

    @property
    def spec(self) -> Path:
        return self.path / SPEC_FILE

    @property
    def has_run(self) -> bool:
        """A run was ever recorded here (a state file exists)."""
        return self.state.exists()

    @property
    def is_job(self) -> bool:
        """A job lives here: a state or a spec file (a failed first start leaves a spec)."""
        return self.has_run or self.spec.exists()


def job_dir(home: Path, name: str) -> Path:
    """Return the directory of job ``name`` (not checked for existence)."""
    return jobs_dir(home) / check_name(name)


def check_not_symlink(path: Path) -> Path:
    """Refuse a job directory (or a file in it) that is a symlink: never write through one."""
    if path.is_symlink():
        raise StateError(
            f"{path} is a symlink; refusing to follow it (remove it by hand if it is stale)"
        )
    return path


def open_append(path: Path) -> int:
    """An O_APPEND descriptor of ``path``, created 0600 whatever the umask (no symlink)."""
    return open_in(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)


def stacks_path(jdir: Path, run: int, moment: str) -> Path:
    """Where the Python stacks of run ``run`` at ``moment`` (stall, before-kill) go."""
    return jdir / "stacks" / f"run-{run}.{moment}.json"


# the checkpoint a run is handed: a deploy's, a restart's (`trainer.resume_from()` reads it)
RESUME_VAR = "TRAINCTL_RESUME_FROM"


def helper_env(marker: str) -> dict[str, str]:
    """The environment of a process the supervisor starts for itself, not for the job."""
    env = {k: v for k, v in os.environ.items() if k not in TRAINCTL_VARS}
    env[HELPER_VAR] = marker
    return env


def error_file(jdir: Path, run: int) -> Path:
    """Where torchrun (TORCHELASTIC_ERROR_FILE) records run ``run``'s failing worker."""
    return jdir / "logs" / f"run-{run}.error.json"


def log_path(jdir: Path, run: int) -> Path:
    """Return the log file of run ``run``."""
    return jdir / "logs" / f"run-{run}.log"


def progress_path(jdir: Path, run: int) -> Path:
    """Return the file run ``run`` reports its progress to ($TRAINCTL_PROGRESS)."""
    return jdir / "logs" / f"run-{run}.progress.jsonl"


def ensure_home(home: Path) -> None:
    """Create the home (0700), or verify an existing one is ours, private and writable.

    An existing directory is never chmodded: pointed at a shared 1777 directory, trainctl
    would lock everyone else out of it. Such a home is refused with a way forward.
    """
    for path in (home, jobs_dir(home)):
        if path.is_symlink():  # a home that is the user's own link was followed already
            owner = path.lstat().st_uid
            theirs = path == home and owner != os.geteuid()
            whose = f" owned by uid {owner}, not by you" if theirs else ""
            raise ConfigError(f"{path} is a symlink{whose}; refusing to follow it")
        if path.exists():
            _check_private_dir(path)
            continue
        try:
            path.mkdir(parents=True, mode=0o700)
        except FileExistsError:
            _check_private_dir(path)  # a concurrent start made it
        except OSError as e:
            raise ConfigError(f"TRAINCTL_HOME {home} cannot be used: {e.strerror}") from None
    if not os.access(jobs_dir(home), os.W_OK):
        raise ConfigError(f"TRAINCTL_HOME {home} is not writable")


def _check_private_dir(path: Path) -> None:
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path} is not a directory")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        who = "owned by another user" if st.st_uid != os.geteuid() else "writable by others"
        raise ConfigError(
            f"TRAINCTL_HOME {path} is {who}; use a private directory inside it, "
            f"e.g. --home {path / 'trainctl'}"
        )


def check_owner(path: Path) -> None:
    """Refuse a file or folder owned by someone else or writable by group/others."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    _check_owner_stat(path, st)


def _check_owner_stat(path: Path, st: os.stat_result) -> None:
    if st.st_uid != os.geteuid():
        raise StateError(f"{path} is owned by uid {st.st_uid}, not by you; refusing to use it")
    if st.st_mode & 0o022:
        raise StateError(f"{path} is writable by other users; refusing to trust it")


def list_jobs(home: Path) -> list[str]:
    """Return the names of all jobs, sorted."""
    try:
        return sorted(p.name for p in jobs_dir(home).iterdir() if layout.name_ok(p.name))
    except FileNotFoundError:
        return []


# ---------------------------------------------------------------- documents


def write_json_atomic(path: Path, doc: Any, *, durable: bool = True) -> None:
    """Replace ``path`` with ``doc`` so that readers see the old or the new file, never half.

    ``durable=False`` skips the fsyncs: other processes see the new file at once either
    way; only a machine crash could bring the old one back, and for a transient phase
    (``stopping``) a crash kills the job anyway.
    """
    data = json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"
    write_bytes_atomic(path, data, durable=durable)


def write_bytes_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (see :func:`write_json_atomic`).

    The temporary name is unpredictable and created with O_EXCL|O_NOFOLLOW, so a planted
    file or symlink is never written through; a failed write (a full disk) leaves no
    temporary file behind and the old file intact.
    """
    tmp = ids.temp_name(path.name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with dir_fd(path.parent) as dfd:
        fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        if durable:
            os.fsync(dfd)


def _read_doc(path: Path, what: str) -> dict[str, Any]:
    try:
        fd = open_in(path, os.O_RDONLY)
    except FileNotFoundError:
        raise JobNotFoundError(f"no {what} at {path}") from None
    with os.fdopen(fd, "rb") as f:
        _check_owner_stat(path, os.fstat(f.fileno()))  # the very file that is read
        text = f.read().decode(errors="replace")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise StateError(
            f"{path} is corrupt or truncated ({e.msg}); refusing to act on it"
        ) from None
    if not isinstance(doc, dict):
        raise StateError(f"{path} is not a JSON object; refusing to act on it")
    schema = doc.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool) or not 1 <= schema <= 1 << 20:
        raise StateError(f"{path} has unknown schema {schema!r} (expected {SCHEMA})")
    # A newer schema is read for the fields this trainctl knows (each version only adds:
    # status and stop work across versions); the record keeps its number, and a verb that
    # changes the job refuses it with both versions named (newer_line, require_known).
    return doc


def newer_line(what: str, schema: int) -> str:
    """``state.json was written by a newer trainctl (state schema 2; this trainctl reads 1)``."""
    return (
        f"{what}.json was written by a newer trainctl ({what} schema {schema}; "
        f"this trainctl reads {SCHEMA})"
    )


def require_known(name: str, st: JobState, spec: Spec | None = None) -> None:
    """Refuse to change a job that a newer trainctl recorded (restart, deploy, a start
    over it): one line with both versions and what still works."""
    for what, schema in (("state", st.schema), ("spec", spec.schema if spec else SCHEMA)):
        if schema > SCHEMA:
            raise StateError(
                f"job {name}: {newer_line(what, schema)}: status and stop work; use the "
                "newer trainctl to restart or deploy it"
            )


def known_fields(cls: type, doc: Any) -> Any:
    """``doc`` without the keys record ``cls`` does not have (a newer writer's); anything
    but an object is given back as it is, for the record's own check to name."""
    if not isinstance(doc, dict):
        return doc
    names = _known_names(cls)
    return {k: v for k, v in doc.items() if k in names}


@functools.cache
def _known_names(cls: type) -> frozenset[str]:
    return frozenset(field_names(cls))


def _newer(doc: JsonObject) -> bool:
    schema = doc.get("schema")
    return isinstance(schema, int) and schema > SCHEMA


def read_spec(jdir: Path) -> Spec:
    """Read and validate spec.json."""
    path = jdir / SPEC_FILE
    return spec_from_doc(_read_doc(path, "spec"), str(path))


# The sections of state.json that are records of their own, read back field by field.
_SECTIONS: dict[str, type] = {
    "last_failure": Failure,
    "cause": Cause,
    "code": CodeRecord,
    "slurm": SlurmRecord,
    "adopted": Adoption,
    "guard": Guard,
    "trial": Trial,
}


# Fields a reader older than this trainctl does not know (it refused unknown keys: before
# issue 55). Written only when set, so that such a reader, a trainctl rolled back under a
# running job, still reads every state that does not use them.
WRITTEN_WHEN_SET = ("trial",)


def state_to_doc(st: JobState) -> JsonObject:
    """Serialise a JobState for state.json."""
    doc = asdict(st)
    for key in WRITTEN_WHEN_SET:
        if doc.get(key) is None:
            doc.pop(key, None)
    return doc


def _build_sections(d: dict[str, Any], where: str) -> None:
    """Turn the record sections of a state document into their records, in place."""
    for key, cls in _SECTIONS.items():
        if d.get(key) is not None:
            d[key] = build_document(cls, d[key], f"{where}: {key}")
    stop = d.get("last_stop")
    if isinstance(stop, dict):  # the Slurm backend's stops are a record of their own
        cls = SlurmStopReport if stop.get("mode") == "slurm" else StopReport
        d["last_stop"] = build_document(cls, stop, f"{where}: last_stop")
    if isinstance(d.get("restart_history"), list):
        d["restart_history"] = tuple(
            build_document(RestartEntry, h, f"{where}: restart_history[{i}]")
            for i, h in enumerate(d["restart_history"])
        )


def state_from_doc(doc: dict[str, Any], where: str) -> JobState:
    """Build a JobState from JSON, rejecting anything malformed (never act on it then)."""
    try:
        d = known_fields(JobState, doc)
        d["phase"] = Phase(d["phase"])
        for key in ("supervisor", "main"):
            d[key] = ProcRef(**known_fields(ProcRef, d[key])) if d.get(key) else None
        d["members"] = tuple(
            MemberSnap(**{**known_fields(MemberSnap, m), "nets": tuple(m["nets"])})
            for m in d.get("members", ())
        )
        d["gpus"] = tuple(GpuLease(**known_fields(GpuLease, g)) for g in d.get("gpus", ()))
        for key in ("code_drift", "gpu_faults", "handed_off", "mounts_kept"):
            if isinstance(d.get(key), list):
                d[key] = tuple(d[key])
        _build_sections(d, where)
        st = JobState(**d)
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        if _newer(doc):
            raise StateError(f"{newer_line('state', doc['schema'])} and this one cannot read "
                             f"it ({e}); use the newer trainctl") from None  # fmt: skip
        raise StateError(f"{where} is malformed ({e}); refusing to act on it") from None
    check_document(st, where)
    if len(st.marker) < 16 or st.run < 1:
        raise StateError(f"{where} has no valid marker/run; refusing to act on it")
    if st.phase == Phase.LOST:
        raise StateError(f"{where}: phase 'lost' is derived, never stored; refusing to act on it")
    booted = boot_time()
    this_boot = st.boot_id is not None and st.boot_id == current_boot_id()
    if this_boot and booted is not None and st.started_at < booted - BOOT_SLACK_S:
        raise StateError(
            f"{where}: says this boot, but its run started before this boot began; "
            "refusing to act on it"
        )
    # main is started as the leader of its own session and group: any other number would
    # make the group and session nets take in processes that are not the job's
    for key, value in (("pgid", st.pgid), ("sid", st.sid)):
        if value is not None and (st.main is None or value != st.main.pid):
            raise StateError(f"{where}: {key} {value} is not main's; refusing to act on it")
    return st


_read_cache: dict[Path, tuple[tuple[int, int, int, int], JobState]] = {}


def read_state(jdir: Path) -> JobState:
    """Read and validate state.json of a job directory.

    A stop reads the state several times; the file is only ever replaced (a new inode
    each time), so an unchanged (inode, mtime, size, ctime) means the very same,
    already-validated document. Ownership and mode are checked on every call.
    """
    path = jdir / STATE_FILE
    try:
        s = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        s = None
    key = (s.st_ino, s.st_mtime_ns, s.st_size, s.st_ctime_ns) if s is not None else None
    cached = _read_cache.get(path)
    if key is not None and cached is not None and cached[0] == key:
        check_owner(path)
        return cached[1]
    st = state_from_doc(_read_doc(path, "state"), str(path))
    if key is not None:
        _read_cache[path] = (key, st)
    return st


def write_state(jdir: Path, st: JobState, *, durable: bool = True) -> None:
    """Atomically replace state.json."""
    write_json_atomic(jdir / STATE_FILE, state_to_doc(st), durable=durable)


def mtime(path: Path) -> float:
    """Return the modification time of ``path``, or 0.0 if it does not exist."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# ---------------------------------------------------------------- locks


@contextlib.contextmanager
def job_lock(
    jdir: Path, timeout_s: float, what: str = "another trainctl command"
) -> Iterator[None]:
    """Hold the job's exclusive lock; wait up to ``timeout_s`` for it."""
    with flock_file(jdir / JOB_LOCK, timeout_s, f"job {jdir.name} is busy ({what} holds its lock)"):
        yield


@contextlib.contextmanager
def flock_file(path: Path, timeout_s: float, busy: str) -> Iterator[None]:
    """Hold an exclusive flock on ``path``; raise JobConflictError(busy) after ``timeout_s``.

    On a read-only or full file system an existing lock file is locked through a read-only
    descriptor (flock does not need write access); without one the caller gets a one-line
    ConfigError, since everything that takes this lock also writes beside it.
    """
    try:
        fd = open_in(path, os.O_RDWR | os.O_CREAT)
    except OSError as e:
        try:
            fd = open_in(path, os.O_RDONLY)
        except OSError:
            raise ConfigError(f"cannot lock {path}: {e.strerror}") from None
    try:
        if poll_until(functools.partial(_try_flock, fd), timeout_s, 0.05) is None:
            raise JobConflictError(f"{busy}; try again")
        yield
    finally:
        os.close(fd)


def _try_flock(fd: int) -> bool | None:
    """Take the exclusive lock now if it is free (True), else None."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None
    return True


def is_locked(jdir: Path, lockname: str) -> bool:
    """Tell whether some process holds ``lockname`` in the job directory."""
    try:
        fd = open_in(jdir / lockname, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError as e:
        if e.errno == errno.EWOULDBLOCK:
            return True
        raise
    finally:
        os.close(fd)
    return False


def supervisor_alive(jdir: Path, st: JobState | None = None) -> bool:
    """Tell whether the job's supervisor lives: it holds supervisor.lock until it dies.

    A lock cannot be inherited by a recycled pid, so this is immune to pid reuse. With the
    run's state at hand, the recorded supervisor (pid + start time, this boot) counts too,
    so a deleted supervisor.lock never makes a live supervisor look gone.
    """
    if is_locked(jdir, SUPERVISOR_LOCK):
        return True
    if st is None or st.supervisor is None or st.from_other_boot():
        return False
    return procfs.is_supervisor(st.supervisor.pid, st.supervisor.start_ticks)


def supervised(jdir: Path) -> bool:
    """Tell whether the job's current run has a live supervisor (lock, or pid + start).

    An unreadable state.json counts as no supervisor here: a direct stop that follows
    reads it again and refuses with the reason.
    """
    try:
        return supervisor_alive(jdir, read_state(jdir))
    except TrainctlError:
        return False


def effective_phase(jdir: Path, st: JobState) -> Phase:
    """Return the stored phase, or LOST when a live-looking run has no supervisor."""
    if not st.phase.ended and not supervisor_alive(jdir, st):
        return Phase.LOST
    return st.phase


# /proc/stat's btime is whole seconds, and the wall clock may have been stepped a little
BOOT_SLACK_S = 120.0


@functools.cache
def boot_time() -> float | None:
    """When this boot began (wall clock, /proc/stat btime), or None where it is not said."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@functools.cache
def current_boot_id() -> str | None:
    """Return this boot's id (None where the kernel does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None
