"""What a queued job waits for, decided on a view of its home: its singleton, its
``--after`` dependencies, its GPUs (by their leases). Pure reads: the policy is tested
on a temporary home with hand-written state files (tests/queue/test_policy.py)."""

from __future__ import annotations

import json
from pathlib import Path

from trainctl.launcher.gpus import lease_fit
from trainctl.launcher.results import GpuRequest, QueueView
from trainctl.supervisor.errors import ConfigError, TrainctlError
from trainctl.supervisor.model import state
from trainctl.supervisor.model.state import JobState, Phase
from trainctl.supervisor.records import record

from .entries import After, Entry, HomeView, entries, next_run, queue_dir, waiter_alive


def _dep_verdict(h: HomeView, dep: After, queued: set[str]) -> str | None:
    """None: met. ``"wait"``: not yet. Anything else: it can never be met, and why."""
    st = h.state_of(dep.job)
    if st is None or st.run < dep.run or h.live(dep.job):
        return _dep_pending(h, dep, st, queued)
    if st.main is None and st.cause is not None and st.cause.kind == "dependency":
        # it left the queue without running (its own dependency failed): whatever the
        # `when`, nothing ran to be waited for (docs/queue.md)
        return f"after {dep.label()}, but {dep.job} run {st.run} left the queue without running"
    ok = st.phase == Phase.EXITED and (st.exit_code or 0) == 0
    failed = st.phase == Phase.FAILED or (st.phase == Phase.EXITED and bool(st.exit_code))
    if dep.when == "any" or (dep.when == "ok" and ok) or (dep.when == "failed" and failed):
        return None
    how = f"exit {st.exit_code}" if st.exit_code is not None else str(st.phase)
    ended = "was stopped" if st.phase == Phase.STOPPED else f"ended {st.phase} ({how})"
    return f"after {dep.label()}, but {dep.job} run {st.run} {ended}"


def _dep_pending(h: HomeView, dep: After, st: JobState | None, queued: set[str]) -> str:
    """The awaited run has not ended: ``"wait"``, or why it never will."""
    if dep.job in queued or (st is not None and st.run >= dep.run):
        return "wait"  # queued, or running (a restart policy may relaunch it: still going)
    if st is None:
        gone = not state.job_dir(h.home, dep.job).exists()
        # a state being written, or untrusted, is never a verdict
        return f"job {dep.job} was removed" if gone else "wait"
    return f"job {dep.job} left the queue before it ran"


def _singleton_blocker(h: HomeView, e: Entry, earlier: list[Entry]) -> str | None:
    key = e.singleton
    if key is None:
        return None
    for other in earlier:
        if other.singleton == key:
            return f"singleton: queued behind {other.name}"
    if key.startswith("name:"):
        name = key[5:]
        st = h.state_of(name)
        if st is not None and h.live(name):
            return f"singleton: {name} run {st.run} is running"
        return None
    for name in state.list_jobs(h.home):
        if name != e.name and h.singleton_of(name) == key and h.live(name):
            return f"singleton: {name} runs the same spec"
    return None


@record(frozen=True)
class QueueAsk:
    """What `start` asked of the queue."""

    queue: bool = False  # --queue: wait for the GPUs instead of refusing
    after: tuple[str, ...] = ()
    singleton: bool = False
    singleton_spec: bool = False  # --singleton=spec: one run of this spec, any name
    backfill: bool = False

    @property
    def wanted(self) -> bool:
        return self.queue or bool(self.after) or self.singleton or self.singleton_spec


def doomed_by_stop(home: Path, name: str) -> list[str]:
    """The queued jobs that a stop of ``name``'s run dooms (they end failed, cause
    ``dependency``): those waiting with ``--after NAME:ok`` (or ``:failed``: a stopped run
    did neither), each as ``next (after NAME:ok)``. Asked after the stop too, it also
    names those already failed for the run (the dispatcher may be quicker than the
    verb: a plain stop's request goes out before the verb is loaded)."""
    out = [
        f"{e.name} (after {dep.label()})"
        for e in entries(home)
        for dep in e.after
        if dep.job == name and dep.when in ("ok", "failed")
    ]
    try:
        since = state.read_state(state.job_dir(home, name)).started_at
    except (TrainctlError, OSError):
        return out
    h = HomeView(home)
    for other in state.list_jobs(home):
        st = h.state_of(other)
        cause = st.cause if st is not None else None
        if st is None or cause is None or cause.kind != "dependency":
            continue
        label = cause.summary.split(", but ", 1)[0].removeprefix("after ")
        line = f"{other} (after {label})"
        if label.split(":", 1)[0] == name and (st.ended_at or 0) >= since and line not in out:
            out.append(line)
    return out


def check_ask(ask: QueueAsk, gpus: GpuRequest | None) -> None:
    """Bad combinations: one line each, before anything is touched."""
    if ask.queue and gpus is None and not ask.after:
        raise ConfigError("--queue waits for GPUs or for other jobs: give --gpus or --after")
    if ask.backfill and not ask.wanted:
        raise ConfigError("--backfill only makes sense with --queue, --after or --singleton")


@record()
class Blocked:
    waits: list[str]
    failed: str | None = None  # a dependency that can never be met
    gpu_wait: bool = False  # waits only for GPUs (first in, first out applies)


def blockers(
    h: HomeView, e: Entry, earlier: list[Entry], queued: set[str], *, gpus_too: bool = True
) -> Blocked:
    """What ``e`` waits for now, cheaply (the GPUs by their leases only)."""
    waits: list[str] = []
    single = _singleton_blocker(h, e, [x for x in earlier if x.seq < e.seq])
    if single:
        waits.append(single)
    for dep in e.after:
        verdict = _dep_verdict(h, dep, queued)
        if verdict == "wait":
            waits.append(f"after {dep.label()}")
        elif verdict is not None:
            return Blocked(waits, failed=verdict)
    if waits or not gpus_too or e.gpus is None:
        return Blocked(waits)
    held = lease_fit(e.gpus, h.leases(), share=e.share, sick=h.unhealthy())
    if held:
        return Blocked([held], gpu_wait=True)
    return Blocked([])


def queue_view(
    home: Path, name: str, e: Entry, all_entries: list[Entry] | None = None
) -> QueueView:
    """What `status` shows of a queued job: its position and what it waits for."""
    es = entries(home) if all_entries is None else all_entries
    queued = {x.name for x in es}
    h = HomeView(home)
    blocked = blockers(h, e, es, queued)
    waits = blocked.waits if blocked.failed is None else [blocked.failed]
    said = _said(home).get(name)
    if said and (blocked.gpu_wait or not waits):
        waits = [said]  # the dispatcher's own look at the GPUs (foreign use, say)
    return QueueView(
        position=1 + sum(1 for x in es if x.seq < e.seq),
        queued_at=e.queued_at,
        waits_for=waits,
        gpus=e.gpus,
        after=[d.label() for d in e.after],
        singleton=None if e.singleton is None else e.singleton.split(":", 1)[0],
        backfill=e.backfill,
        waiter_alive=waiter_alive(home, name),
    )


def _said(home: Path) -> dict[str, str]:
    try:
        doc = json.loads((queue_dir(home) / "waits.said").read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


@record(frozen=True)
class Queued:
    """A job's queue entry, its place in the queue, and the run it will start."""

    entry: Entry
    view: QueueView
    next_run: int


def queued_of(home: Path, e: Entry) -> Queued:
    """What `status`, `list` and `queue` show of a queued entry."""
    return Queued(e, queue_view(home, e.name, e), next_run(home, e.name))
