"""`trainctl start`: merge spec file < --set < flags, check, start, maybe follow."""

from __future__ import annotations

import os
from pathlib import Path

from trainctl.launcher import backends, render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import parse_env, parse_seconds, parse_signal
from trainctl.launcher.ops.queue import QueueAsk, dispatch
from trainctl.launcher.ops.start import default_name, ended_at_once, resolve_spec, start_watch_s
from trainctl.launcher.results import GpuRequest, Queued, StartResult
from trainctl.launcher.specfile import SpecDraft, load_spec_file, parse_sets
from trainctl.supervisor.errors import ConfigError
from trainctl.supervisor.model.spec import parse_order
from trainctl.supervisor.records import asdict, record, replace

from . import Invocation
from .logs import follow_new_run


@record(frozen=True)
class StartFlags:
    """The command-line flags of `start`, as given (None: not given)."""

    name: str | None = None
    spec_file: str | None = None
    sets: tuple[str, ...] = ()
    cwd: str | None = None
    env: tuple[str, ...] = ()
    grace: str | None = None
    stop_signal: str | None = None
    stop_order: str | None = None
    gpus: str | None = None
    min_gpus: int | None = None
    share: bool = False
    force: bool = False
    backend: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    partition: str | None = None
    time_limit: str | None = None
    sbatch_args: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    queue: bool = False  # --queue: wait for the GPUs
    after: tuple[str, ...] = ()
    singleton: str | None = None  # "name" or "spec"
    backfill: bool = False
    tty: bool = False  # --tty: main on a pseudo-terminal, for `trainctl attach`
    no_wait: bool = False  # --no-wait: return at exec, not after the first second
    from_scratch: bool = False  # --from-scratch: hand no checkpoint, arm no guard

    def ask(self) -> QueueAsk:
        """What the flags ask of the queue."""
        return QueueAsk(
            queue=self.queue,
            after=self.after,
            singleton=self.singleton == "name",
            singleton_spec=self.singleton == "spec",
            backfill=self.backfill,
        )


def layers(f: StartFlags) -> tuple[SpecDraft, SpecDraft]:
    """The spec file's keys, and what --set and the flags give over them (each checked)."""
    # a --cwd replaces the file's cwd, which then need not exist here
    given_cwd = f.cwd or any(s.strip().startswith("cwd=") for s in f.sets)
    file_draft = (
        load_spec_file(f.spec_file, check_cwd=not given_cwd) if f.spec_file else SpecDraft()
    )
    draft = parse_sets(f.sets)
    if f.nodes is not None and f.nodes < 1:
        raise ConfigError("--nodes must be >= 1")
    flags = SpecDraft(
        name=f.name,
        argv=list(f.argv) or None,
        cwd=os.path.abspath(os.path.expanduser(f.cwd)) if f.cwd else None,
        env=parse_env(f.env) or None,
        grace=None if f.grace is None else parse_seconds(f.grace, "--grace"),
        stop_signal=None if f.stop_signal is None else parse_signal(f.stop_signal),
        stop_order=None if f.stop_order is None else str(parse_order(f.stop_order, "--stop-order")),
        gpus=f.gpus,
        min_gpus=f.min_gpus,
        share=f.share or None,
        force=f.force or None,
        backend=f.backend,
        nodes=f.nodes,
        gpus_per_node=f.gpus_per_node,
        partition=f.partition,
        time=f.time_limit,
        sbatch_args=list(f.sbatch_args) or None,
        tty=f.tty or None,
    )
    draft = draft.merged(flags)
    merged = file_draft.merged(draft)
    if (merged.share or merged.force) and not merged.gpus:
        raise ConfigError("--share and --force only make sense with --gpus")
    return file_draft, draft


def run(inv: Invocation, f: StartFlags, *, follow: bool = False, as_json: bool = False) -> int:
    """Start the job; with --follow, stream its log until it ends (Ctrl-C only detaches)."""
    watch_s = 0.0 if f.no_wait else start_watch_s()  # a bad setting: before anything starts
    file_draft, cli = layers(f)
    draft = file_draft.merged(cli)
    if not draft.name and draft.argv:
        name = default_name(inv.home, draft)
        draft = replace(draft, name=name)
        cli = replace(cli, name=name)
        if not as_json:
            render.line(f"no --name given: the job is named {name}")
    backends.backend(draft.backend).check_values(draft)
    spec_file = os.path.abspath(f.spec_file) if f.spec_file else None
    spec = resolve_spec(draft, inv.cfg, spec_file)
    if spec_file:
        spec = replace(
            spec,
            file_keys=file_draft.given(),
            cli_keys=cli.given(),
            file_mtime=os.stat(spec_file).st_mtime,
        )
    request = (
        GpuRequest(draft.gpus, share=bool(draft.share), force=bool(draft.force))
        if draft.gpus
        else None
    )
    got = dispatch.start_or_queue(
        inv.home, spec, inv.cfg, request, f.ask(), from_scratch=f.from_scratch
    )
    if isinstance(got, Queued):
        inv.reply(got.to_doc()) if as_json else render.show(render.queued(got))
        return ExitCode.OK
    return _started(inv, got, spec.name, watch_s, follow=follow, as_json=as_json)


def _started(
    inv: Invocation, res: StartResult, name: str, watch_s: float, *, follow: bool, as_json: bool
) -> int:
    """Say the run started; watch its first moments (or follow it): how it ended, if it did."""
    ended = None
    if res.main_pid and watch_s > 0 and not follow:
        ended = ended_at_once(inv.home, res.name, res.run, watch_s)
    if as_json:
        # "state" tells a script a start from a queued one (`"state": "queued"`)
        live = "running" if res.main_pid else "submitted"
        doc = {**asdict(res), "state": ended.state if ended else live}
        if ended is not None:
            doc["cause"] = ended.cause
            doc["exit_code"] = ended.exit_code
        inv.reply(doc)
    else:
        render.show(render.start(res))
        if ended is not None:
            render.show(render.ended_at_once(ended))
    if follow:
        follow_new_run(inv, name, Path(res.log))
        ended = ended_at_once(inv.home, res.name, res.run, 0.0)
        if ended is not None and ended.failed:
            render.show(render.ended_at_once(ended, shown_log=True))
    return ExitCode.FAILED if ended is not None and ended.failed else ExitCode.OK
