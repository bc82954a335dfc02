"""The queue of a home: jobs that wait for GPUs, for other jobs, or for their turn.

No daemon. A queued job is a file, ``<home>/queue/<name>.json`` (its spec and what it
waits for), and a waiter process of its own (launcher/waiter.py) that holds
``<name>.lock`` for as long as it lives. One waiter at a time, the holder of
``dispatch.lock``, is the home's dispatcher: it looks at the whole queue four times a
second and starts what may start. The others sleep in ``flock`` (no CPU) and look once a
second whether their entry is still there; when the dispatcher's own job starts, it exits
and the next waiter takes over at once.

What a job waits for, in the order it is checked:

1. ``--singleton``: no live run of the same name, nor of the same spec (the same spec
   file, or the same command and directory), and no earlier queued entry of the same.
2. ``--after JOB[:ok|failed|any]``: JOB's run has ended that way. A run that ended the
   other way, or a JOB that was removed or dequeued, ends the queued job ``failed`` with
   that cause: it can never be met.
3. ``--queue --gpus``: the GPUs are free. Jobs that wait only for GPUs are served first in,
   first out: a later job that would fit goes first only with ``--backfill``.

The GPUs are read only when the leases recorded in the home say the request could fit
(a GPU leased by a live job is busy without asking the driver), and then at most once a
second in the whole home. The lease itself is taken at dispatch, by the ordinary start,
under the home's GPU lock: two jobs can never be started on the same free GPU.

Locks, always taken in this order: ``queue.lock`` (any change to the queue), then the
job's lock, then ``gpus.lock``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainctl.launcher import backends
from trainctl.launcher.ops.jobs import current_phase, existing_job
from trainctl.supervisor import ids
from trainctl.supervisor.errors import (
    ConfigError,
    JobConflictError,
    JobNotFoundError,
    StateError,
    TrainctlError,
)
from trainctl.supervisor.gpu import health
from trainctl.supervisor.model import events, layout, state
from trainctl.supervisor.model.reports import Cause
from trainctl.supervisor.model.schema import build_document
from trainctl.supervisor.model.spec import Spec, spec_to_doc
from trainctl.supervisor.model.state import JobState, Phase
from trainctl.supervisor.records import field, record

TICK_S = 0.25  # how often the dispatcher looks at the queue


GPU_POLL_S = 1.0  # at most one look at the GPUs per this, in the whole home


NO_WAITER_S = 3.0  # `wait`: a queued job without a waiter this long will never start


WHEN = ("ok", "failed", "any")


@record(frozen=True)
class After:
    """One ``--after``: start once run ``run`` (or a later one) of ``job`` ended ``when``."""

    job: str
    run: int
    when: str = "ok"

    def label(self) -> str:
        return f"{self.job}:{self.when}"


@record(frozen=True)
class Entry:
    """A queued start: ``<home>/queue/<name>.json``."""

    name: str
    token: str  # this entry's own id: a waiter serves only the entry it was started for
    seq: int  # first in, first out: the time it was queued, in ns
    queued_at: float
    spec: dict[str, Any]
    gpus: str | None = None
    share: bool = False
    force: bool = False
    after: list[After] = field(default_factory=list)
    singleton: str | None = None  # "name:NAME" or "spec:KEY"
    backfill: bool = False


def queue_dir(home: Path) -> Path:
    return home / layout.QUEUE


def entry_path(home: Path, name: str) -> Path:
    return queue_dir(home) / f"{name}.json"


@contextlib.contextmanager
def queue_lock(home: Path, timeout_s: float = 10.0) -> Iterator[None]:
    """Hold the lock every change to the queue takes (enqueue, dequeue, dispatch)."""
    _ensure_dir(home)
    with state.flock_file(queue_dir(home) / "queue.lock", timeout_s, "the queue is busy"):
        yield


def _ensure_dir(home: Path) -> None:
    state.ensure_home(home)
    q = queue_dir(home)
    with contextlib.suppress(FileExistsError):
        q.mkdir(mode=0o700)
    state.check_not_symlink(q)


def read_entry(home: Path, name: str) -> Entry | None:
    """The queued entry of ``name``; None when it has none. StateError when untrusted."""
    path = entry_path(home, name)
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise StateError(f"cannot read {path}: {e.strerror}") from None
    try:
        doc = json.loads(raw)
    except ValueError:
        raise StateError(f"{path} is not valid JSON; remove it to dequeue") from None
    entry = build_document(Entry, doc, str(path))
    if entry.name != name:
        raise StateError(f"{path} names job {entry.name!r}; remove it to dequeue")
    return entry


def queued_names(home: Path) -> list[str]:
    """The names with an entry in the queue (trusted or not), cheaply: one listdir."""
    try:
        return [p.name[:-5] for p in queue_dir(home).iterdir() if p.name.endswith(".json")]
    except OSError:  # no queue yet (or no home: the verb says so itself)
        return []


def next_run(home: Path, name: str) -> int:
    """The run number a queued job will get: one past its last run."""
    try:
        return state.read_state(state.job_dir(home, name)).run + 1
    except (TrainctlError, FileNotFoundError):
        return 1


def entries(home: Path) -> list[Entry]:
    """Every trusted entry of the home, first queued first (one look, nothing kept)."""
    return HomeView(home).queue()


def waiter_alive(home: Path, name: str) -> bool:
    """Tell whether a waiter holds the entry's lock (it does for as long as it lives)."""
    return state.is_locked(queue_dir(home), f"{name}.lock")


def parse_after(text: str) -> tuple[str, str]:
    """``JOB``, ``JOB:ok``, ``JOB:failed``, ``JOB:any`` -> (job, when); ok by default."""
    job, _, when = text.partition(":")
    when = when or "ok"
    if when not in WHEN:
        raise ConfigError(f"--after {text}: say JOB, JOB:ok, JOB:failed or JOB:any")
    state.check_name(job)
    return job, when


def singleton_key(spec: Spec, by_spec: bool) -> str:
    """What ``--singleton`` keeps to one run at a time: the name, or the spec."""
    if not by_spec:
        return f"name:{spec.name}"
    if spec.spec_file:
        return f"spec:{spec.spec_file}"
    return f"spec:{spec.cwd}\0{chr(0).join(spec.argv)}"


@record()
class HomeView:
    """What the dispatcher knows about the home's jobs, read again only when changed."""

    home: Path
    states: dict[str, tuple[int, JobState | None]] = field(default_factory=dict)
    specs: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    entries: dict[str, tuple[tuple[int, int], Entry | None]] = field(default_factory=dict)
    _leases: dict[str, str] | None = None  # for one round (see fresh)
    _sick: dict[int, str] | None = None  # the unhealthy GPUs, for one round

    def fresh(self) -> None:
        """A new round: the leases and GPU health are read again (each state only if it
        changed)."""
        self._leases = None
        self._sick = None

    def queue(self) -> list[Entry]:
        """The trusted entries, first queued first; each parsed again only if it changed."""
        out = []
        names = queued_names(self.home)
        for gone in set(self.entries) - set(names):
            del self.entries[gone]
        for name in names:
            try:
                s = entry_path(self.home, name).stat()
            except OSError:
                continue
            key = (s.st_ino, s.st_mtime_ns)
            cached = self.entries.get(name)
            if cached is None or cached[0] != key:
                try:
                    cached = (key, read_entry(self.home, name))
                except (StateError, ValueError):
                    cached = (key, None)  # untrusted: never dispatched
                self.entries[name] = cached
            if cached[1] is not None:
                out.append(cached[1])
        return sorted(out, key=lambda e: e.seq)

    def state_of(self, name: str) -> JobState | None:
        path = state.JobDir(state.job_dir(self.home, name)).state
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            self.states.pop(name, None)
            return None
        cached = self.states.get(name)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            st: JobState | None = state.read_state(path.parent)
        except (TrainctlError, OSError):
            st = None  # untrusted: never counted as ended, nor as free
        self.states[name] = (mtime, st)
        return st

    def live(self, name: str) -> bool:
        st = self.state_of(name)
        return st is not None and run_is_live(state.job_dir(self.home, name), st)

    def singleton_of(self, name: str) -> str | None:
        """The spec key of a job's current run (for --singleton by spec)."""
        path = state.JobDir(state.job_dir(self.home, name)).spec
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return None
        cached = self.specs.get(name)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            key: str | None = singleton_key(state.read_spec(path.parent), by_spec=True)
        except (TrainctlError, OSError):
            key = None
        self.specs[name] = (mtime, key)
        return key

    def unhealthy(self) -> dict[int, str]:
        """{GPU index: why it is unhealthy} (gpu/health.py): the queue hands none out."""
        if self._sick is None:
            self._sick = {i: u.line() for i, u in health.unhealthy(self.home).items()}
        return self._sick

    def leases(self) -> dict[str, str]:
        """{GPU uuid: the live job that leases it}."""
        if self._leases is not None:
            return self._leases
        out: dict[str, str] = {}
        for name in state.list_jobs(self.home):
            st = self.state_of(name)
            if st is not None and st.gpus and not st.phase.ended:
                for g in st.gpus:
                    out.setdefault(g.uuid, name)
        self._leases = out
        return out


def known(home: Path, name: str) -> None:
    """Raise JobNotFoundError unless ``name`` is a job or is queued."""
    if entry_path(home, name).exists():
        return
    existing_job(home, name)


def has_live_run(home: Path, name: str) -> bool:
    """Tell whether the job has a run going now (a queued job has none)."""
    jdir = state.job_dir(home, name)
    if not state.JobDir(jdir).has_run:
        return False
    return run_is_live(jdir, state.read_state(jdir))


def run_is_live(jdir: Path, st: JobState) -> bool:
    """The recorded run has not ended, as its backend sees it now (a lost one counts)."""
    return not current_phase(jdir, st).ended


def wait_dispatched(home: Path, name: str, timeout_s: float | None) -> bool:
    """Block while ``name`` is queued. True: it started (or was not queued); False: it
    left the queue without a run (dequeued). TimeoutError when ``timeout_s`` runs out."""
    e = read_entry(home, name)
    if e is None:
        existing_job(home, name)
        return True
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    orphaned_since: float | None = None
    while entry_path(home, name).exists():
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise TimeoutError(f"job {name} still queued after {timeout_s:.3g} s")
        # No waiter (after a reboot, or killed) for a few seconds, longer than a new
        # waiter takes to lock its entry: nothing will ever dispatch it. Say so.
        if waiter_alive(home, name):
            orphaned_since = None
        elif orphaned_since is None:
            orphaned_since = now
        elif now - orphaned_since >= NO_WAITER_S and entry_path(home, name).exists():
            raise JobConflictError(
                f"job {name} is queued but has no waiter: nothing will dispatch it "
                "(`trainctl queue resume` gives it one; `trainctl stop` dequeues it)"
            )
        time.sleep(0.1)
    # (Not a run number read before the loop: the dispatch may have happened between
    # that read and the entry's.)
    return ran_since_queued(home, e)


def ran_since_queued(home: Path, e: Entry) -> bool:
    """Tell whether the entry's job has a run recorded since it was queued: started, or
    ended failed before it ran. Only its dispatch makes one (a plain `start` of a queued
    name is refused), so with the entry gone it was dispatched, not dequeued; with the
    entry still there, a dispatcher was killed between the start and the entry's removal.
    """
    jdir = state.job_dir(home, e.name)
    if not state.JobDir(jdir).has_run:
        return False
    return state.read_state(jdir).started_at >= e.queued_at


def dequeue(home: Path, name: str) -> Entry | None:
    """Take ``name`` out of the queue (its waiter sees it gone and exits); None if it was
    not queued. Nothing of it is started afterwards: dispatch checks under the same lock."""
    if not entry_path(home, name).exists():
        return None  # (a read-only home can still be stopped: nothing is written then)
    with queue_lock(home):
        e = read_entry(home, name)
        if e is None:
            return None
        entry_path(home, name).unlink()
    return e


def record_never_ran(home: Path, e: Entry, spec: Spec, why: str, kind: str) -> None:
    """Record the queued job's run as ended ``failed`` before it started (its cause: why)."""
    jdir = state.check_not_symlink(state.job_dir(home, e.name))
    jdir.mkdir(mode=0o700, exist_ok=True)
    with state.job_lock(jdir, 10.0):
        try:
            prev: JobState | None = state.read_state(jdir)
        except (FileNotFoundError, JobNotFoundError):
            prev = None  # never ran: a fresh record
        # an untrusted state (StateError) is raised, never written over: the dispatcher
        # keeps the entry queued and says why
        if prev is not None and not prev.phase.ended:
            return  # a run is going (started by hand): its record is not ours to replace
        if prev is not None and prev.started_at >= e.queued_at:
            return  # a run began since it was queued (a failed dispatch): its record stands
        now = time.time()
        st = JobState(
            name=e.name,
            run=(prev.run + 1) if prev else 1,
            phase=Phase.FAILED,
            marker=ids.new_marker(),
            started_at=now,
            ended_at=now,
            error=why,
            cause=Cause(kind=kind, summary=why),
            boot_id=state.current_boot_id(),
        )
        state.write_json_atomic(state.JobDir(jdir).spec, spec_to_doc(spec))
        backends.backend(spec.backend).record(jdir, st)
        with contextlib.suppress(OSError):
            events.append_event(jdir, "queue_failed", job=e.name, run=st.run, reason=why)
