"""The files through which the CLI and a Slurm job's node agents talk, in one place.

The job directory sits on a file system every node shares, so each side reads what the
other wrote: the CLI asks for a stop or a checkpoint (``slurm/stop-request``,
``slurm/checkpoint-request``); each agent publishes its node's view, and at the end its
stop report (``slurm/run-N.NODE.json``). Both sides use these records and paths; neither
spells a file name or a key of its own.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from trainctl.supervisor.errors import StateError
from trainctl.supervisor.linux.procfs import Stat, read_cmdline
from trainctl.supervisor.records import asdict, record, replace

from .schema import build_document
from .state import log_path, write_bytes_atomic, write_json_atomic

STOP_REQUEST = "stop-request"
CHECKPOINT_REQUEST = "checkpoint-request"
# A node's record older than this is stale: its agent stopped publishing (gone, or hung).
STALE_S = 10.0


def slurm_dir(jdir: Path) -> Path:
    """Where the batch scripts, the requests and the node records live."""
    return jdir / "slurm"


def record_path(jdir: Path, run: int, node: str) -> Path:
    """The record node ``node`` publishes about run ``run``."""
    return slurm_dir(jdir) / f"run-{run}.{node}.json"


@record(frozen=True)
class StopFile:
    """`trainctl stop` asking every node agent for trainctl's own stop on its node."""

    at: float
    grace_s: float
    order: str


@record(frozen=True)
class NodeProcess:
    """One live process of the job on a node, as its agent published it."""

    pid: int
    ppid: int = 0
    state: str = "?"
    cmd: str = ""


def node_process(st: Stat) -> NodeProcess:
    """A live process as an agent publishes it (and as this host's marker scan shows it)."""
    return NodeProcess(st.pid, st.ppid, st.state, read_cmdline(st.pid)[:300] or f"[{st.comm}]")


@record(frozen=True)
class NodeRecord:
    """What one node agent published: its node, its live members, its stop report."""

    node: str
    at: float = 0.0
    host: str | None = None
    rank: str | None = None
    agent: int | None = None
    main: int | None = None
    members: tuple[NodeProcess, ...] = ()
    member_count: int = 0
    stop: dict[str, Any] | None = None  # the node's StopReport JSON (+ "swept": a sweep job)
    # How the node's run ended, published by its agent at the end: a verdict that does not
    # depend on Slurm remembering the job (it forgets it after MinJobAge).
    exit_code: int | None = None
    stopped: bool | None = None  # a stop (request or signal) ended it, not main's own exit

    @property
    def age_s(self) -> float:
        """Seconds since the agent last published."""
        return round(max(0.0, time.time() - self.at), 1)

    @property
    def stale(self) -> bool:
        """The agent stopped publishing while its node's run is not over."""
        return self.stop is None and self.age_s >= STALE_S


def node_count(env: dict[str, str] | Any) -> int:
    """How many nodes the allocation has (each runs one agent), from slurmd's variables."""
    raw = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


def write_stop_request(jdir: Path, ask: StopFile) -> None:
    """Ask every node agent to stop its node (each watches the file's mtime)."""
    write_json_atomic(slurm_dir(jdir) / STOP_REQUEST, asdict(ask))


MAX_GRACE_S = 3e7  # a grace beyond a year is no grace a user asked for: the job's own wins


def read_stop_request(jdir: Path) -> StopFile | None:
    """The stop the CLI asked for; None when there is none, or it is unreadable or insane."""
    try:
        doc = json.loads((slurm_dir(jdir) / STOP_REQUEST).read_text())
        ask = build_document(StopFile, doc, "stop request")  # refuses NaN, negatives
    except (OSError, ValueError, StateError):
        return None
    return ask if ask.grace_s <= MAX_GRACE_S else None


def write_checkpoint_request(jdir: Path) -> float:
    """Ask every node agent to forward the checkpoint signal; return when it was asked."""
    write_bytes_atomic(slurm_dir(jdir) / CHECKPOINT_REQUEST, str(time.time()).encode())
    return time.time()


def write_record(jdir: Path, run: int, rec: NodeRecord, *, keep_from_agent: bool) -> None:
    """Publish ``rec``; ``keep_from_agent``: a sweep job keeps the agent's rank, agent, main."""
    path = record_path(jdir, run, rec.node)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    if keep_from_agent:
        with contextlib.suppress(OSError, ValueError, StateError):
            agent = build_document(NodeRecord, json.loads(path.read_text()), str(path))
            rec = replace(rec, rank=agent.rank, agent=agent.agent, main=agent.main)
    write_json_atomic(path, asdict(rec), durable=False)


def read_records(jdir: Path, run: int) -> list[NodeRecord]:
    """What each node agent published about run ``run``, by node; unreadable ones skipped."""
    out = []
    for path in sorted(slurm_dir(jdir).glob(f"run-{run}.*.json")):
        try:
            out.append(build_document(NodeRecord, json.loads(path.read_text()), str(path)))
        except (OSError, ValueError, StateError):
            continue
    return out


def node_log_path(jdir: Path, run: int, node: str, *, first: bool) -> Path:
    """The first node writes logs/run-N.log; every other node its own run-N.NODE.log.

    One file per node keeps each node's lines apart (`trainctl logs --node NODE`), and
    the first node's log, where rank 0 reports its progress, stays where it always is.
    """
    log = log_path(jdir, run)
    return log if first else log.with_name(f"run-{run}.{node}.log")


def first_node(rec: NodeRecord) -> bool:
    """The node whose log is the run's own log (rank 0, or a rank never published)."""
    return rec.rank in (None, "", "0")
