"""The supervisor's watchers: what they look at while the run lives, and what they send.

Member snapshots, escapes handed to a foreign tmux, code drift, GPU faults and memory,
the stall watchdog, OOM kills, the checkpoint's age and the progress samples. Watchers
only look: what they see goes to the lifecycle owner as an ``Observed`` event (or a
``Stalled`` one), and the owner records it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel

from trainctl.supervisor.gpu.watch import GpuWatch, hhmmss
from trainctl.supervisor.gpu.xid import Fault
from trainctl.supervisor.model.checkpoints import newest_mtime
from trainctl.supervisor.model.reports import Cause
from trainctl.supervisor.model.state import MemberSnap, ProcRef, log_path, mtime, progress_path
from trainctl.supervisor.model.tail import Mark, read_appended
from trainctl.supervisor.records import replace
from trainctl.supervisor.tree.proctree import Member, alive, scan, scan_light
from trainctl.supervisor.tree.stacks import stacks_writer
from trainctl.supervisor.watch import guard, runsteps, trial
from trainctl.supervisor.watch.drift import drift, fingerprint
from trainctl.supervisor.watch.logs import rotate_if_big
from trainctl.supervisor.watch.logtimes import STAMP_S, LogStamper
from trainctl.supervisor.watch.stall import CheckpointWatch, StallLearner
from trainctl.supervisor.watch.steplines import (
    STEP_FIRST_S,
    STEP_LOOK_S,
    STEP_QUIET_S,
    StepStamper,
)

from .errors import GpuError, TrainctlError
from .gpu import health, xid
from .life import lifecycle as lc
from .linux import memory, procfs
from .model import events
from .tree import handoff
from .watch import logs, samples

if TYPE_CHECKING:  # the view it is given, as a type: the watchers sit below the run's core
    from .core import RunView

# How often the supervisor walks every /proc entry (and environ) for members that left
# both the cgroup and the tree, e.g. a process moved out of the cgroup by root.
FULL_SCAN_S = 60.0


# How often, at most, the checkpoint's age is looked at (on_checkpoint_stale).
STALE_CHECK_S = 30.0


EARLY_SNAPSHOT_S = 0.25  # the first member snapshot after a start (then doubling)


XID_WAIT_S = 60.0  # one Xid wait in the driver (a daemon thread: exit does not wait)


DUE_SLACK_S = 0.02  # a stall deadline's look comes this long after it passes


GUARD_LOOK_S = 0.1  # the checkpoint guard's look for the run's first step (watch/guard.py)


GPU_SAMPLE_S = 30.0  # how often the leased GPUs' memory and ECC counts are read
GPU_RETRY_S = 5.0  # the first retry of a GPU watch whose driver could not be read


class Watchers:
    """The looks taken while the run lives (the snapshot loop drives most of them).

    Given a read-only view of the run and how to report (``RunView``: ``send``,
    ``observe``), plus the control server's rebind: they change nothing of the run's state.
    What they keep is their own: the drift mark, the GPU watch, the log's stamps, the
    stall learner, the sampled steps.
    """

    def __init__(self, run: RunView, *, rebind: Callable[[str], None]) -> None:
        self.run = run
        self._rebind = rebind
        self.drift_mark: tuple[int, ...] = ()
        self.drift_at = 0.0
        last_step = self.last_step
        self.gpus = GpuWatcher(run)  # the run's GPUs: memory, Xid events, ECC
        self.stall = StallWatcher(run, last_step, self.stepped_in)  # no progress, no output
        self.oom = OomWatcher(run)  # OOM kills in the run's memory group
        self.ckpt_age = CheckpointAgeWatcher(run, last_step)  # on_checkpoint_stale
        self.verdicts = VerdictWatcher(run)  # the checkpoint guard, a deploy's trial
        self.stamper = LogStamper(log_path(run.jdir, run.state.run))  # when the log grew
        self.sampled_step: tuple[int, float] | None = None  # (run, step): for the ETA, hooks
        self._stamper: StepStamper | None = None  # untimed progress lines, timed (steplines)
        self._stamper_run = 0
        self._exe_checked: set[ProcRef] = set()  # members whose executable was read

    def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Start every watcher's loop in the supervisor's task group."""
        tg.start_soon(self._snapshots)
        tg.start_soon(self.gpus.follow)
        tg.start_soon(self._watch_log)
        tg.start_soon(self._record_samples)
        tg.start_soon(self._stamp_steps_often)
        g = self.run.state.guard
        if g is not None and g.floor is not None:
            tg.start_soon(self.verdicts.guard_first_step)
        if self.run.state.trial is not None:
            tg.start_soon(self.verdicts.judge_trial)

    @property
    def gpu(self) -> GpuWatch | None:
        """The run's GPU watch, once open."""
        return self.gpus.watch

    def oom_victims(self) -> list[memory.Victim]:
        """The kernel log's OOM kills of this run (the cause analysis names one)."""
        return self.oom.victims()

    def last_step(self) -> float | None:
        """The newest progress step sampled from the log, if any (hooks carry it)."""
        return self.sampled_step[1] if self.sampled_step else None

    def stepped_in(self, run: int) -> bool:
        """Whether a step of run ``run`` was sampled (its start is over)."""
        return self.sampled_step is not None and self.sampled_step[0] == run

    async def _snapshots(self) -> None:
        """Keep state.json's member snapshot current, at a cost that follows the job's size.

        Each tick reads the job's own processes only (cgroup.procs, or the tree below us:
        see proctree.scan_light); the full scan of every /proc entry and environ, which
        costs as much as the host has processes, runs every FULL_SCAN_S as a safety net.
        """
        last_full = time.monotonic()
        # The first ticks come early (0.25, 0.5, 1 s, … up to the interval): a helper
        # that escapes at start-up (setsid, double fork, scrubbed environment) is on
        # record within a moment, so a supervisor that dies soon after does not take
        # the only knowledge of it along.
        pause = min(EARLY_SNAPSHOT_S, self.run.spec.watch.snapshot_interval_s)
        while True:
            await anyio.sleep(pause)
            pause = min(pause * 2, self.run.spec.watch.snapshot_interval_s)
            self.run.reap()
            self._rebind("the socket file was gone")
            if self.run.stage is not lc.Stage.RUNNING:
                continue
            self.oom.look()
            await self.ckpt_age.look()
            await self._check_drift()
            full = time.monotonic() - last_full >= FULL_SCAN_S
            if full:
                last_full = time.monotonic()
            members = await self._scan_members(full)
            live = {pid: m for pid, m in members.items() if m.alive}
            await self._look_for_handoffs(live)
            # Rewrite (and fsync) only when the member set changed: a quiet job costs
            # nothing, not even a read of each member's command line.
            if {m.ref for m in live.values()} != {
                ProcRef(s.pid, s.start_ticks) for s in self.run.state.members
            } and self.run.stage is lc.Stage.RUNNING:
                snap = tuple(
                    MemberSnap.of(m.stat, tuple(sorted(m.nets))) for _, m in sorted(live.items())
                )
                self.run.observe(members=snap, snapshot_at=time.time())

    async def _scan_members(self, full: bool) -> dict[int, Member]:
        """The job's members now: the light scan (the roster's refresh, or the tree below
        us), or every /proc entry when ``full``."""
        roster = self.run.roster()
        if full:
            if roster is not None:  # kept current for a stop, whichever scan runs
                await anyio.to_thread.run_sync(roster.refresh)
            return await anyio.to_thread.run_sync(scan, self.run.target())
        light = (
            roster.refresh
            if roster is not None
            else functools.partial(scan_light, self.run.target())
        )
        members = await anyio.to_thread.run_sync(light)
        self._keep_known(members)
        return members

    async def _look_for_handoffs(self, live: dict[int, Member]) -> None:
        """Record a member that is a tmux client of a server outside the job.

        Each member's executable is read once, when it is first seen (one readlink); the
        sockets are looked at only when a member runs tmux.
        """
        refs = {m.ref for m in live.values()}
        new = refs - self._exe_checked
        self._exe_checked = refs
        if not any(handoff.is_tmux(r.pid) for r in new):
            return
        found = await anyio.to_thread.run_sync(handoff.find_handoffs, set(live))
        lines = [h.line() for h in found if h.line() not in self.run.state.handed_off]
        if lines:
            for line in lines:
                self.run.log.warning("handed_off", what=line)
            self.run.observe(add=(("handed_off", tuple(lines), 10),))

    async def _check_drift(self) -> None:
        """Recompute the code drift when git or the entry script changed, else once a minute.

        `status` then reads the result from state.json instead of running `git diff` on
        every call, so its cost does not grow with the repository.
        """
        if not self.run.state.code:
            return
        now = time.monotonic()
        mark = await anyio.to_thread.run_sync(fingerprint, self.run.spec)
        if mark == self.drift_mark and now - self.drift_at < FULL_SCAN_S:
            return
        self.drift_mark, self.drift_at = mark, now
        changes = tuple(await anyio.to_thread.run_sync(drift, self.run.state.code, self.run.spec))
        if changes != self.run.state.code_drift or self.run.state.drift_checked_at is None:
            self.run.observe(code_drift=changes, drift_checked_at=time.time())

    def _keep_known(self, members: dict[int, Member]) -> None:
        """Between full scans, keep the snapshot's members that still live (same start time).

        The light scan cannot see a member that left both the cgroup and our tree (only
        the marker finds it); it must not drop out of the snapshot until the next full scan.
        """
        for snap in self.run.state.members:
            if snap.pid in members:
                continue
            st = procfs.read_stat(snap.pid)
            if st is not None and st.start_ticks == snap.start_ticks and st.state != "Z":
                members[snap.pid] = Member(st, set(snap.nets))

    async def _record_samples(self) -> None:
        """One sample of the run every sample_interval_s, for the charts (samples.py)."""
        book = samples.SampleLog(log_path(self.run.jdir, self.run.state.run))
        meter = samples.CpuMeter()
        while True:
            await anyio.sleep(self.run.spec.watch.sample_interval_s)
            if self.run.stage is not lc.Stage.RUNNING:
                continue
            src = self._sample_sources()
            sample = await anyio.to_thread.run_sync(samples.look, src, meter, time.time())
            book.append(sample)

    def _sample_sources(self) -> samples.Sources:
        st, gpu = self.run.state, self.gpu
        labels = {g.uuid: g.label for g in st.gpus}
        members = {(m.pid, m.start_ticks) for m in st.members}
        if st.main is not None:  # before the first member snapshot too
            members.add((st.main.pid, st.main.start_ticks))
        # dict() copies in one step: the GPU watch's thread may be writing these meanwhile
        memory = dict(gpu.memory) if gpu else {}
        utilization = dict(gpu.utilization) if gpu else {}
        return samples.Sources(
            members=tuple(sorted(members)),
            memory_group=self.run.memory_group(),
            gpu_mem={labels[u]: b for u, b in memory.items() if u in labels},
            gpu_util={labels[u]: p for u, p in utilization.items() if u in labels},
            progress_file=progress_path(self.run.jdir, st.run),
            log=log_path(self.run.jdir, st.run),
            progress_regex=self.run.spec.watch.progress_regex,
        )

    async def _watch_log(self) -> None:
        """The log's own looks, on their own clock: when it grew (logtimes.py, for `logs
        --timestamps` and `--since`), and its size cap (logs.py). Off the snapshot loop: a
        job writing 15 MiB/s passes an 8 MiB cap in half a second, and a snapshot tick
        (3 s, longer under a busy drift or checkpoint look) let the log reach many times it.
        """
        pace = logs.Pace(self.run.spec.logs.max_bytes, STAMP_S)
        while True:
            self.stamper.step()
            # the stall watchdog looks here too: a learned deadline is seconds, not minutes
            if self.stall.check():
                await self.stall.write_stacks()
            size = await self._bound_log()
            due = self.stall.due_in()  # a deadline passing before the next look: look then
            look = pace.next_look(size, time.monotonic())
            await anyio.sleep(look if due is None else min(look, due + DUE_SLACK_S))

    async def _bound_log(self) -> int:
        """Rotate the log past its cap (the copy in a thread); return its size now."""
        log = log_path(self.run.jdir, self.run.state.run)
        try:
            size = await anyio.to_thread.run_sync(
                rotate_if_big, log, self.run.spec.logs.max_bytes, self.run.spec.logs.keep
            )
        except OSError as e:
            self.run.log.warning("log_rotation_failed", error=e.strerror)
            return 0
        if size:
            self.run.log.info("log_rotated", bytes=size, keep=self.run.spec.logs.keep)
            return 0
        return logs.size_of(log)

    async def _stamp_steps_often(self) -> None:
        """The stamper's looks while the run lives: every STEP_LOOK_S until its first step
        (for STEP_FIRST_S at most), then every STEP_QUIET_S (steplines.py says why)."""
        began = time.monotonic()
        while self.run.stage is lc.Stage.RUNNING:
            self.stamp_steps()
            waiting = self.sampled_step is None and time.monotonic() - began < STEP_FIRST_S
            await anyio.sleep(STEP_LOOK_S if waiting else STEP_QUIET_S)

    def stamp_steps(self) -> None:
        """Time the run's untimed progress lines by this look (steplines.py): the ETA,
        hooks, goodput and a checkpoint's step read them (also once the run ended: the
        lines written just before its end)."""
        run = self.run.state.run
        if self._stamper is None or self._stamper_run != run:
            regex = self.run.spec.watch.progress_regex
            self._stamper, self._stamper_run = StepStamper(self.run.jdir, run, regex), run
        step = self._stamper.look(time.time())
        if step is not None:
            self.sampled_step = (run, step)


class GpuWatcher:
    """The run's GPUs for its whole life: memory, Xid events, ECC errors; a reset- or
    reboot-class fault stops the run (GpuLost), a fault on another GPU is kept for the box."""

    def __init__(self, run: RunView) -> None:
        self.run = run
        self.watch: GpuWatch | None = None  # open once the run started (see run)

    async def follow(self) -> None:
        """Look at the run's GPUs for its whole life: memory, Xid events, ECC errors.

        NVML is opened once, in a thread, after the run started: never on the stop path.
        The Xid wait blocks in the driver, in a daemon thread of its own (an anyio worker
        would hold up the supervisor's exit until its wait returns); memory and ECC are
        read every ``GPU_SAMPLE_S``. At rest that is one wake-up a minute.
        """
        if not self.run.state.gpus:
            return
        watch = self.watch = await self._open_gpu_watch()
        info = watch.backend.driver()
        self.run.log.info(
            "gpu_watch",
            gpus=[g.label for g in self.run.state.gpus],
            xid_events=watch.xids is not None,
            driver=info.driver_version,
        )
        if watch.xids is not None:
            token = anyio.lowlevel.current_token()
            threading.Thread(
                target=self._wait_xids, args=(watch, token), name="xid-watch", daemon=True
            ).start()
        failing = False
        while True:
            await anyio.sleep(GPU_SAMPLE_S)
            try:
                faults = await anyio.to_thread.run_sync(watch.sample, abandon_on_cancel=True)
            except GpuError as e:
                self.run.log.warning("gpu_watch_failed", error=str(e))
                if not failing:  # said once: what is known of the GPUs from here on
                    line = f"GPU watch: the driver stopped answering at {hhmmss()}: {e}"
                    self.run.observe(add=(("gpu_faults", (line,), 20),))
                failing = True
                continue
            failing = False
            for fault in faults:
                self._gpu_fault(fault)

    async def _open_gpu_watch(self) -> GpuWatch:
        """Open the run's GPU watch. While the driver cannot be read (NVML's init fails:
        a GPU lost, a library mismatch), the run's GPU faults go unseen: that is said once
        in its GPU faults (`status` shows it; a failed end's cause leads with it, the one
        thing known), and the open is tried again, 5 s first, then less often."""
        blind, wait = None, GPU_RETRY_S
        while True:
            try:
                watch = await anyio.to_thread.run_sync(GpuWatch.open, self.run.state.gpus)
            except GpuError as e:
                if blind is None:
                    self.run.log.warning("gpu_watch_unavailable", error=str(e))
                    blind = (
                        f"GPU watch blind since {hhmmss()}: {e}; this run's GPU faults go unseen"
                    )
                    self.run.observe(add=(("gpu_faults", (blind,), 20),))
                await anyio.sleep(wait)
                wait = min(wait * 2, GPU_SAMPLE_S)
                continue
            if blind is not None:  # it sees again: nothing else adds faults before this
                kept = tuple(f for f in self.run.state.gpu_faults if f != blind)
                self.run.observe(gpu_faults=kept)
            return watch

    def _wait_xids(self, watch: GpuWatch, token: anyio.lowlevel.EventLoopToken) -> None:
        """The Xid wait (a daemon thread): each fault is handed to the event loop."""
        while True:
            try:
                faults: list[str | Fault] = [*watch.wait_xid(XID_WAIT_S)]
            except GpuError as e:
                faults = [f"the Xid watch stopped: {e}"]
                watch.xids = None
            for fault in faults:
                try:
                    anyio.from_thread.run_sync(self._gpu_fault, fault, token=token)
                except RuntimeError:  # the loop has ended: the supervisor is exiting
                    return
            if watch.xids is None:
                return

    def _gpu_fault(self, fault: str | Fault) -> None:
        """Record a GPU fault of the run (events, state; the cause if the run dies of it),
        classed by NVIDIA's action (gpu/xid.py). A reset- or reboot-class one marks the GPU
        unhealthy in the home (no run is handed it) and stops the run: its healthy ranks
        get their grace to checkpoint; the hung ones are ended at grace end, stacks first."""
        if isinstance(fault, str):
            self.run.log.warning("gpu_fault", fault=fault)
            self.run.observe(add=(("gpu_faults", (fault,), 20),))
            return
        home = self.run.jdir.parent.parent
        if fault.gpu not in {g.index for g in self.run.state.gpus}:
            self._box_fault(home, fault)
            return
        with contextlib.suppress(OSError, TrainctlError):
            health.note(home, fault, self.run.spec.name)
        line = fault.line(hhmmss())
        action = xid.ACTION_WORDS[fault.klass]
        self.run.log.warning("gpu_fault", fault=line, gpu=fault.gpu, xid=fault.xid,
                         klass=fault.klass, action=action)  # fmt: skip
        self.run.observe(add=(("gpu_faults", (line,), 20),))
        if fault.unhealthy:
            self._gpu_unhealthy(home, fault, action)

    def _box_fault(self, home: Path, fault: Fault) -> None:
        """A fault on a GPU this run does not hold: kept for `trainctl gpus` (and, reset-
        or reboot-class, marked unhealthy so no run is handed the GPU); no run is touched
        (the run holding it, if any, acts on it through its own watch)."""
        with contextlib.suppress(OSError, TrainctlError):
            holder = health.holder_of(home, fault.gpu)  # another run's: its own watch acts
            self.run.log.info("gpu_fault_elsewhere", gpu=fault.gpu, xid=fault.xid,
                              klass=fault.klass, held_by=holder)  # fmt: skip
            health.note(home, fault, holder)
            if fault.unhealthy:
                health.record(home, fault, None, holder)

    def _gpu_unhealthy(self, home: Path, fault: Fault, action: str) -> None:
        """Mark the GPU unhealthy in the home; stop the run that cannot go on on it (the
        lifecycle restarts it on the healthy GPUs left when ``min_gpus`` allows)."""
        leases = self.run.state.gpus
        uuid = next((g.uuid for g in leases if g.index == fault.gpu), None)
        with contextlib.suppress(OSError, TrainctlError):
            health.record(home, fault, uuid, self.run.spec.name)
        if self.run.stage is not lc.Stage.RUNNING:
            return
        try:  # every GPU of the run marked so far (two may fall off the bus together)
            keep, _ = health.split_leases(home, leases)
        except (OSError, TrainctlError):
            keep = ()
        keep = tuple(g for g in keep if g.index != fault.gpu)
        labels = tuple(g.label for g in keep)
        self.run.send(lc.GpuLost(fault.gpu, fault.xid, action, labels, len(leases)))


def _has_lines(path: Path) -> bool:
    try:
        return os.stat(path).st_size > 0
    except OSError:
        return False


class StallWatcher:
    """The stall watchdog: no progress and no output for the deadline (a fixed one, or
    the one learned from the run's own pace: stall.py)."""

    def __init__(
        self,
        run: RunView,
        last_step: Callable[[], float | None],
        stepped_in: Callable[[int], bool],
    ) -> None:
        self.run, self.last_step, self.stepped_in = run, last_step, stepped_in
        self._stall_learner = StallLearner()  # stall_timeout = "auto" (stall.py)
        self._reports_steps = False  # a run of the job wrote a progress file
        self._ckpt_watch: CheckpointWatch | None = None  # its look at the checkpoints
        self._lines_mark: tuple[int, Mark | None] = (0, None)  # (run, where the count is)
        self._due_at: float | None = None  # when the last look's learned deadline passes

    def _stall_idle(self) -> tuple[float, float, bool]:
        """(when the run last wrote, how long it has been quiet, whether that is a stall)."""
        st, now = self.run.state, time.time()
        progress = progress_path(self.run.jdir, st.run)
        last = max(
            [st.started_at, *(mtime(p) for p in (log_path(self.run.jdir, st.run), progress))]
        )
        if not self.run.spec.watch.stall_auto:
            timeout = self.run.spec.watch.stall_timeout_s or 0.0
            return last, now - last, now - last >= timeout
        ckpt = self._newest_checkpoint_mtime()
        learner = self._stall_learner
        if learner.run != st.run:
            learner.begin(st.run, st.started_at)
        stepped = self._stepped(st.run, progress, st.started_at, last)
        learner.observe(last, ckpt, stepped=stepped, lines=self._new_lines(st.run, progress))
        deadline = learner.deadline_s
        if deadline is not None and (
            st.stall_deadline_s is None or abs(deadline - st.stall_deadline_s) > 0.1 * deadline
        ):
            self.run.observe(stall_deadline_s=round(deadline, 2))
        done = self._saved(now, ckpt)
        stalled = learner.stalled_for(now, ckpt, done=done)
        due = learner.due_in(now, ckpt, done=done)
        self._due_at = None if due is None else now + due
        return last, now - last, stalled is not None

    def _new_lines(self, run: int, progress: Path) -> int:
        """The progress lines run ``run`` wrote since the last look (0: none, or not
        known: the file is new to this look, replaced, or unreadable): what a look every
        0.5 s cannot time, counted (stall.py)."""
        seen, mark = self._lines_mark
        try:
            mark, _, data, fresh, _ = read_appended(progress, mark if seen == run else None, 0)
        except OSError:
            self._lines_mark = (run, None)
            return 0
        self._lines_mark = (run, mark)
        return 0 if fresh else data.count(b"\n")

    def due_in(self) -> float | None:
        """Seconds until a learned deadline would pass with nothing written (the log's
        look is taken then, not at its next half second); None: no such deadline now."""
        if self._due_at is None or self.run.stage is not lc.Stage.RUNNING:
            return None
        return max(0.0, self._due_at - time.time())  # as the last look saw the run

    def _saved(self, now: float, ckpt: float) -> bool:
        """While the learner would take a quiet run for one saving (a checkpoint written
        since its last step): whether that checkpoint is complete, its save over. Judged
        only then: a stat of its marker, or a read of a zip's last bytes."""
        if not self._stall_learner.saving(now, ckpt) or self._ckpt_watch is None:
            return False
        return self._ckpt_watch.newest_complete()

    def _stepped(self, run: int, progress: Path, started_at: float, last: float) -> bool:
        """Whether run ``run`` is past its start: its first reported step (its progress
        file, or a step progress_regex matched). A job that has reported no step in
        STEP_FIRST_S (it reports none: its log is all there is) is past its start at its
        first write after that; a torchrun banner a second in is not a step."""
        # the supervisor makes each run's progress file, empty, at its start: a step is
        # a line in it
        if _has_lines(progress) or self.stepped_in(run):
            self._reports_steps = True
            return True
        if not self._reports_steps and run > 1:
            self._reports_steps = _has_lines(progress_path(self.run.jdir, run - 1))
        if self._reports_steps or self.run.spec.watch.progress_regex:
            return False
        return last >= started_at + STEP_FIRST_S

    def _newest_checkpoint_mtime(self) -> float:
        pattern = self.run.spec.watch.checkpoint
        if not pattern:
            return 0.0
        if self._ckpt_watch is None:  # a glob only when a folder changed (stall.py)
            self._ckpt_watch = CheckpointWatch(self.run.spec.cwd, pattern)
        return self._ckpt_watch.newest_mtime()

    def check(self) -> bool:
        """Mark or clear STALLED; True the moment a stall is first seen."""
        watch = self.run.spec.watch
        if (
            not (watch.stall_timeout_s or watch.stall_auto)
            or self.run.stage is not lc.Stage.RUNNING
        ):
            return False
        st = self.run.state
        last, idle, stalled = self._stall_idle()
        if not stalled:
            if st.stalled_since is not None:
                self.run.observe(stalled_since=None)
                self.run.log.info(events.Unstalled())
            return False
        first = st.stalled_since is None
        if first:
            self.run.observe(stalled_since=last)
            self.run.log.warning(events.Stalled(round(idle, 1), self.run.spec.watch.on_stall))
            idle_line = f"no progress and no output for {idle:.0f} s"
            self.run.fire("stall", Cause(kind="stalled", summary=idle_line), step=self.last_step())
        if self.run.spec.watch.on_stall == "restart":
            self.run.send(lc.Stalled())
        return first

    async def write_stacks(self) -> None:
        """Where every process of the stalled run stands, read once, off the event loop."""
        refs = [m.ref for m in alive(scan_light(self.run.target())).values()]
        write = stacks_writer(self.run.jdir, self.run.state.run, "stall", self.run.state.marker)
        path = await anyio.to_thread.run_sync(write, refs)
        if path:
            self.run.log.warning("stacks_written", path=path, why="stalled", processes=len(refs))


class OomWatcher:
    """OOM kills in the run's memory group, each named as it happens."""

    def __init__(self, run: RunView) -> None:
        self.run = run

    def look(self) -> None:
        """Name each OOM kill in the job's memory group as it happens (one small read)."""
        group = self.run.memory_group()
        if group is None:
            return
        kills = memory.oom_kills(group)
        if kills <= self.run.state.oom_kills:
            return
        cmds = {m.pid: m.cmd for m in self.run.state.members}
        self.run.log.warning(
            "oom_kill",
            oom_kills=kills,
            victims=[{"pid": v.pid, "cmd": cmds.get(v.pid) or v.comm} for v in self.victims()],
            cap_bytes=self.run.spec.memory.max_bytes,
        )
        self.run.observe(oom_kills=kills)

    def victims(self) -> list[memory.Victim]:
        """The kernel log's OOM kills of this run: its members' pids, or its group's name."""
        st = self.run.state
        pids = {m.pid for m in st.members} | ({st.main.pid} if st.main else set())
        return memory.oom_victims(pids, Path(st.cgroup).name if st.cgroup else None)


class CheckpointAgeWatcher:
    """on_checkpoint_stale: the newest checkpoint older than the job allows."""

    def __init__(self, run: RunView, last_step: Callable[[], float | None]) -> None:
        self.run, self.last_step = run, last_step
        self._stale_checked = 0.0  # when the checkpoint's age was last looked at
        self._stale_fired = False  # fired; re-armed by a newer checkpoint

    async def look(self) -> None:
        """Fire on_checkpoint_stale once the newest checkpoint is older than allowed.

        Looked at every STALE_CHECK_S at most (a glob may walk a big folder; more often
        for a short limit), off the loop;
        fired once, and armed again when a newer checkpoint appears.
        """
        limit = self.run.spec.hooks.checkpoint_stale_s
        pattern = self.run.spec.watch.checkpoint
        now = time.time()
        if (
            limit is None
            or not pattern
            or now - self._stale_checked < min(STALE_CHECK_S, limit / 4)
        ):
            return
        self._stale_checked = now
        newest = await anyio.to_thread.run_sync(newest_mtime, self.run.spec.cwd, pattern)
        age = now - max(newest or 0.0, self.run.state.started_at)
        if age < limit:
            self._stale_fired = False
            return
        if self._stale_fired:
            return
        self._stale_fired = True
        what = "no checkpoint yet" if newest is None else "the newest checkpoint"
        summary = f"{what}: {age:.0f} s since {'start' if newest is None else 'it was written'}"
        self.run.log.warning("checkpoint_stale", age_s=round(age, 1), limit_s=limit)
        self.run.fire("checkpoint_stale", Cause(kind="checkpoint_stale", summary=summary),
                      step=self.last_step())  # fmt: skip


class VerdictWatcher:
    """The verdicts on a run's start: the checkpoint guard's (its first step against the
    floor) and a deploy's trial (its gate, then its probation). Each is sent to the
    lifecycle, which decides."""

    def __init__(self, run: RunView) -> None:
        self.run = run

    async def judge_trial(self) -> None:
        """A deploy's new code, held to its gate, then its probation (watch/trial.py):
        each verdict goes to the lifecycle, which decides what follows (one controller)."""
        jdir, spec, st = self.run.jdir, self.run.spec, self.run.state
        step_at = functools.partial(
            runsteps.step_before, jdir, st.run, spec, run_started=st.started_at
        )
        watch = trial.TrialWatch(jdir, spec, st, step_at)
        sent: str | None = None  # the stage a verdict was sent for
        while self.run.stage is lc.Stage.RUNNING:
            await anyio.sleep(trial.TRIAL_LOOK_S)
            t = self.run.state.trial
            if t is None or self.run.stage is not lc.Stage.RUNNING:
                return
            if t.stage == sent:
                continue  # the owner has not moved the trial on yet
            stalled = self.run.state.stalled_since is not None
            verdict = await anyio.to_thread.run_sync(watch.look, t, time.time(), stalled)
            if watch.first is not None and t.first_step is None:
                self.run.observe(trial=replace(t, first_step=watch.first))
            if isinstance(verdict, trial.TrialPassed):
                self.run.send(lc.TrialPassed(verdict.why, verdict.step))
            elif verdict is not None:
                self.run.send(lc.TrialFailed(verdict.why, verdict.lines))
            sent = t.stage if verdict is not None else None

    async def guard_first_step(self) -> None:
        """The checkpoint guard: the run's first reported step, looked for every
        GUARD_LOOK_S until it comes (a small read of what its files gained); below the
        floor, the run started over and is stopped before its first save."""
        spec, st = self.run.spec, self.run.state
        first = guard.FirstStep(self.run.jdir, st.run, spec.watch.progress_regex)
        while self.run.stage is lc.Stage.RUNNING:
            step = first.look()
            if step is None:
                await anyio.sleep(GUARD_LOOK_S)
                continue
            g = self.run.state.guard
            if g is None:
                return
            if not guard.below_floor(g, step):
                # it resumed: a copy (up to checkpoint_keep_max of disk) has done its work
                passed = await anyio.to_thread.run_sync(guard.passed, g, step)
                self.run.observe(guard=passed)
                self.run.log.info("guard_passed", first_step=step, floor=g.floor, kept=g.kept)
                return
            line = guard.tripped_line(g, step, spec.argv)
            self.run.observe(guard=replace(g, first_step=step, tripped=line))
            self.run.log.warning("guard_tripped", first_step=step, floor=g.floor,
                                 checkpoint=g.path, kept=g.kept, why=line)  # fmt: skip
            self.run.send(lc.StartedOver(step, line))
            return
