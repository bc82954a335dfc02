"""Queueing a start, and dispatching the queue: the half of the queue that starts things.

entries.py and policy.py hold the queue itself (entries, what each waits for, the views
`status` reads) and import nothing heavy; this module starts jobs (ops/start.py) and
waiters (subprocess), so only `start`, `queue` and the dispatcher load it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from trainctl.launcher import backends
from trainctl.launcher.config import Config, load_config
from trainctl.launcher.gpus import check_request
from trainctl.launcher.ops.start import refuse_if_live, start_job
from trainctl.launcher.results import GpuRequest, Queued, StartResult
from trainctl.supervisor import ids
from trainctl.supervisor.errors import (
    ConfigError,
    GpuError,
    JobConflictError,
    JobNotFoundError,
    SpawnError,
    StateError,
    TrainctlError,
)
from trainctl.supervisor.linux import systemd
from trainctl.supervisor.model import events, state
from trainctl.supervisor.model.spec import Spec, spec_from_doc, spec_to_doc
from trainctl.supervisor.records import asdict

from .entries import (
    GPU_POLL_S,
    TICK_S,
    After,
    Entry,
    HomeView,
    entries,
    entry_path,
    next_run,
    parse_after,
    queue_dir,
    queue_lock,
    ran_since_queued,
    read_entry,
    record_never_ran,
    singleton_key,
    waiter_alive,
)
from .policy import QueueAsk, blockers, check_ask


def _targets(
    home: Path, name: str, after: tuple[str, ...], queued: dict[str, Entry]
) -> list[After]:
    out = []
    for text in after:
        job, when = parse_after(text)
        if job == name:
            raise ConfigError(
                f"--after {text}: a job cannot wait for itself, that is a dependency cycle "
                "(--singleton runs one at a time)"
            )
        if job in queued:
            out.append(After(job, next_run(home, job), when))
            continue
        jdir = state.job_dir(home, job)
        try:
            st = state.read_state(jdir)
        except (FileNotFoundError, JobNotFoundError):
            raise ConfigError(f"--after {text}: no job named {job!r} (in {home})") from None
        out.append(After(job, st.run, when))
    _refuse_cycle(name, out, queued, home)
    return out


def _refuse_cycle(name: str, deps: list[After], queued: dict[str, Entry], home: Path) -> None:
    """A queued run waiting, through other queued runs, for the run being queued.

    An edge is a wait for a run that has not started yet (a queued one): waiting for a
    job's current run is never part of a cycle, since that run ends on its own.
    """
    nxt = {job: next_run(home, job) for job in {*queued, name}}
    stack = [(d.job, [name, d.job]) for d in deps if d.run >= nxt.get(d.job, 1 << 62)]
    seen: set[str] = set()
    while stack:
        job, path = stack.pop()
        if job == name:
            raise ConfigError(f"--after: that makes a dependency cycle: {' -> '.join(path)}")
        if job in seen or job not in queued:
            continue
        seen.add(job)
        stack += [
            (d.job, [*path, d.job])
            for d in queued[job].after
            if d.run >= nxt.get(d.job, next_run(home, d.job))
        ]


def start_or_queue(
    home: Path,
    spec: Spec,
    cfg: Config,
    request: GpuRequest | None,
    ask: QueueAsk,
    *,
    from_scratch: bool = False,
) -> StartResult | Queued:
    """Start now, or, with --queue/--after/--singleton, queue the job when it must wait.

    Only for a backend that trainctl's queue serves (``queues_here``); one with its own
    scheduler refuses the queue flags.
    """
    check_ask(ask, request)
    here = backends.backend(spec.backend).queues_here
    if here:
        ensure_waiters(home)  # after a reboot, the first start resumes the queue
    if not ask.wanted:
        if read_entry(home, spec.name) is not None:
            raise JobConflictError(
                f"job {spec.name} is already queued; `trainctl stop {spec.name}` dequeues it"
            )
        return start_job(home, spec, cfg, request, from_scratch=from_scratch)
    if from_scratch:
        raise ConfigError(
            "--from-scratch starts now: it cannot wait in the queue (start it once the "
            "GPUs are free, or queue it without --from-scratch)"
        )
    if not here:
        raise ConfigError(
            "--queue, --after and --singleton are for local jobs (Slurm queues its own)"
        )
    if request is not None:
        check_request(str(request.spec))
    return enqueue_or_start(home, spec, cfg, request, ask)


def enqueue_or_start(
    home: Path, spec: Spec, cfg: Config, gpus: GpuRequest | None, ask: QueueAsk
) -> StartResult | Queued:
    """Start now when nothing stands in the way, else queue the start (and its waiter)."""
    with queue_lock(home):
        queued = {e.name: e for e in entries(home)}
        if spec.name in queued:
            raise JobConflictError(
                f"job {spec.name} is already queued; `trainctl stop {spec.name}` dequeues it"
            )
        deps = _targets(home, spec.name, ask.after, queued)
        if not ask.singleton:
            _refuse_live_name(home, spec.name)
        e = _entry(spec, gpus, ask, deps)
        # Without --queue the GPUs are not waited for: `start` refuses busy ones, as ever.
        h = HomeView(home)
        blocked = blockers(h, e, list(queued.values()), set(queued), gpus_too=ask.queue)
        if blocked.failed is not None:
            raise ConfigError(f"--after: {blocked.failed}; nothing queued")
        ahead = [
            q.name
            for q in queued.values()
            if ask.queue
            and q.gpus is not None
            and not blockers(h, q, [], set(queued), gpus_too=False).waits  # GPUs are next
        ]
        if not blocked.waits and (not ahead or ask.backfill or gpus is None):
            if gpus is None or not ask.queue:
                return start_job(home, spec, cfg, gpus)
            try:
                return start_job(home, spec, cfg, gpus)  # free now: no need to queue
            except GpuError as err:
                blocked.waits.append(str(err))  # busy after all (foreign use): say how
        if not blocked.waits and ahead and not ask.backfill and gpus is not None:
            blocked.waits.append(f"first in, first out: behind {ahead[0]}")
        pid = _write_entry(home, e, spec)
        position = 1 + sum(1 for q in queued.values() if q.seq < e.seq)
        return Queued(spec.name, position, blocked.waits or ["GPUs"], pid)


def _entry(spec: Spec, gpus: GpuRequest | None, ask: QueueAsk, deps: list[After]) -> Entry:
    """The queue entry of a start: its spec, GPUs, dependencies and singleton key."""
    key = (
        singleton_key(spec, by_spec=ask.singleton_spec)
        if ask.singleton or ask.singleton_spec
        else None
    )
    return Entry(
        name=spec.name,
        token=ids.new_marker(),
        seq=time.time_ns(),
        queued_at=time.time(),
        spec=spec_to_doc(spec),
        gpus=None if gpus is None else str(gpus.spec),
        share=bool(gpus and gpus.share),
        force=bool(gpus and gpus.force),
        after=deps,
        singleton=key,
        backfill=ask.backfill,
    )


def _write_entry(home: Path, e: Entry, spec: Spec) -> int | None:
    """Write the entry and start its waiter (its pid); on a failure, nothing is queued."""
    path = entry_path(home, spec.name)
    try:
        state.write_json_atomic(path, asdict(e))
        return _spawn_waiter(home, e, spec)
    except OSError as err:  # a full or read-only disk: the old state stays as it was
        with contextlib.suppress(OSError):
            path.unlink()
        raise SpawnError(
            f"cannot queue {spec.name}: {err.strerror or err} ({path}); nothing queued"
        ) from None


def _refuse_live_name(home: Path, name: str) -> None:
    """A job of that name runs now: queueing another run of it needs --singleton."""
    jdir = state.job_dir(home, name)
    if not state.JobDir(jdir).has_run:
        return
    prev = state.read_state(jdir)
    try:
        refuse_if_live(jdir, prev)
    except JobConflictError as e:
        raise JobConflictError(f"{e} (or queue the next run behind it with --singleton)") from None


def _spawn_waiter(home: Path, e: Entry, spec: Spec) -> int | None:
    """Start the entry's waiter, detached (in a systemd scope where there is one, so that
    it outlives the login); its pid (it holds the entry's lock for as long as it lives)."""
    sd = systemd.detect() if spec.isolation.systemd else None
    unit = f"trainctl-{e.name}-queued-{e.token[:8]}.scope"
    argv = [
        *(systemd.scope_argv(sd, unit, kill_signal="SIGTERM") if sd is not None else []),
        sys.executable,
        "-m",
        "trainctl.launcher.waiter",
        str(home),
        e.name,
        e.token,
    ]
    log = queue_dir(home) / f"{e.name}.log"
    with os.fdopen(state.open_append(log), "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
            cwd="/",
        )
    proc.returncode = 0  # it outlives us on purpose; init (or a subreaper) reaps it
    return proc.pid


def ensure_waiters(home: Path) -> list[str]:
    """Give every entry without a live waiter a new one (after a reboot, or a waiter that
    was killed): `trainctl queue resume`, and every `start`, `status`, `list` and `wait`."""
    started = []
    for e in entries(home):
        if waiter_alive(home, e.name):
            continue
        try:
            spec = spec_from_doc(e.spec, f"queued job {e.name}")
        except StateError:
            continue
        _spawn_waiter(home, e, spec)
        started.append(e.name)
    return started


# ---------------------------------------------------------------- the dispatcher


def dispatch_loop(home: Path, name: str, token: str) -> int:
    """Be the home's dispatcher for as long as our own entry is queued."""
    d = _Dispatcher(home, load_config())
    while True:
        _reap()
        d.h.fresh()
        es = d.h.queue()
        if not any(e.name == name and e.token == token for e in es):
            return 0
        d.round(es)
        time.sleep(TICK_S)


def _reap() -> None:
    """Supervisors this process started are its children until they exit: reap them."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


class _Dispatcher:
    def __init__(self, home: Path, cfg: Config) -> None:
        self.home, self.cfg = home, cfg
        self.h = HomeView(home)
        self.last_gpu_look = 0.0
        self.said: dict[str, str] = {}

    def round(self, es: list[Entry]) -> None:
        """One look at the whole queue, first queued first."""
        queued = {e.name for e in es}
        said: dict[str, str] = {}
        first_gpu_waiter: str | None = None  # the first job that waits for GPUs
        for e in es:
            try:
                waiting = self._look(e, es, queued, said, first_gpu_waiter)
            except (TrainctlError, OSError) as err:  # an untrusted spec or state; a full disk
                said[e.name] = f"cannot be dispatched: {err}"  # and it stays queued
                continue
            if waiting and e.gpus is not None:
                first_gpu_waiter = first_gpu_waiter or e.name
        if said != self.said:
            self.said = said
            with contextlib.suppress(OSError):
                state.write_json_atomic(queue_dir(self.home) / "waits.said", said, durable=False)

    def _look(
        self, e: Entry, es: list[Entry], queued: set[str], said: dict[str, str], ahead: str | None
    ) -> bool:
        """Dispatch ``e`` if it may start now; True when it waits for GPUs (FIFO)."""
        b = blockers(self.h, e, es, queued)
        if b.failed is not None:
            self._fail(e, b.failed)
            return False
        if b.waits and not b.gpu_wait:
            return False  # its turn has not come: it holds no one up
        if e.gpus is not None and ahead is not None and not e.backfill:
            said[e.name] = f"first in, first out: behind {ahead}"
            return True
        if b.gpu_wait:
            return True
        if e.gpus is not None:
            now = time.monotonic()
            if now - self.last_gpu_look < GPU_POLL_S:
                if e.name in self.said:
                    said[e.name] = self.said[e.name]  # what the last look found still holds
                return True  # the GPUs were read less than a second ago
            self.last_gpu_look = now
        busy = self._dispatch(e)
        if busy is not None:
            said[e.name] = busy
        return busy is not None

    def _dispatch(self, e: Entry) -> str | None:
        """Start the entry's job; the GPUs' refusal when they were not free after all."""
        with queue_lock(self.home):
            cur = read_entry(self.home, e.name)
            if cur is None or cur.token != e.token:
                return None  # dequeued meanwhile: nothing is started
            if ran_since_queued(self.home, e):  # started by a dispatcher that died after
                entry_path(self.home, e.name).unlink()
                return None
            spec = spec_from_doc(e.spec, f"queued job {e.name}")
            req = None if e.gpus is None else GpuRequest(e.gpus, share=e.share, force=e.force)
            try:
                res = start_job(self.home, spec, self.cfg, req)
            except GpuError as err:
                return str(err)
            except JobConflictError as err:
                return str(err)  # started by hand meanwhile, or busy: look again later
            except StateError:
                raise  # an untrusted state.json: never written over; the entry stays queued
            except TrainctlError as err:
                record_never_ran(self.home, e, spec, f"dispatch failed: {err}", "start-failed")
                entry_path(self.home, e.name).unlink()
                return None
            entry_path(self.home, e.name).unlink()
        with contextlib.suppress(OSError, TrainctlError):
            events.append_event(
                state.job_dir(self.home, e.name),
                events.Dispatched(e.name, res.run, round(time.time() - e.queued_at, 3), res.gpus),
            )
        return None

    def _fail(self, e: Entry, why: str) -> None:
        """A dependency that can never be met: the job ends ``failed``, with that cause."""
        with queue_lock(self.home):
            cur = read_entry(self.home, e.name)
            if cur is None or cur.token != e.token:
                return
            spec = spec_from_doc(e.spec, f"queued job {e.name}")
            record_never_ran(self.home, e, spec, why, "dependency")  # first: `wait` reads it
            entry_path(self.home, e.name).unlink()
