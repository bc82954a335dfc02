"""What to run and how to treat it: the resolved job spec (spec.json), in sections.

A spec is what `restart` reuses. Each concern is its own frozen section, owned by the code
that acts on it: the stop sequence takes :class:`StopPolicy` as it is, the restart policy
:class:`RestartPolicy`, the log writer :class:`LogPolicy`, the watchers :class:`Watch`, GPU
verification :class:`GpuBinding`. spec.json stores the same sections as JSON objects.
"""

from __future__ import annotations

from enum import StrEnum
from signal import Signals
from typing import Any

from trainctl.supervisor.errors import ConfigError, StateError
from trainctl.supervisor.records import (
    JsonObject,
    asdict,
    field,
    field_names,
    fields,
    record,
    replace,
)

SCHEMA = 1
BACKENDS = ("local", "slurm")  # where a job runs (launcher/backends/)
# The spec keys of the Slurm backend (Spec.slurm); the only place they are listed.
SLURM_KEYS = frozenset({"nodes", "gpus_per_node", "partition", "time", "sbatch_args"})


class StopOrder(StrEnum):
    """The order in which a stop signals the job's members (see supervisor/tree/forest.py)."""

    TREE = "tree"  # top of the process forest first; children once their parent exited
    ALL = "all"  # every member at once
    MAIN = "main"  # main alone; the rest once main has exited


def parse_order(raw: object, what: str = "stop order") -> StopOrder:
    """Return the stop order named by ``raw``; one clear line for anything else."""
    try:
        return StopOrder(str(raw).strip().lower())
    except ValueError:
        raise ConfigError(f"{what}: unknown stop order {raw!r} (use tree, all or main)") from None


@record(frozen=True)
class StopPolicy:
    """How a stop ends the job: its signal, its order and every duration of the sequence."""

    signal: str = "SIGTERM"  # a name such as "SIGTERM"
    grace_s: float = 60.0
    kill_wait_s: float = 10.0
    order: str = StopOrder.TREE  # a StopOrder value
    freeze_timeout_s: float = 2.0
    max_poll_s: float = 0.05  # poll interval for members without a pidfd (fd limit hit)
    rescan_s: float = 0.1  # how often the full /proc scan repeats while waiting
    stop_rounds: int = 200  # SIGSTOP-and-rescan rounds before giving up on quiescence
    launcher_linger_s: float = 2.0  # a launcher whose workers are gone may exit by itself

    @property
    def signum(self) -> Signals:
        """The stop signal as a number."""
        return Signals[self.signal]


# What `restart_on` takes besides the pattern classes (supervisor/life/causes.py) and
# `exit:N`; a pattern class's name. Here, with the spec, so that a config check of
# [causes] needs no causes module.
RESTART_WORDS = ("failure", "oom", "signal")
# always .fullmatch: "$" also matches before a final newline ("oom\n" would pass .match)
CLASS_NAME = r"[a-z][a-z0-9-]{0,39}"  # a pattern, compiled on first use (re caches it)


@record(frozen=True)
class RestartPolicy:
    """When the supervisor relaunches a failed run (see supervisor/life/policy.py)."""

    mode: str = "never"  # "never" | "on-failure"
    max_restarts: int = 3
    backoff_s: float = 5.0
    backoff_max_s: float = 300.0
    exit_codes: tuple[int, ...] | None = None  # None: any non-zero exit
    # which ends of a run restart it (supervisor/life/causes.py RESTART_ON): "failure" (any
    # failed end), "oom", "signal", "exit:N", or a pattern class such as "nccl-timeout"
    on: tuple[str, ...] = ("failure",)
    # crash-loop breaker: at most max_restarts restarts within any window this long
    # (None: max_restarts over the job's whole life)
    window_s: float | None = None
    # the breaker on progress: this many restarts in a row that never advanced the newest
    # complete checkpoint end the job (0: off)
    no_progress: int = 3


@record(frozen=True)
class Watch:
    """What the supervisor watches in a training job: checkpoints, progress, stalls."""

    checkpoint: str | None = None  # glob relative to cwd
    checkpoint_signal: str = "SIGUSR2"
    progress_regex: str | None = None
    total_steps: int | None = None
    stall_timeout_s: float | None = None
    stall_auto: bool = False  # stall_timeout = "auto": a deadline learned from the run (stall.py)
    on_stall: str = "mark"  # "mark" | "restart"
    snapshot_interval_s: float = 3.0
    sample_interval_s: float = 10.0  # the samples `trainctl web` draws (watch/samples.py)
    # deploy: the checkpoint handed to new code is kept aside (a reflink, else a copy) up
    # to this size, until the new code passed its gate and probation
    checkpoint_keep_max: int = 4 << 30
    # the checkpoint guard (watch/guard.py): a run whose first reported step is more than
    # this below the checkpoint it was handed started over, and is stopped before its first
    # save. None ("off"): no guard, for a trainer whose step count restarts at each resume
    resume_tolerance: float | None = 2.0
    # the grace of the stop that answers a stall (stall_action = "restart"); None: the
    # job's grace, at most STALL_GRACE_S (lifecycle: a hung rank's peers wait in their
    # collective and cannot save, so a long grace is lost time)
    stall_grace_s: float | None = None

    def stall_grace(self, grace_s: float) -> float:
        """The grace a stall's stop gives the job."""
        return self.stall_grace_s if self.stall_grace_s is not None else min(grace_s, STALL_GRACE_S)


STALL_GRACE_S = 10.0  # the default stall_grace: a trainer alive enough to save does it in time

# Spec fields a reader older than this trainctl does not know (it refused unknown keys:
# before issue 55), written only when set: a trainctl rolled back under a job reads it.
WRITTEN_WHEN_SET = {"watch": ("stall_grace_s",)}


# The events a job can have a hook for (``on_<event>`` in Hooks, the spec file and
# config.toml's [hooks]; TRAINCTL_EVENT in a hook's environment): the one list of them.
HOOK_EVENTS = ("start", "exit", "failure", "stall", "restart", "checkpoint_stale", "deploy_failed")


@record(frozen=True)
class Hooks:
    """Commands the supervisor runs, and the URL it tells, when something happens to a run.

    Each command is an argv. The supervisor never waits for one: a small runner process
    (supervisor/life/hookrun.py) runs it with ``timeout_s`` and records its exit in events.
    """

    on_start: tuple[str, ...] | None = None  # a run began (`start`, a queued dispatch)
    on_exit: tuple[str, ...] | None = None  # the job ended (stopped, exited or failed)
    on_failure: tuple[str, ...] | None = None  # the job ended failed (no restart follows)
    on_stall: tuple[str, ...] | None = None  # the stall watchdog saw the run stall
    on_restart: tuple[str, ...] | None = None  # a failed run is about to be relaunched
    on_checkpoint_stale: tuple[str, ...] | None = None  # newest checkpoint too old
    on_deploy_failed: tuple[str, ...] | None = None  # a deploy failed its gate (rolled back)
    checkpoint_stale_s: float | None = None  # ... older than this
    notify: str | None = None  # http(s) URL: one JSON POST per event above
    timeout_s: float = 30.0

    def command(self, event: str) -> tuple[str, ...] | None:
        """The command for ``event`` (one of HOOK_EVENTS)."""
        cmd: tuple[str, ...] | None = getattr(self, f"on_{event}")
        return cmd


@record(frozen=True)
class MemoryCap:
    """The job cgroup's memory limits (supervisor/linux/memory.py); None: no limit."""

    max_bytes: int | None = None  # memory.max (v2) / memory.limit_in_bytes (v1)
    high_bytes: int | None = None  # memory.high (v2) / memory.soft_limit_in_bytes (v1)

    @property
    def wanted(self) -> bool:
        """Tell whether any limit is set."""
        return self.max_bytes is not None or self.high_bytes is not None


@record(frozen=True)
class LogPolicy:
    """How logs/run-N.log is bounded."""

    max_bytes: int = 1 << 30  # rotate beyond this (0: never)
    keep: int = 3  # rotated copies kept: run-N.log.1 ... run-N.log.KEEP


@record(frozen=True)
class Isolation:
    """Where the supervisor and the job are placed on a local host."""

    cgroup: bool = True  # try cgroup v2 placement
    systemd: bool = True  # on systemd hosts, run the supervisor in its own delegated scope


@record(frozen=True)
class GpuBinding:
    """The GPUs bound to the job, and how their release is proven after a stop."""

    indices: str | None = None  # resolved GPU indices ("0,3"); None = no binding
    # after a GPU fault, restart at once on the healthy GPUs left if at least this many
    # are (None: the run ends, its cause saying how to go on on fewer)
    min_gpus: int | None = None
    # the GPUs the job was given before a fault took any away: `restart` and `deploy` grow
    # the run back to them once they are healthy (None: ``indices``)
    asked: str | None = None
    timeout_s: float = 30.0
    tolerance_mib: int = 512


SNAPSHOT_MODES = ("none", "git", "copy")


@record(frozen=True)
class SnapshotPolicy:
    """Where each run's code is kept, so that a deploy has a way back (launcher/ops/snapshot.py).

    ``git``: a worktree of the commit plus its uncommitted diff; ``copy``: a copy of the
    directory (``exclude`` globs left out, refused over ``max_bytes``); ``none``: the run
    executes in place (nothing to roll back to).
    """

    mode: str = "none"
    keep: int = 3  # snapshots kept per job (older ones go at the next start and on prune)
    max_bytes: int = 2 << 30  # copy: refuse a tree larger than this
    exclude: tuple[str, ...] = (".git", "__pycache__", "*.pyc", ".venv", "venv", "node_modules")


@record(frozen=True)
class Spec:
    """What to run; the resolved form that `restart` reuses."""

    name: str
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]  # the whole environment of the job, minus trainctl's own variables
    stop: StopPolicy = field(default_factory=StopPolicy)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    watch: Watch = field(default_factory=Watch)
    logs: LogPolicy = field(default_factory=LogPolicy)
    isolation: Isolation = field(default_factory=Isolation)
    gpu: GpuBinding = field(default_factory=GpuBinding)
    hooks: Hooks = field(default_factory=Hooks)
    memory: MemoryCap = field(default_factory=MemoryCap)
    snapshot: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    # the directory the code was snapshotted from, when the run executes from a snapshot
    # under the job's directory (cwd is then the snapshot): drift and deploy look here
    source: str | None = None
    # pattern classes added by config ([causes] name = "regex"), tried before the built-in
    causes: dict[str, str] = field(default_factory=dict)
    backend: str = "local"  # "local" | "slurm" (see launcher/backends/)
    # main runs on a pseudo-terminal the supervisor holds (`trainctl attach`; terminal.py)
    tty: bool = False
    slurm: dict[str, Any] | None = None  # nodes, gpus_per_node, partition, time, sbatch_args
    spec_file: str | None = None
    # the keys the spec file gave at start, and those --set and the flags gave over it:
    # `status` compares the file with the first (SPEC CHANGED), `restart --reload`
    # rebuilds from the file as it is now plus the second
    file_keys: dict[str, Any] | None = None
    cli_keys: dict[str, Any] | None = None
    file_mtime: float | None = None  # the spec file's mtime when file_keys were read
    schema: int = SCHEMA

    def with_stop(self, **changes: Any) -> Spec:
        """Return a copy whose stop policy has ``changes``."""
        return replace(self, stop=replace(self.stop, **changes))


_SECTIONS: dict[str, type] = {
    "stop": StopPolicy,
    "restart": RestartPolicy,
    "watch": Watch,
    "logs": LogPolicy,
    "isolation": Isolation,
    "gpu": GpuBinding,
    "hooks": Hooks,
    "memory": MemoryCap,
    "snapshot": SnapshotPolicy,
}


def spec_to_doc(spec: Spec) -> JsonObject:
    """Serialise a spec for spec.json (and the supervisor handshake)."""
    doc = asdict(spec)
    for section, keys in WRITTEN_WHEN_SET.items():
        for key in keys:
            if doc[section].get(key) is None:
                doc[section].pop(key, None)
    return doc


_SPEC_FIELDS = frozenset(field_names(Spec))


def _object(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{key} must be an object")
    return value


def _tuples(section: Any) -> Any:
    """The section with each list field (JSON has no tuples) made the tuple it is declared."""
    lists = {
        f.name: tuple(v) for f in fields(section) if isinstance(v := getattr(section, f.name), list)
    }
    return replace(section, **lists) if lists else section


def spec_from_doc(doc: dict[str, Any], where: str = "spec") -> Spec:
    """Build a Spec from its JSON form, rejecting missing or mistyped fields (keys it does
    not know, a newer trainctl's, are ignored)."""
    try:
        # a newer writer's keys are not this reader's: ignored (the schema only adds)
        d = {k: v for k, v in doc.items() if k in _SPEC_FIELDS}
        for key, cls in _SECTIONS.items():
            section = _object(d.get(key, {}), key)
            names = field_names(cls)
            d[key] = _tuples(cls(**{k: v for k, v in section.items() if k in names}))
        d["argv"] = tuple(d["argv"])
        spec = Spec(**d)
    except (TypeError, KeyError, ValueError) as e:
        raise StateError(f"{where} is incomplete or malformed: {e}") from None
    from .schema import check_document  # noqa: PLC0415  (imports typing machinery)

    check_document(spec, where)
    if not spec.argv:
        raise StateError(f"{where} has an empty argv")
    if spec.stop.order not in tuple(StopOrder):
        raise StateError(f"{where} has an unknown stop order {spec.stop.order!r}")
    if spec.backend not in BACKENDS:
        raise StateError(f"{where} has an unknown backend {spec.backend!r}")
    if spec.stop.signal not in Signals.__members__:
        raise StateError(f"{where} has an unknown stop signal {spec.stop.signal!r}")
    return spec
