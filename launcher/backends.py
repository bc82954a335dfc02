"""Where a job's processes run: here under a supervisor, or in a Slurm allocation.

Every verb asks the job's backend instead of testing ``backend == "slurm"``: what phase the
run is in (:meth:`Backend.seen`), whether its name is free (:meth:`Backend.refuse_if_live`),
how to start it, stop it and ask it for a checkpoint, and which spec keys make sense for
it (:meth:`Backend.check_values`). A new backend is one more class here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trainctl.supervisor import state
from trainctl.supervisor.errors import ConfigError, JobConflictError, SpawnError, TrainctlError
from trainctl.supervisor.spec import BACKENDS, Spec
from trainctl.supervisor.state import JobState, Phase

if TYPE_CHECKING:
    from .checkpoint import Checkpoint
    from .config import Config
    from .start import GpuRequest, StartResult
    from .stop import StopResult

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Seen:
    """A job's run as its backend sees it now."""

    phase: Phase
    exit_code: int | None
    mode: str  # how its processes are tracked: "cgroup", "signals" or "slurm"
    # the scheduler has ended the run or no longer knows it: nothing of it is scheduled
    ended: bool
    # members found on this host are the whole job (so an escape from its group is news)
    whole_job_here: bool = True
    details: dict[str, Any] | None = None  # the backend's own facts, for `status`
    # live processes counted by the backend where they run (Slurm: by the node agents);
    # None: count them here
    members: int | None = None
    # every live process, by node, as the node agents published them (for `ps`)
    processes: list[dict[str, Any]] | None = None


class Backend(Protocol):
    """What each verb needs from the place a job runs."""

    kind: str

    def check_values(self, values: dict[str, Any]) -> None:
        """Refuse spec keys that make no sense for this backend (ConfigError)."""

    def seen(self, jdir: Path, st: JobState) -> Seen:
        """Return the run's phase, exit code and tracking as the backend sees them now."""

    def refuse_if_live(self, jdir: Path, prev: JobState) -> None:
        """Raise JobConflictError while the backend still runs or schedules ``prev``."""

    def start(
        self,
        home: Path,
        jdir: Path,
        spec: Spec,
        cfg: Config,
        gpus: GpuRequest | None,
        prev: JobState | None,
        t0: float,
    ) -> StartResult:
        """Start the next run; the caller holds the job lock and checked the name is free."""

    def stop(
        self, jdir: Path, st: JobState, spec: Spec, grace_s: float, order: str | None
    ) -> StopResult | None:
        """Stop the run here; None: the caller runs trainctl's local stop itself."""

    def checkpoint(
        self, jdir: Path, st: JobState, spec: Spec, timeout_s: float, say: Say
    ) -> Checkpoint | None:
        """Ask the running job for a checkpoint and wait for it; None: nothing to ask."""


_SLURM_KEYS = frozenset({"nodes", "gpus_per_node", "partition", "time", "sbatch_args"})


class Local:
    """Here, under trainctl's own supervisor."""

    kind = "local"

    def check_values(self, values: dict[str, Any]) -> None:
        """Slurm's keys only make sense with --backend slurm."""
        if keys := _SLURM_KEYS & set(values):
            raise ConfigError(f"{', '.join(sorted(keys))}: only with --backend slurm")

    def seen(self, jdir: Path, st: JobState) -> Seen:
        """The recorded phase, or LOST when the supervisor of a live run is gone."""
        phase = state.effective_phase(jdir, st)
        return Seen(phase, st.exit_code, st.mode, ended=phase in state.TERMINAL)

    def refuse_if_live(self, jdir: Path, prev: JobState) -> None:
        """Nothing beyond the supervisor and member checks every backend gets."""

    def start(
        self,
        home: Path,
        jdir: Path,
        spec: Spec,
        cfg: Config,
        gpus: GpuRequest | None,
        prev: JobState | None,
        t0: float,
    ) -> StartResult:
        """Hand the run to a new supervisor; undo everything if that fails."""
        from .start import launch_local, undo_failed_start  # noqa: PLC0415

        run = prev.run + 1 if prev else 1
        marker = uuid.uuid4().hex
        try:
            return launch_local(home, jdir, spec, cfg, gpus, run, marker, t0)
        except SpawnError as e:
            undo_failed_start(jdir, spec, marker, str(e))
            raise

    def stop(
        self, jdir: Path, st: JobState, spec: Spec, grace_s: float, order: str | None
    ) -> StopResult | None:
        """The caller's own stop (through the supervisor or directly) is the local stop."""
        return None

    def checkpoint(
        self, jdir: Path, st: JobState, spec: Spec, timeout_s: float, say: Say
    ) -> Checkpoint | None:
        """Signal the job's processes with the checkpoint signal and wait for the file."""
        from .checkpoint import request_checkpoint  # noqa: PLC0415
        from .jobs import live_members  # noqa: PLC0415

        if not live_members(st):
            return None
        say(f"asking for a checkpoint ({spec.watch.checkpoint_signal}) ...")
        return request_checkpoint(st, spec, timeout_s)


class Slurm:
    """In a Slurm allocation: sbatch submits, a node agent supervises on each node."""

    kind = "slurm"

    def check_values(self, values: dict[str, Any]) -> None:
        """--gpus binds this host's GPUs; Slurm allocates its own. A line break in any
        sbatch setting would start a new line of the batch script: a shell command."""
        if values.get("gpus"):
            raise ConfigError("--gpus binds local GPUs; with --backend slurm use --gpus-per-node")
        for key in ("partition", "time", "sbatch_args"):
            value = values.get(key)
            for item in value if isinstance(value, list | tuple) else [value]:
                if isinstance(item, str) and ("\n" in item or "\r" in item):
                    raise ConfigError(f"{key}: a line break is not allowed ({item!r})")

    def seen(self, jdir: Path, st: JobState) -> Seen:
        """Slurm's verdict, recorded the moment it is final; plus what each node reports.

        A run recorded as ended is not asked about again: Slurm forgets jobs (MinJobAge),
        and a forgotten job must stay `exited` or `failed`, not turn `lost`.
        """
        from .slurm import STALE_S, node_records, query  # noqa: PLC0415

        job_id = (st.slurm or {}).get("job_id")
        if st.phase in state.TERMINAL:
            final = (st.slurm or {}).get("state", "ENDED")
            info: dict[str, Any] = {"state": final, "exit_code": st.exit_code, "phase": st.phase}
        else:
            info = query(st)
        phase = Phase(info["phase"])
        if phase in state.TERMINAL and st.phase not in state.TERMINAL:
            _record_final(jdir, phase, info["exit_code"], info["state"])
        nodes = node_records(jdir, st.run)
        live = [n for n in nodes if n.get("stop") is None and n["age_s"] < STALE_S]
        running = phase not in state.TERMINAL and phase != Phase.LOST
        details = {k: v for k, v in info.items() if k != "phase"}
        details["job_id"] = job_id
        details["agents"] = [
            {
                "node": n["node"],
                "host": n.get("host"),
                "rank": n.get("rank"),
                "members": n.get("member_count", 0),
                "age_s": n["age_s"],
                "stale": n.get("stop") is None and n["age_s"] >= STALE_S,
                "stopped": n.get("stop") is not None,
            }
            for n in nodes
        ]
        return Seen(
            phase,
            info["exit_code"],
            "slurm",
            # LOST: Slurm has purged the job record (MinJobAge): it ended
            ended=phase in state.TERMINAL or phase == Phase.LOST,
            whole_job_here=False,
            details=details,
            members=sum(int(n.get("member_count", 0)) for n in live) if running else 0,
            processes=[{**m, "node": n["node"]} for n in live for m in n.get("members", [])]
            if running
            else [],
        )

    def refuse_if_live(self, jdir: Path, prev: JobState) -> None:
        """The name is busy while Slurm still queues or runs the job."""
        seen = self.seen(jdir, prev)
        if not seen.ended:
            details = seen.details or {}
            raise JobConflictError(
                f"job {prev.name} is {details.get('state')} in Slurm (job id "
                f"{details.get('job_id')}); stop it first or choose another name"
            )

    def start(
        self,
        home: Path,
        jdir: Path,
        spec: Spec,
        cfg: Config,
        gpus: GpuRequest | None,
        prev: JobState | None,
        t0: float,
    ) -> StartResult:
        """Submit the batch script; the node agents start the job on each node."""
        from . import slurm  # noqa: PLC0415
        from .start import StartResult  # noqa: PLC0415

        st = slurm.submit(home, jdir, spec, prev)
        return StartResult(
            name=spec.name,
            run=st.run,
            main_pid=None,
            mode="slurm",
            log=str(state.log_path(jdir, st.run)),
            elapsed_s=time.monotonic() - t0,
            slurm_job_id=(st.slurm or {}).get("job_id"),
        )

    def stop(
        self, jdir: Path, st: JobState, spec: Spec, grace_s: float, order: str | None
    ) -> StopResult | None:
        """The node agents stop their nodes; Slurm makes sure; record the outcome."""
        from . import slurm  # noqa: PLC0415
        from .stop import StopResult  # noqa: PLC0415

        report = slurm.stop(jdir, st, spec, grace_s, order)
        final = report["slurm"]
        if report.get("already_stopped"):
            msg = f"job {st.name} is not running (Slurm: {final['state']}); nothing to stop"
            return StopResult(st.name, st.run, "noop", report, final["exit_code"], msg)
        new = dataclasses.replace(
            st,
            phase=Phase.STOPPED,
            exit_code=final["exit_code"],
            ended_at=time.time(),
            last_stop=report,
            slurm={**(st.slurm or {}), "state": final["state"]},
        )
        state.write_state(jdir, new)
        message = slurm.describe_stop(st.name, st.run, report)
        return StopResult(st.name, st.run, "slurm", report, final["exit_code"], message)

    def checkpoint(
        self, jdir: Path, st: JobState, spec: Spec, timeout_s: float, say: Say
    ) -> Checkpoint | None:
        """Ask the node agents (through the job directory) and wait for a new checkpoint."""
        from . import slurm  # noqa: PLC0415
        from .checkpoint import wait_new_checkpoint  # noqa: PLC0415

        say(f"asking every node for a checkpoint ({spec.watch.checkpoint_signal}) ...")
        asked_at = slurm.request_checkpoint(jdir)
        return wait_new_checkpoint(spec, asked_at, timeout_s)


def _record_final(jdir: Path, phase: Phase, exit_code: int | None, slurm_state: str) -> None:
    """Record Slurm's final verdict, under the job lock and only if nobody holds it (a
    `stop` in progress records its own outcome); a view never waits, nor fails, for it."""
    with contextlib.suppress(OSError, TrainctlError), state.job_lock(jdir, 0.0):
        now = state.read_state(jdir)
        if now.phase not in state.TERMINAL:
            ended = dataclasses.replace(
                now,
                phase=phase,
                exit_code=exit_code,
                ended_at=time.time(),
                slurm={**(now.slurm or {}), "state": slurm_state},
            )
            state.write_state(jdir, ended)


_BACKENDS: dict[str, Backend] = {"local": Local(), "slurm": Slurm()}


def backend(kind: str) -> Backend:
    """The backend called ``kind`` (state and spec documents are validated on read)."""
    try:
        return _BACKENDS[kind]
    except KeyError:
        raise ConfigError(
            f"unknown backend {kind!r} (expected one of {', '.join(BACKENDS)})"
        ) from None


def of(st: JobState) -> Backend:
    """The backend that runs the job recorded in ``st``."""
    return backend(st.backend)
