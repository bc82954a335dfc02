"""`trainctl stop NAME`: the checkpoint look first, then the stop, narrated live."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from trainctl.launcher import backends, render
from trainctl.launcher.checkpoint import newest_checkpoint, save_cadence, wait_next_save
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import confirm, parse_duration, parse_seconds
from trainctl.launcher.live import run_with_feedback, run_with_ticker
from trainctl.launcher.ops import queue
from trainctl.launcher.ops.jobs import live_jobs
from trainctl.launcher.ops.plan import plan_stop
from trainctl.launcher.ops.stop import (
    ask_checkpoint,
    check_checkpoint,
    dequeue,
    finish_unclaimed,
    stop_exit_code,
    stop_job,
)
from trainctl.launcher.ops.stop import stop_order_of as resolve_order
from trainctl.launcher.results import CheckpointInfo
from trainctl.supervisor.errors import ConfigError
from trainctl.supervisor.model import state
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import job_dir
from trainctl.supervisor.records import record

from . import Invocation

T = TypeVar("T")

DEFAULT_CHECKPOINT_TIMEOUT = "10m"


@record(frozen=True)
class CheckpointFlags:
    """`--checkpoint`, `--checkpoint-timeout`, `--require-checkpoint-within`, `--force`."""

    ask: bool = False  # --at checkpoint (--checkpoint): ask by signal, wait for it
    timeout: str = DEFAULT_CHECKPOINT_TIMEOUT
    within: str | None = None
    force: bool = False  # past the age limit; for stop, also end a mute supervisor
    next_save: bool = False  # --at next-checkpoint: wait for the trainer's own next save


NO_CHECKPOINT = CheckpointFlags()  # the flags' defaults: show the newest, ask for nothing


def prepare(
    inv: Invocation, name: str, flags: CheckpointFlags, *, quiet: bool = False
) -> CheckpointInfo:
    """Before a stop or restart: show the newest checkpoint, check its age, ask for one.

    Everything here happens before any stop signal; a refusal changes nothing.
    """
    ask = flags.ask
    timeout_s = parse_duration(flags.timeout, "--checkpoint-timeout")
    within = flags.within
    within_s = None if within is None else parse_duration(within, "--require-checkpoint-within")
    say = (lambda _line: None) if quiet else render.line
    info, spec, overridden = check_checkpoint(
        inv.home, name, require_within_s=within_s, ask=ask or flags.next_save, force=flags.force
    )
    if spec is None or spec.watch.checkpoint is None:
        return info
    say(render.checkpoint_line(info.newest, spec.watch.checkpoint, spec.cwd))
    if overridden is not None:
        say(f"no checkpoint within the limit ({overridden}); going ahead (--force)")
    if flags.next_save:
        return _await_next_save(inv, name, spec, info, timeout_s, quiet=quiet)
    if not ask:
        return info
    sig = spec.watch.checkpoint_signal
    asked = (lambda: None) if quiet else lambda: say(f"asking for a checkpoint ({sig}) ...")
    t0 = time.monotonic()

    def waiting() -> str:
        took = time.monotonic() - t0
        text = (
            f"waiting for the checkpoint ({sig}): {render.age(took)}, "
            f"{render.age(max(0.0, timeout_s - took))} left"
        )
        ck = newest_checkpoint(spec)
        if ck is not None and ck.mtime >= time.time() - took - 0.01:
            where = render.as_written(ck.path, spec.watch.checkpoint or "", spec.cwd)
            text += f"; writing {where} ({render.size(ck.size)})"
        return text

    new = run_with_ticker(
        lambda: ask_checkpoint(inv.home, name, spec, timeout_s, asked), waiting, enabled=not quiet
    )
    if new is None:
        return info
    where = render.as_written(new.path, spec.watch.checkpoint or "", spec.cwd)
    say(f"checkpoint written: {where} ({new.size} bytes)")
    return CheckpointInfo(watched=True, newest=info.newest, written=new)


def _await_next_save(
    inv: Invocation,
    name: str,
    spec: Spec,
    info: CheckpointInfo,
    timeout_s: float,
    *,
    quiet: bool,
) -> CheckpointInfo:
    """--at next-checkpoint: signal nothing; wait for the trainer's own next complete save
    (a trainer with no handler that saves every N steps loses no step), then go at once.
    A Ctrl-C meanwhile ends the command and changes nothing (no signal was sent)."""
    jdir = job_dir(inv.home, name)
    st = state.read_state(jdir)
    run_no = st.run
    asked_at, t0 = time.time(), time.monotonic()
    watch = backends.of(st).watch_run(jdir, run_no)  # its end, the backend's way

    def running() -> bool:
        return not watch.over()

    def waiting() -> str:
        return _waiting_line(spec, t0, timeout_s, jdir, run_no)

    new = run_with_ticker(
        lambda: wait_next_save(spec, asked_at, timeout_s, running), waiting, enabled=not quiet
    )
    if new is None:
        return info
    if not quiet:
        shown = render.as_written(new.path, spec.watch.checkpoint or "", spec.cwd)
        at = "" if new.step is None else f" (step {new.step:g})"
        render.line(f"the job saved {shown}{at}: stopping it now")
    return CheckpointInfo(watched=True, newest=info.newest, written=new)


def _waiting_line(spec: Spec, since: float, timeout_s: float, jdir: Path, run: int) -> str:
    """The live line while waiting for the next save: when the last one was and how
    often they come ("last save at step 3500, 4m ago; saves every ~5m")."""
    took = time.monotonic() - since
    ck = newest_checkpoint(spec, jdir, run)
    last = "no complete save yet"
    if ck is not None:
        at = "" if ck.step is None else f" at step {ck.step:g}"
        last = f"last save{at}, {render.age(ck.age_s)} ago"
    every = save_cadence(spec)
    cadence = f"; saves every ~{render.age(every)}" if every else ""
    left = render.age(max(0.0, timeout_s - took))
    return f"waiting for the next checkpoint ({left} left): {last}{cadence}"


def run(
    inv: Invocation,
    name: str,
    *,
    grace: str | None = None,
    order: str | None = None,
    main_only: bool = False,
    gpu_timeout: str | None = None,
    ckpt: CheckpointFlags = NO_CHECKPOINT,
    as_json: bool = False,
    verbose: bool = False,
    dry_run: bool = False,
) -> int:
    """Stop job NAME; exit 0 only when nothing of it survives and its GPUs are free."""
    # every flag is checked before anything is done
    grace_s = None if grace is None else parse_seconds(grace, "--grace")
    gpu_s = None if gpu_timeout is None else parse_seconds(gpu_timeout, "--gpu-timeout")
    how = resolve_order(order, main_only=main_only)
    if dry_run:
        return _dry_run(inv, name, as_json=as_json)
    if (left := _dequeue(inv, name, as_json=as_json)) is not None:
        return left
    pre = prepare(inv, name, ckpt, quiet=as_json)
    home, force = inv.home, ckpt.force
    res = run_with_feedback(
        job_dir(home, name),
        name,
        lambda: stop_job(home, name, grace_s=grace_s, order=how, gpu_timeout_s=gpu_s, force=force),
        enabled=not as_json,
    )
    if isinstance(res, int):
        return res  # Ctrl-C: said what happens to the stop
    doomed = queue.doomed_by_stop(home, name)  # after: also those already failed for it
    if doomed:
        res.warnings.append(
            f"note: the queued job(s) waiting for {name} can no longer start and end failed "
            f"(cause dependency): {', '.join(doomed)}"
        )
    inv.reply(render.stop_doc(res, pre)) if as_json else render.show(
        render.stop(res, verbose=verbose)
    )
    return stop_exit_code(res)


def note_unclaimed(*, wait: bool) -> None:
    """After the command: a stop sent before the verb loaded that the verb never read
    (it failed first) is waited for and said, on stderr (see ops.stop.finish_unclaimed)."""
    for text in finish_unclaimed(wait=wait):
        render.error_line(f"note: {text}")


def _dry_run(inv: Invocation, name: str, *, as_json: bool) -> int:
    """What the stop would do: its members and their order, the checkpoint, the GPUs."""
    if queue.read_entry(inv.home, name) is not None and not queue.has_live_run(inv.home, name):
        doc = {"name": name, "state": "queued", "queued": True, "members": []}
        if as_json:
            inv.reply(doc)
        else:
            render.line(f"{name} is queued: a stop would dequeue it; nothing of it runs")
        return ExitCode.OK
    p = plan_stop(inv.home, name)
    inv.reply(p.to_doc()) if as_json else render.show(render.stop_plan(p))
    return ExitCode.OK


def _dequeue(inv: Invocation, name: str, *, as_json: bool) -> int | None:
    """A queued job leaves the queue: nothing of it starts. Its exit code when that is
    all there is to stop; None when a live run of it must be stopped as well."""
    d = dequeue(inv.home, name)
    if d is None:
        return None
    if d.live:
        if not as_json:  # under --json (and in `trainctl mcp`) only the document goes out
            render.line(f"dequeued the next run of {name} (run {d.run}); stopping the live one")
        return None
    if as_json:
        inv.reply(d.to_doc())
    else:
        render.line(f"dequeued {name}: run {d.run} never started, nothing ran")
    return ExitCode.OK


def _each(
    inv: Invocation, docs: list[object], as_json: bool, step: Callable[[Invocation, bool], T]
) -> T:
    """Run one job's step; with ``as_json`` its documents join ``docs`` (one list)."""
    return step(inv.keeping(docs), True) if as_json else step(inv, False)


def _dequeue_first(
    inv: Invocation, names: list[str], codes: list[int], docs: list[object], *, as_json: bool
) -> list[str]:
    """Take every queued run out of the queue; return the names with a live run to stop.

    First, because stopping a live job frees its GPUs and ends its dependents' wait: a
    queued job must not be dispatched in between (with the old order, 1 round in 9 was).
    """
    left = []
    for name in names:

        def dequeue_one(i: Invocation, j: bool, n: str = name) -> int | None:
            return _dequeue(i, n, as_json=j)

        code = _each(inv, docs, as_json, dequeue_one)
        if code is None:
            left.append(name)
        else:
            codes.append(code)
    return left


def run_many(
    inv: Invocation,
    names: tuple[str, ...],
    *,
    every: bool = False,
    yes: bool = False,
    as_json: bool = False,
    **opts: Any,
) -> int:
    """`stop A B ...` / `stop --all`: each job in turn; the worst exit code wins.

    Every name is checked before anything is stopped (an unknown one changes nothing);
    `--all` takes the live jobs of the home and asks first on a terminal (`--yes`: don't).
    """
    if every and names:
        raise ConfigError("stop: give job names or --all, not both")
    if not every and not names:
        raise ConfigError("stop: name a job (or several), or --all for every live job")
    chosen = (
        list(dict.fromkeys(names))
        if names
        else list(dict.fromkeys([*live_jobs(inv.home), *queue.queued_names(inv.home)]))
    )
    for name in chosen:
        queue.known(inv.home, name)
    if every:
        if not chosen:
            render.line(f"no live jobs in {inv.home}; nothing to stop")
            return ExitCode.OK
        if not opts.get("dry_run"):
            confirm(f"stop {len(chosen)} job(s): {', '.join(chosen)}?", yes=yes, flag="--yes")
    if len(chosen) == 1 and not every:
        return run(inv, chosen[0], as_json=as_json, **opts)
    codes: list[int] = []
    docs: list[object] = []
    if not opts.get("dry_run"):
        chosen = _dequeue_first(inv, chosen, codes, docs, as_json=as_json)
    for name in chosen:

        def stop_one(i: Invocation, j: bool, n: str = name) -> int:
            return run(i, n, as_json=j, **opts)

        codes.append(_each(inv, docs, as_json, stop_one))
    if as_json:
        inv.reply(docs)
    return max(codes)
