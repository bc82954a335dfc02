"""Where a job's processes run: the backend protocol and its registry.

Every operation asks the job's backend instead of testing ``backend == "slurm"``: what
phase the run is in (:meth:`Backend.seen`), whether its name is free
(:meth:`Backend.refuse_if_live`), how to start it, stop it and ask it for a checkpoint,
and which spec keys make sense for it (:meth:`Backend.check_values`). Each backend owns
its whole implementation in its own module and returns records (``..results``), never
text. The registry imports a backend's module only when a job of that kind is touched,
so `status` of a local job never loads the Slurm code.

A new backend is one package here with a ``BACKEND`` object, plus one line in ``_MODULES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from trainctl.launcher.config import Config, load_config
from trainctl.launcher.results import Checkpoint, GpuRequest, Seen, StartResult, StopResult
from trainctl.supervisor.errors import ConfigError, JobNotFoundError, StateError, TrainctlError
from trainctl.supervisor.model import state
from trainctl.supervisor.model.spec import BACKENDS, Spec, StopOrder, StopPolicy
from trainctl.supervisor.model.state import JobState
from trainctl.supervisor.records import record

if TYPE_CHECKING:  # the spec file reader (tomllib): only for the type
    from trainctl.launcher.specfile import SpecDraft

Asked = Callable[[], None]  # called the moment a checkpoint request goes out


@record(frozen=True)
class StartRequest:
    """One start: the caller holds the job lock and checked that the name is free."""

    home: Path
    jdir: Path
    spec: Spec
    cfg: Config
    gpus: GpuRequest | None
    prev: JobState | None  # the job's previous run, if it had one
    t0: float  # monotonic time the command began (StartResult.elapsed_s counts from it)
    keep_cwd: bool = False  # run in spec.cwd as it is: no new snapshot (a deploy's rollback)
    from_scratch: bool = False  # `--from-scratch`: hand no checkpoint, arm no guard
    rolled_back: str | None = None  # a deploy's rollback to the code it replaced: why


@record(frozen=True)
class StopRequest:
    """One `stop`, resolved against the job's spec (every duration is set here)."""

    grace_s: float
    order: StopOrder
    gpu_timeout_s: float
    kill_wait_s: float
    force: bool = False  # end a live but unreachable supervisor, then stop directly
    # --grace as given, else None: a live supervisor keeps the job's own grace (which it
    # holds in memory even when spec.json is unreadable), and a --grace that joins a
    # running stop shortens that stop's remaining grace
    asked_grace_s: float | None = None
    asked_order: StopOrder | None = None  # --order / --main-only; else the job's own
    lock_held: bool = False  # restart holds the job lock across its stop and its start
    verb: str = "stop"  # the verb that stops the run (stop, restart, rm): its cause says it

    @property
    def budget_s(self) -> float:
        """How long the whole stop may take before the CLI gives up waiting for it."""
        return self.grace_s + self.kill_wait_s + self.gpu_timeout_s + STOP_SLACK_S


# What a stop may take beyond its grace, escalation and GPU check: a supervisor's handover
# to its successor, the record, a slow disk.
STOP_SLACK_S = 60.0


@record(frozen=True)
class Capabilities:
    """What a backend can do beyond start, stop and status: an operation asks these,
    never the backend's name."""

    deploy: bool = False  # new code into a running run, checkpoint-gated (deploy)
    terminal: bool = False  # main's terminal held by a supervisor on this machine (attach)
    local_stacks: bool = False  # the run's processes are here, for py-spy (stack)
    memory_caps: bool = False  # memory_max / memory_high on the run's own cgroup
    gpu_healing: bool = False  # min_gpus: a GPU fault restarts on the box's healthy GPUs


class Backend(Protocol):
    """What each operation needs from the place a job runs."""

    kind: str
    title: str  # how a message names it ("Slurm")
    can: Capabilities
    # whether trainctl's own queue (--queue, --after, --singleton) serves its jobs; a
    # backend with a scheduler of its own (Slurm) queues there instead
    queues_here: bool

    def check_values(self, draft: SpecDraft) -> None:
        """Refuse spec keys that make no sense for this backend (ConfigError)."""

    def seen(self, jdir: Path, st: JobState) -> Seen:
        """Return the run's phase, exit code and tracking as the backend sees them now."""

    def refuse_if_live(self, jdir: Path, prev: JobState) -> None:
        """Raise JobConflictError while the backend still runs or schedules ``prev``."""

    def start(self, req: StartRequest) -> StartResult:
        """Start the next run; the caller holds the job lock and checked the name is free."""

    def stop(self, jdir: Path, st: JobState, spec: Spec, req: StopRequest) -> StopResult:
        """Stop every process of the run and nothing else; return the proof."""

    def checkpoint(
        self, jdir: Path, st: JobState, spec: Spec, timeout_s: float, asked: Asked
    ) -> Checkpoint | None:
        """Ask the running job for a checkpoint and wait for it; None: nothing to ask."""

    def record(self, jdir: Path, st: JobState) -> None:
        """Write state.json where no supervisor does (a failed start, a stop without a
        supervisor, a queued start that failed): the backend's one writer on this side
        (tests/architecture: the named writers of state.json)."""

    def watch_run(self, jdir: Path, run: int) -> RunWatch:
        """A watch on run ``run`` that says when it ended or was relaunched, the backend's
        own way (its supervisor's events; the scheduler): never by reading state.json
        again and again (issue 55: no module of launcher/ polls it)."""


class RunWatch(Protocol):
    """A watch on one run (``Backend.watch_run``)."""

    def over(self) -> bool:
        """The run has ended, or its job has moved on to a later run (cheap: call it
        every few tens of ms)."""

    def final(self) -> bool:
        """The run has ended for good: no relaunch of it is scheduled (`logs -f` goes on
        through a restart's backoff). Asked after ``over``."""


_MODULES = {"local": "local", "slurm": "slurm"}
_LOADED: dict[str, Backend] = {}


DEFAULT = "local"


def backend(kind: str | None) -> Backend:
    """The backend called ``kind``, or the default one for None (state and spec documents
    are validated on read)."""
    kind = kind or DEFAULT
    if kind not in _LOADED:
        if kind not in _MODULES:
            raise ConfigError(f"unknown backend {kind!r} (expected one of {', '.join(BACKENDS)})")
        module = importlib.import_module(f"{__name__}.{_MODULES[kind]}")
        _LOADED[kind] = module.BACKEND
    return _LOADED[kind]


def of(st: JobState) -> Backend:
    """The backend that runs the job recorded in ``st``."""
    return backend(st.backend)


def spec_for_stop(jdir: Path, st: JobState) -> tuple[Spec, str]:
    """The job's spec, or, when spec.json is unreadable, the configured stop defaults.

    state.json alone identifies every process of the run; the spec only tunes the stop
    (grace, signal, order). A corrupt spec must not leave a running job unstoppable.
    Returns the spec and a warning line ('' when the spec was read).
    """
    try:
        return state.read_spec(jdir), ""
    except (StateError, JobNotFoundError) as e:
        try:
            cfg = load_config()
            policy = StopPolicy(
                signal=cfg.stop_signal
                if cfg.stop_signal.startswith("SIG")
                else f"SIG{cfg.stop_signal}",
                grace_s=cfg.grace_s,
                kill_wait_s=cfg.kill_wait_s,
                order=cfg.stop_order,
            )
        except TrainctlError:
            policy = StopPolicy()  # the built-in defaults: one place (supervisor/model/spec.py)
        spec = Spec(name=st.name, argv=("?",), cwd="/", env={}, stop=policy)
        why = f"warning: {e}; stopping with the configured defaults "
        return spec, why + f"({policy.signal}, {policy.grace_s:g} s)"
