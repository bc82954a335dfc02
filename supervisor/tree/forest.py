"""Who gets the stop signal, and when: the stop orders ``tree``, ``all`` and ``main``.

``tree`` (the default) exists because of PyTorch's DataLoader workers. A worker installs a
C-level SIGTERM handler that exits quietly only when the sender is its parent; SIGTERM
from anyone else kills it, and its rank raises "DataLoader worker (pid N) is killed by
signal" at the next batch, before it can write its checkpoint. So the stop signal goes to
the top of the job's process forest first, and below a process only once that process
has exited:

- a *root* is a live member whose parent is not a live member: main, an escaper, an
  orphan that reparented to the supervisor. Roots get the signal at once, and so does a
  member that becomes a root because its parent exited;
- a process that does not catch the signal (``SigCgt``) protects nothing: it dies at once
  (or ignores the signal and never exits on it), so its children get the signal at once;
- nor does a signalled process that then just blocks in ``wait()`` (``wchan`` ``do_wait``,
  ``WAIT_RELEASE_S`` after the signal) while all its children are ones it had before the
  signal: a parent written for Ctrl-C, which expects the signal to reach its children
  through the process group, would otherwise wait out the grace beside them. A parent
  waiting on a child it started after the signal (a checkpoint upload) keeps shielding;
- a *launcher* (torchrun, ``accelerate launch``, deepspeed, or any parent that catches the
  signal and whose children lead their own sessions) forwards the signal to its workers'
  process groups, which would hit their loaders too. It is skipped: its children are
  treated as roots, and it gets the signal itself only once it has no live child (its
  own shutdown, and its 30 s SIGKILL timer, then never start while a worker checkpoints).
  It gets the signal once nothing below it would still act on one: every descendant left
  ignores the signal (the shells of a tmux server, which only the server's SIGHUP winds
  down), or none is left. In that last case it first gets ``launcher_linger_s`` to exit
  by itself, as torchrun does once every worker succeeded: a signal that lands during its
  interpreter's shutdown would turn its exit code 0 into 143.

``all`` signals every member at once (Slurm's behaviour; what trainctl did before), and
``main`` signals main alone, then every other member once main has exited.
"""

from __future__ import annotations

import os
import time

from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model.procs import ProcRef
from trainctl.supervisor.model.spec import StopOrder
from trainctl.supervisor.records import field, record

from .proctree import Member

# Programs that forward the stop signal to their workers' process groups. Matched on the
# program (argv[0]) or, under a Python interpreter, on the script or the `-m` module: a
# training script that merely mentions "torchrun" among its arguments is not a launcher.
_LAUNCHER_PROGRAMS = frozenset({"torchrun", "deepspeed"})
_LAUNCHER_MODULES = frozenset(
    {
        "torch.distributed.run",
        "torch.distributed.launch",
        "deepspeed.launcher.runner",
        "deepspeed.launcher.launch",
        "accelerate.commands.launch",
    }
)
_PY_OPTS_WITH_VALUE = frozenset({"-X", "-W", "-Q"})
# A signalled parent still blocked in wait() this long after the signal is waiting for its
# children to exit, not checkpointing with their help: they get the signal too.
WAIT_RELEASE_S = 0.5


def launcher_by_cmdline(argv: list[str]) -> str | None:
    """Name the launcher ``argv`` runs (``torchrun``, ``accelerate launch``, ...), if any."""
    if not argv:
        return None
    prog = os.path.basename(argv[0])
    rest = argv[1:]
    if prog.startswith("python"):
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            rest = rest[2:] if rest[0] in _PY_OPTS_WITH_VALUE else rest[1:]
        if rest[:1] == ["-m"]:
            module = rest[1] if len(rest) > 1 else ""
            return f"python -m {module}" if module in _LAUNCHER_MODULES else None
        if not rest:
            return None
        prog, rest = os.path.basename(rest[0]), rest[1:]
    if prog in _LAUNCHER_PROGRAMS:
        return prog
    if prog == "accelerate" and rest[:1] == ["launch"]:
        return "accelerate launch"
    return None


@record()
class Planner:
    """Decides, from the live members at each moment, who is due the stop signal now.

    It remembers what it decided (a launcher stays a launcher; a process that was
    protecting its children keeps protecting them until it exits), so a re-scan never
    undoes an earlier decision.
    """

    order: StopOrder
    sig: int
    main: ProcRef | None
    launcher_linger_s: float = 2.0
    sent: dict[ProcRef, float] = field(default_factory=dict)  # ref -> monotonic send time
    launchers: dict[ProcRef, str] = field(default_factory=dict)  # ref -> why
    _not_launcher: set[ProcRef] = field(default_factory=set)
    _protects: dict[ProcRef, bool] = field(default_factory=dict)
    _idle_since: dict[ProcRef, float] = field(default_factory=dict)  # launcher, no workers
    _released: set[ProcRef] = field(default_factory=set)  # signalled, then blocked in wait()
    _kids_when_sent: dict[ProcRef, set[ProcRef]] = field(default_factory=dict)

    def due(self, live: list[Member]) -> list[Member]:
        """Return the live members that should get the stop signal now and have not."""
        if self.order is StopOrder.ALL:
            return [m for m in live if m.ref not in self.sent]
        if self.order is StopOrder.MAIN:
            main = [m for m in live if m.ref == self.main]
            if main:
                return [m for m in main if m.ref not in self.sent]
            return [m for m in live if m.ref not in self.sent]
        return self._due_tree(live)

    def _due_tree(self, live: list[Member]) -> list[Member]:
        by_pid = {m.stat.pid: m for m in live}
        kids: dict[int, list[Member]] = {}
        stack: list[Member] = []
        for m in live:
            parent = by_pid.get(m.stat.ppid)
            # a parent starts no later than its child; anything else is a recycled ppid
            if parent is not None and parent.stat.start_ticks <= m.stat.start_ticks:
                kids.setdefault(parent.stat.pid, []).append(m)
            else:
                stack.append(m)
        out: list[Member] = []
        while stack:
            m = stack.pop()
            children = kids.get(m.stat.pid, [])
            if children and self._is_launcher(m, children):
                if not self._inert_below(m, kids):
                    stack.extend(children)  # the launcher waits; its workers are the roots
                    continue
            elif not children and m.ref in self.launchers and not self._lingered(m.ref):
                continue  # its workers are gone: let it exit by itself first
            if m.ref not in self.sent:
                out.append(m)
                self._kids_when_sent[m.ref] = {c.ref for c in children}
            if children and not (self._protecting(m) and not self._waits_on_old_kids(m, children)):
                stack.extend(children)
        return out

    def _inert_below(self, m: Member, kids: dict[int, list[Member]]) -> bool:
        """Tell whether every live descendant of ``m`` ignores the signal."""
        stack = list(kids.get(m.stat.pid, ()))
        while stack:
            d = stack.pop()
            if not procfs.ignores(d.stat.pid, self.sig):
                return False
            stack.extend(kids.get(d.stat.pid, ()))
        return True

    def _waits_on_old_kids(self, m: Member, children: list[Member]) -> bool:
        """Tell whether ``m`` was signalled, then blocked in wait() on children it had then."""
        if m.ref in self._released:
            return True
        sent = self.sent.get(m.ref)
        if sent is None or time.monotonic() - sent < WAIT_RELEASE_S:
            return False
        before = self._kids_when_sent.get(m.ref, set())
        if all(c.ref in before for c in children) and procfs.read_wchan(m.stat.pid) == "do_wait":
            self._released.add(m.ref)  # for good: its children are being signalled now
            return True
        return False

    def _lingered(self, ref: ProcRef) -> bool:
        since = self._idle_since.setdefault(ref, time.monotonic())
        return time.monotonic() - since >= self.launcher_linger_s

    def _is_launcher(self, m: Member, children: list[Member]) -> bool:
        if m.ref in self.launchers:
            return True
        if m.ref in self.sent or m.ref in self._not_launcher:
            return False  # already signalled as a normal process: it forwards by itself
        why = launcher_by_cmdline(procfs.read_argv(m.stat.pid))
        if (
            why is None
            and any(c.stat.sid == c.stat.pid for c in children)
            and procfs.catches(m.stat.pid, self.sig)
        ):
            why = "catches the signal; its children lead their own sessions"
        if why is None:
            # Decided once: the cmdline does not change, and a parent that does not forward
            # now is signalled below, after which the question no longer arises.
            self._not_launcher.add(m.ref)
            return False
        self.launchers[m.ref] = why
        return True

    def _protecting(self, m: Member) -> bool:
        """Tell whether ``m`` shields its children until it exits (it catches the signal)."""
        known = self._protects.get(m.ref)
        if known is None:
            known = self._protects[m.ref] = procfs.catches(m.stat.pid, self.sig)
        return known


def stop_roles(
    live: list[Member], order: StopOrder, sig: int, main: ProcRef | None
) -> dict[ProcRef, str]:
    """Tell, for `trainctl ps`, what a stop would do to each live member right now.

    ``first`` (signalled at once), ``launcher: WHY`` (skipped for its workers, signalled
    once they are gone) or ``after parent`` (signalled once its parent has exited).
    """
    plan = Planner(order, sig, main)
    first = {m.ref for m in plan.due(live)}
    roles = {m.ref: "first" if m.ref in first else "after parent" for m in live}
    roles.update({ref: f"launcher: {why}" for ref, why in plan.launchers.items()})
    return roles
