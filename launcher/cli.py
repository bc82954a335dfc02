"""The `trainctl` command line: click declarations only.

Each callback hands its options to its verb's ``run()`` (``verbs/``), the same function
the fast path in ``main.py`` calls; errors end in ``exitcodes.exit_for_exception``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from trainctl.supervisor.errors import ConfigError
from trainctl.supervisor.model.spec import BACKENDS

from . import __version__, options, verbs
from .exitcodes import ExitCode, exit_for_exception
from .inputs import closest
from .verbs import Invocation

pass_ctx = click.make_pass_decorator(Invocation)
F = TypeVar("F", bound=Callable[..., Any])


def option(o: options.Opt, help: str | None = None) -> Callable[[F], F]:
    """The click declaration of a table option (``options.py``): the fast path parses
    the same one. ``help``: a verb's own words for it (start's grace is the default)."""
    if o.takes_value:
        return click.option(*o.flags, o.dest, metavar=o.metavar, help=help or o.help)
    return click.option(*o.flags, o.dest, is_flag=True, help=help or o.help)


json_opt = option(options.JSON)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--host",
    metavar="HOST",
    help="Run the command on HOST (an alias from hosts.toml, or any ssh destination) "
    "over ssh [env TRAINCTL_HOST].",
)
@click.option(
    "--home",
    metavar="DIR",
    help="State directory [env TRAINCTL_HOME; default $XDG_STATE_HOME/trainctl].",
)
@click.version_option(__version__, prog_name="trainctl")
@click.pass_context
def cli(ctx: click.Context, host: str | None, home: str | None) -> None:
    """Start, stop and prove-stopped multi-process training jobs.

    Every job runs detached in its own session under a small supervisor; `stop` signals
    every process of the job (however it escaped) and nothing else, waits for it to
    checkpoint, escalates, and verifies that nothing survived.
    """
    # --host is served before click runs (launcher/remote.py), except for `hosts` (local)
    # and `mcp`, whose server runs here and sends each tool call to the host
    ctx.obj = Invocation(home, host_opt=host or os.environ.get("TRAINCTL_HOST") or None)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--name", help="Job name (letters, digits, . _ -); or `name` in the spec.")
@click.option(
    "-c",
    "--spec",
    "spec_file",
    metavar="FILE",
    help="Job spec (TOML, e.g. conf/jobs/demo.toml): every flag has a key; flags override it.",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override one spec key (repeatable), e.g. --set grace=2m --set max_restarts=5.",
)
@click.option("--cwd", metavar="DIR", help="Working directory [default: current].")
@click.option(
    "--env",
    "-e",
    "env",
    multiple=True,
    metavar="KEY=VAL",
    help="Extra environment variable (repeatable).",
)
@option(
    options.GRACE,
    help="Seconds (or 90s, 2m, 1h) between `stop`'s signal and SIGKILL [default from config].",
)
@click.option(
    "--stop-signal", metavar="SIG", help="First signal of `stop`: TERM, INT, ... [default TERM]."
)
@click.option(
    "--stop-order",
    metavar="ORDER",
    help="Default order of `stop`: tree, all or main (see `stop --order`) [default: tree].",
)
@click.option(
    "--gpus",
    metavar="SPEC",
    help="Bind GPUs: 0,3 (indices as nvidia-smi shows them), N >= 1 (pick N free GPUs), all, "
    "or UUIDs. One GPU by index: 3, (trailing comma); 0 means GPU 0. Sets "
    "CUDA_VISIBLE_DEVICES. Omitted: no binding.",
)
@click.option(
    "--min-gpus",
    type=int,
    metavar="N",
    help="After a GPU fault (Xid 79, a lost GPU), restart at once on the healthy GPUs "
    "left, from the newest complete checkpoint, if at least N are; CUDA_VISIBLE_DEVICES "
    "and $TRAINCTL_GPU_COUNT follow. Omitted: the run ends, its cause says how to go on.",
)
@click.option("--share", is_flag=True, help="Allow GPUs leased by another live job.")
@click.option(
    "--force", is_flag=True, help="Allow GPUs with memory in use outside any trainctl job."
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    help="local (default): run here under a supervisor; slurm: submit with sbatch.",
)
@click.option("--nodes", type=int, metavar="N", help="Slurm: nodes (one node agent each).")
@click.option("--gpus-per-node", type=int, metavar="G", help="Slurm: --gpus-per-node.")
@click.option("--partition", metavar="P", help="Slurm: partition.")
@click.option("--time", "time_limit", metavar="T", help="Slurm: time limit (e.g. 2-00:00:00).")
@click.option(
    "--sbatch-arg",
    "sbatch_args",
    multiple=True,
    metavar="ARG",
    help="Slurm: extra sbatch argument, e.g. --sbatch-arg=--exclusive (repeatable).",
)
@click.option(
    "--queue",
    "queue",
    is_flag=True,
    help="When the --gpus are not free, queue the job (state queued) instead of refusing; "
    "it starts when they are, first in, first out.",
)
@click.option(
    "--after",
    multiple=True,
    metavar="JOB[:ok|failed|any]",
    help="Queue the job until JOB's run ends that way (ok by default; repeatable). "
    "If it ends the other way, the queued job ends failed, with that cause.",
)
@click.option(
    "--singleton",
    is_flag=False,
    flag_value="name",
    type=click.Choice(["name", "spec"]),
    help="One run at a time of this name (--singleton), or of this spec (--singleton=spec: "
    "the same spec file, or command and directory): a second start queues behind the first.",
)
@click.option(
    "--backfill",
    is_flag=True,
    help="Queued: may start before earlier queued jobs when the GPUs it asks for are free.",
)
@click.option(
    "--tty",
    is_flag=True,
    help="Run main on a pseudo-terminal the supervisor holds, so that `trainctl attach` "
    "can type into it (breakpoint(), pdb, a prompt). The log still gets all its output.",
)
@click.option("--follow", "-f", is_flag=True, help="Then stream the log; Ctrl-C only detaches.")
@click.option(
    "--from-scratch",
    is_flag=True,
    help="Start over on purpose: hand no checkpoint and arm no checkpoint guard. Without "
    "it, a job whose checkpoint glob has a complete checkpoint is handed the newest one "
    "($TRAINCTL_RESUME_FROM), and a run whose first step is below it is stopped before "
    "its first save. Recorded in history.",
)
@click.option(
    "--no-wait",
    is_flag=True,
    help="Return as soon as main has exec'd. By default start watches the run for 1.5 s "
    "and, when it ended already (a missing script, a bad flag, an import error), says how, "
    "with its last lines, and exits 1.",
)
@json_opt
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@pass_ctx
def start(
    c: Invocation, /, follow: bool, as_json: bool, argv: tuple[str, ...], **options: Any
) -> int:
    """Start ARGV (or the spec's argv) as job NAME, detached; return once main has exec'd.

    \b
    Examples:
      trainctl start --name llama --grace 120 -- torchrun --nproc-per-node 8 train.py
      trainctl start -c conf/jobs/demo.toml --set max_restarts=5
      trainctl start --name eval --queue --gpus 2 -- python eval.py
      trainctl start --name gen --after train:ok -- python gen.py
    """
    _refuse_unknown_option(argv)
    # every other option is a field of StartFlags, by the same name (click names them)
    flags = verbs.load("start").StartFlags(argv=argv, **options)
    return int(verbs.load("start").run(c, flags, follow=follow, as_json=as_json))


AT_CHOICES = ("now", "checkpoint", "next-checkpoint")
_ckpt_opts = [
    click.option(
        "--at",
        "at",
        metavar="WHEN",
        help="When the stop goes out: now (the default); checkpoint: first send the "
        "checkpoint signal (spec checkpoint_signal, default USR2) to the processes that "
        "catch it and wait for the checkpoint it writes; next-checkpoint: signal nothing, "
        "wait for the trainer's own next complete save (a trainer without a handler that "
        "saves every N steps), then stop at once. --dry-run says which this job can do.",
    ),
    click.option(
        "--checkpoint",
        "ask_checkpoint",
        is_flag=True,
        help="The same as --at checkpoint.",
    ),
    click.option(
        "--checkpoint-timeout",
        metavar="DURATION",
        default="10m",  # verbs/stop.py DEFAULT_CHECKPOINT_TIMEOUT
        show_default=True,
        help="How long --at checkpoint|next-checkpoint waits for the checkpoint; none by "
        "then: exit 1, the job untouched.",
    ),
    click.option(
        "--require-checkpoint-within",
        metavar="DURATION",
        help="Refuse when the newest checkpoint is older than this (e.g. 30m).",
    ),
    click.option(
        "--force",
        is_flag=True,
        help="Go ahead despite --require-checkpoint-within; for stop, also end a supervisor "
        "that is alive but does not answer, then stop the job directly.",
    ),
]


def _ckpt(at: str | None, ask: bool, timeout: str, within: str | None, force: bool) -> Any:
    """The checkpoint flags of stop and restart, as the verbs take them."""
    if at is not None and at not in AT_CHOICES:
        close = closest(at, AT_CHOICES)
        hint = f"; did you mean {close}?" if close else ""
        raise click.BadParameter(
            f"{at!r}: use one of {', '.join(AT_CHOICES)}{hint}", param_hint="--at"
        )
    if ask and at not in (None, "checkpoint"):
        raise click.UsageError(f"--checkpoint means --at checkpoint; it contradicts --at {at}")
    ask = ask or at == "checkpoint"
    return verbs.load("stop").CheckpointFlags(ask, timeout, within, force, at == "next-checkpoint")


def ckpt_options(f: Any) -> Any:
    """Add the checkpoint options shared by stop and restart."""
    for opt in reversed(_ckpt_opts):
        f = opt(f)
    return f


def _refuse_unknown_option(argv: tuple[str, ...]) -> None:
    """`start --gracee 5 -- cmd`: a misspelt option, not a command named `--gracee`.

    start passes unknown options through to the job (its argv follows the options, with
    or without `--`), so a typo would otherwise surface as "command not found". A job's
    command never starts with `-`, so such an argv[0] is our usage error.
    """
    if not argv or not argv[0].startswith("-") or argv[0] == "-":
        return
    known = [o for p in start.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
    flag = argv[0].split("=", 1)[0]
    close = closest(flag, known)
    hint = f"; did you mean {close}?" if close else " (see trainctl start --help)"
    raise click.UsageError(f"no such option: {flag}{hint}")


@cli.command()
@click.argument("names", nargs=-1, metavar="NAME...")
@click.option("--all", "every", is_flag=True, help="Stop every live job of the home.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before stop --all.")
@option(options.GRACE)
@option(options.ORDER)
@option(options.MAIN_ONLY)
@click.option(
    "--gpu-timeout",
    metavar="DURATION",
    help="How long to wait for the job's GPUs to be released [default from config: 30].",
)
@ckpt_options
@click.option(
    "--verbose", "-v", is_flag=True, help="A full report: nets, launchers, each process's timing."
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Only show what the stop would do: each member and when it gets the signal, the "
    "launchers, the newest checkpoint and its age, the GPUs. Nothing is signalled.",
)
@json_opt
@pass_ctx
def stop(
    c: Invocation,
    names: tuple[str, ...],
    every: bool,
    yes: bool,
    grace: str | None,
    order: str | None,
    main_only: bool,
    gpu_timeout: str | None,
    at: str | None,
    ask_checkpoint: bool,
    checkpoint_timeout: str,
    require_checkpoint_within: str | None,
    force: bool,
    verbose: bool,
    dry_run: bool,
    as_json: bool,
) -> int:
    """Stop every process of job NAME and nothing else; exit 0 only if none survives.

    Prints the newest checkpoint first (when the spec names a `checkpoint` glob). Also
    exits non-zero when the job's GPUs did not return to their start-time memory use
    within --gpu-timeout, naming who still holds them. Several names (or --all, which
    asks first on a terminal) stop one job after the other; the worst exit code wins.
    """
    return int(
        verbs.load("stop").run_many(
            c,
            names,
            every=every,
            yes=yes,
            grace=grace,
            order=order,
            main_only=main_only,
            gpu_timeout=gpu_timeout,
            ckpt=_ckpt(at, ask_checkpoint, checkpoint_timeout, require_checkpoint_within, force),
            as_json=as_json,
            verbose=verbose,
            dry_run=dry_run,
        )
    )


@cli.command()
@click.argument("name")
@option(options.GRACE)
@click.option(
    "--health",
    metavar="DURATION",
    default="3s",
    show_default=True,
    help="Watch the new run this long; exit 1 with its cause if it dies in it (0: skip).",
)
@click.option(
    "--follow", "-f", is_flag=True, help="Then stream the new run's log (Ctrl-C detaches)."
)
@click.option(
    "--reload",
    is_flag=True,
    help="Take the spec file as it is now (plus the start's --set and flags).",
)
@click.option(
    "--from-scratch",
    is_flag=True,
    help="Start over on purpose: hand no checkpoint, arm no checkpoint guard (recorded "
    "in history). Without it the new run is handed the newest complete checkpoint and "
    "stopped at its first step if that is below it.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Say what the restart would do (the checkpoint handed, the copy kept aside, the "
    "guard's floor) and change nothing.",
)
@click.option(
    "--no-check",
    is_flag=True,
    help="Do not look at the code on disk first (as deploy does: its syntax and imports, "
    "by the job's own Python, running none of it; code that cannot start is refused "
    "before the stop).",
)
@ckpt_options
@json_opt
@pass_ctx
def restart(
    c: Invocation,
    name: str,
    grace: str | None,
    health: str,
    follow: bool,
    reload: bool,
    from_scratch: bool,
    dry_run: bool,
    no_check: bool,
    at: str | None,
    ask_checkpoint: bool,
    checkpoint_timeout: str,
    require_checkpoint_within: str | None,
    force: bool,
    as_json: bool,
) -> int:
    """Stop job NAME (verified), then start its recorded spec again with the code on disk.

    The same GPUs are bound again. Refuses to relaunch while anything of the old run
    survives or its GPUs are still held. The new run is handed the newest complete
    checkpoint ($TRAINCTL_RESUME_FROM) and guarded: if its first reported step is below
    it, it is stopped before its first save and the checkpoint is put back. It is then
    watched for `--health` (3 s): broken code that dies at once makes `restart` exit 1
    with the cause and the last log lines, instead of a success that did not take.
    """
    return int(
        verbs.load("restart").run(
            c,
            name,
            grace=grace,
            ckpt=_ckpt(at, ask_checkpoint, checkpoint_timeout, require_checkpoint_within, force),
            as_json=as_json,
            health=health,
            follow=follow,
            reload=reload,
            from_scratch=from_scratch,
            dry_run=dry_run,
            no_check=no_check,
        )
    )


@cli.command()
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@click.option(
    "--at",
    type=click.Choice(["checkpoint", "next-checkpoint", "now"]),
    help="When to stop the old run: checkpoint (ask for one by signal and wait for it: the "
    "default when a process of the job catches checkpoint_signal), next-checkpoint (wait "
    "for the trainer's own next save, signalling nothing: the default otherwise, when the "
    "job names a checkpoint glob) or now.",
)
@click.option(
    "--resume-tolerance",
    metavar="STEPS",
    default="2",
    show_default=True,
    help="The gate: the new run's first step must be at or past the handed checkpoint's "
    "step minus this, else it started over and is rolled back.",
)
@click.option(
    "--probation",
    metavar="DURATION",
    help="After the gate, a crash or stall rolls back until the new run's first complete "
    "checkpoint, at most this long [default: 30m; 2m for a job without a checkpoint glob]. "
    "deploy returns at the gate; status shows the probation.",
)
@click.option(
    "--health",
    metavar="DURATION",
    help="The gate's limit: the new run must make progress within it (default 10m).",
)
@click.option(
    "--rollback",
    type=click.Choice(["auto", "never"]),
    default="auto",
    show_default=True,
    help="On a failed gate, start the previous code again (needs snapshot = git|copy).",
)
@click.option("--reload", is_flag=True, help="Take the spec file as it is now, too.")
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option("--force", is_flag=True, help="Deploy even when the code has not changed.")
@click.option(
    "--no-check",
    is_flag=True,
    help="Do not look at the new code first. By default the job's own Python compiles its "
    "entry script and the modules beside it, and looks for what they import (running none "
    "of it): code that cannot start is refused before anything is stopped.",
)
@click.option(
    "--checkpoint-timeout",
    metavar="DURATION",
    default="5m",
    show_default=True,
    help="How long to wait for the checkpoint; none within it: nothing is stopped.",
)
@option(options.GRACE)
@click.option(
    "--rolling", is_flag=True, help="Several jobs, one at a time; stop at the first failure."
)
@json_opt
@pass_ctx
def deploy(
    c: Invocation,
    names: tuple[str, ...],
    at: str | None,
    resume_tolerance: str,
    probation: str | None,
    health: str | None,
    rollback: str,
    reload: bool,
    dry_run: bool,
    force: bool,
    no_check: bool,
    checkpoint_timeout: str,
    grace: str | None,
    rolling: bool,
    as_json: bool,
) -> int:
    """Bring the code on disk into running job NAME, checkpoint-gated, with a way back.

    Asks for a checkpoint and waits for it, stops the run (verified), starts the new
    code resuming from that checkpoint ($TRAINCTL_RESUME_FROM), and gates it: the new run
    must make progress within --health. If it does not, the previous code (its snapshot)
    starts again from the same checkpoint. The deploy runs in a process of its own: a
    closed terminal changes nothing. `trainctl history NAME` shows the lineage.
    """
    return int(
        verbs.load("deploy").run(
            c,
            list(names),
            at=at,
            resume_tolerance=resume_tolerance,
            probation=probation,
            health=health,
            rollback=rollback,
            reload=reload,
            dry_run=dry_run,
            force=force,
            checkpoint_timeout=checkpoint_timeout,
            grace=grace,
            rolling=rolling,
            as_json=as_json,
            no_check=no_check,
        )
    )


@cli.command()
@click.option("--port", type=int, default=8765, show_default=True, help="0 picks a free one.")
@click.option(
    "--bind",
    default="127.0.0.1",
    show_default=True,
    help="The address to listen on; another than loopback still needs the token.",
)
@click.option(
    "--allow",
    metavar="ACTIONS",
    help="Buttons that act: stop, restart, deploy (comma-separated). Without: read-only.",
)
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a browser.")
@pass_ctx
def web(c: Invocation, port: int, bind: str, allow: str | None, open_browser: bool) -> int:
    """Serve a local web page of the runs: every job live; per job its charts (progress,
    GPU memory and utilisation, memory against its cap), checkpoints, causes, deploys,
    a log tail that follows and the stacks; the last stop second by second.

    It binds 127.0.0.1 and prints one URL with a random token (as Jupyter does); every
    request needs it. Read-only unless --allow names an action. Over ssh:
    `ssh -L 8765:127.0.0.1:8765 box trainctl web`, then open the URL here
    (`trainctl --host box web` prints that command).
    """
    try:
        module = verbs.load("web")
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in ("starlette", "uvicorn"):
            raise
        raise ConfigError(
            "trainctl web needs its extra: pip install 'trainctl[web]' (starlette, uvicorn)"
        ) from None
    return int(module.run(c, port=port, bind=bind, allow=allow, open_browser=open_browser))


@cli.command()
@click.argument("name")
@json_opt
@pass_ctx
def report(c: Invocation, name: str, as_json: bool) -> int:
    """How much of job NAME's time since its first start was productive (goodput), and
    where the rest went: queued, start-up, restore, checkpoint saves, steps redone, down
    between runs, stalled, deploys; and each interruption with what it cost.

    \b
    From what trainctl records (events, $TRAINCTL_PROGRESS or progress_regex): no change
    to the training code. Without progress reporting it gives what it can and says which
    figures need it.
    """
    return int(verbs.load("report").run(c, name, as_json=as_json))


@cli.command()
@click.argument("name")
@click.option("--read-only", is_flag=True, help="Watch only; keys and resizes go nowhere.")
@click.option(
    "--detach-keys",
    metavar="KEYS",
    help="The keys that detach, comma-separated: ctrl-X or one character [default: ctrl-\\,d].",
)
@pass_ctx
def attach(c: Invocation, name: str, read_only: bool, detach_keys: str | None) -> int:
    """Connect this terminal to job NAME's terminal (a job started with --tty).

    Live output and input, as in a tmux pane: a breakpoint(), pdb or a prompt in the job
    gets what you type, Ctrl-C included (it reaches the job as its terminal's SIGINT,
    never as a trainctl stop). Detach with Ctrl-\\ then d: the job keeps running; attach
    again to see what it wrote meanwhile. One writer at a time; others --read-only.
    Over --host it runs through ssh -t.
    """
    return int(verbs.load("attach").run(c, name, read_only=read_only, detach_keys=detach_keys))


@cli.command()
@click.argument("name")
@json_opt
@pass_ctx
def history(c: Invocation, name: str, as_json: bool) -> int:
    """One row per run of job NAME: when, how long, its code, how it ended, deploys."""
    return int(verbs.load("history").run(c, name, as_json=as_json))


@cli.command()
@click.argument("name", required=False)
@json_opt
@pass_ctx
def status(c: Invocation, name: str | None, as_json: bool) -> int:
    """Show job NAME's phase, pids, uptime, members and last log line (all jobs if no NAME).

    Exit code: 0 running, 3 not running (stopped/exited/failed), 4 supervisor lost.
    """
    return int(verbs.load("status").run(c, name, as_json=as_json))


ALL_HOSTS = click.option(
    "--all-hosts",
    is_flag=True,
    help="Every host of hosts.toml at once, over ssh (a HOST column; a host that does not "
    "answer is a row saying why).",
)


@cli.command(name="list")
@click.option("--all", "show_all", is_flag=True, help="Also jobs that ended over 7 days ago.")
@ALL_HOSTS
@json_opt
@pass_ctx
def list_(c: Invocation, show_all: bool, all_hosts: bool, as_json: bool) -> int:
    """List the jobs with their phase, run, main pid, members and last log line.

    Jobs that ended more than 7 days ago are left out (a line says how many) unless --all.
    """
    return int(verbs.load("list").run(c, show_all=show_all, as_json=as_json, all_hosts=all_hosts))


@cli.command()
@click.argument("name")
@json_opt
@pass_ctx
def ps(c: Invocation, name: str, as_json: bool) -> int:
    """Show job NAME's live process tree; members outside main's tree are marked escaped."""
    return int(verbs.load("ps").run(c, name, as_json=as_json))


@cli.command()
@click.argument("name")
@click.option("--native", is_flag=True, help="Also native (C/C++) frames (py-spy --native).")
@json_opt
@pass_ctx
def stack(c: Invocation, name: str, native: bool, as_json: bool) -> int:
    """Show the Python stack of every process of job NAME, identical stacks grouped.

    Each group lists its pids and ranks (RANK from the environment). Reads through py-spy
    (a dependency on Linux x86_64 and aarch64), which pauses each process for a
    moment and signals nothing.
    """
    return int(verbs.load("stack").run(c, name, native=native, as_json=as_json))


@cli.command()
@click.option(
    "--interval",
    default="1s",
    metavar="DURATION",
    show_default=True,
    help="How often the screen refreshes.",
)
@click.option("--once", is_flag=True, help="Print one frame as plain text and exit.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print one frame as JSON (jobs and GPUs) and exit."
)
@ALL_HOSTS
@pass_ctx
def top(c: Invocation, interval: str, once: bool, as_json: bool, all_hosts: bool) -> int:
    """A live full-screen view of every job and GPU; q quits.

    Each job shows its phase, processes, uptime, and its progress (step, metric
    sparkline, rate, ETA) or else its last log line; each GPU its memory, utilisation,
    lease and holders. Works over --host (ssh gives it a terminal).
    """
    return int(
        verbs.load("top").run(c, interval=interval, once=once, as_json=as_json, all_hosts=all_hosts)
    )


@cli.command()
@ALL_HOSTS
@click.option(
    "--clear",
    metavar="N",
    type=int,
    help="Mark GPU N healthy again (after a reset): runs may be handed it again.",
)
@json_opt
@pass_ctx
def gpus(c: Invocation, all_hosts: bool, clear: int | None, as_json: bool) -> int:
    """Show every GPU: memory, utilisation, the job leasing it, and who is on it.

    Each process is owned by a job (found by its marker), `foreign` (no marker), or
    `orphan` (the marker of a job that is no longer running). A GPU that took a reset-
    or reboot-class fault (its Xid, NVIDIA's action) shows `unhealthy: Xid 79 at 03:12`
    and is handed to no run until a reboot (reboot class) or `--clear N`. Without an
    NVIDIA driver it prints one line and exits 0.
    """
    if clear is not None:
        return int(verbs.load("gpus").clear(c, clear, as_json=as_json))
    return int(verbs.load("gpus").run(c, as_json=as_json, all_hosts=all_hosts))


@cli.command()
@click.argument("name")
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Keep printing new output (across restarts) until the job ends; Ctrl-C stops following.",
)
@click.option(
    "-n",
    "--lines",
    "--tail",
    "lines",
    default=None,
    metavar="N|all",
    help="Print the last N lines, or all (--tail N as docker spells it) "
    "[default: all; with -f, the last 10].",
)
@click.option(
    "--run",
    "run",
    type=int,
    default=None,
    metavar="R",
    help="Show run R instead of the current one.",
)
@click.option(
    "--node",
    default=None,
    metavar="NODE",
    help="Slurm: the log of node NODE (each node past the first writes its own).",
)
@click.option(
    "--raw",
    is_flag=True,
    help="The bytes as the job wrote them: progress bars' carriage-return frames too.",
)
@click.option(
    "--timestamps",
    "-t",
    is_flag=True,
    help="Each line with the time it was written (UTC, to within 0.5 s).",
)
@click.option(
    "--since",
    metavar="D|TIME",
    help="Only the lines written in the last D (10m, 2h) or since TIME (2026-12-02T14:00).",
)
@json_opt
@pass_ctx
def logs(
    c: Invocation,
    name: str,
    follow: bool,
    lines: str | None,
    run: int | None,
    node: str | None,
    raw: bool,
    timestamps: bool,
    since: str | None,
    as_json: bool,
) -> int:
    """Print the log (stdout+stderr) of job NAME.

    `-n N` reads only the end of the file, however big the log is. `-f` starts with the
    last 10 lines (`-n all` for everything) and follows across restarts and rotations.
    A multi-node Slurm job has one log per node: the first node's by default, the others
    with `--node NODE` (`status` lists the nodes). A progress bar that redraws one line
    with carriage returns (tqdm) shows as its latest frame; `--raw` prints every frame.
    """
    return int(
        verbs.load("logs").run(
            c,
            name,
            follow_=follow,
            lines=lines,
            run_no=run,
            node=node,
            raw=raw,
            as_json=as_json,
            timestamps=timestamps,
            since=since,
        )
    )


@cli.command()
@click.argument("name")
@click.option("--timeout", metavar="DURATION", help="Give up after this long (exit 124).")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the run's end (phase, exit code, cause) as JSON."
)
@pass_ctx
def wait(c: Invocation, name: str, timeout: str | None, as_json: bool) -> int:
    """Wait until job NAME's run ends; exit with the job's exit code (128+N for signal N).

    A run that the restart policy relaunches has not ended: `wait` goes on through the
    restarts until the job ends for good. The line (or `--json`) names why it ended.
    """
    return int(verbs.load("wait").run(c, name, timeout=timeout, as_json=as_json))


@cli.command()
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@click.option(
    "--force",
    is_flag=True,
    help="Also remove a job whose state file is corrupt (deletes files only; signals nothing).",
)
@pass_ctx
def rm(c: Invocation, names: tuple[str, ...], force: bool) -> int:
    """Remove finished jobs: their state, events and logs."""
    return int(verbs.load("rm").run(c, names, force=force))


@cli.command()
@click.option(
    "--allow",
    metavar="stop,restart,start",
    help="Mutating tools the agent may call (comma-separated) [default: none: read-only].",
)
@pass_ctx
def mcp(c: Invocation, allow: str | None) -> int:
    """Serve trainctl as MCP tools over stdio, for coding agents (`pip install 'trainctl[mcp]'`).

    \b
    Tools: list_jobs, job_status, job_ps, job_logs, gpus, job_stack, doctor, plan_stop;
    stop_job, restart_job and start_job only when --allow names them. Each returns what
    the verb's --json prints. With --host (before the verb), every tool runs on that host.
    Register it in an agent's MCP configuration as the command `trainctl mcp`.
    """
    try:
        module = verbs.load("mcp")
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "mcp":
            raise
        raise ConfigError(
            "trainctl mcp needs the MCP Python SDK: pip install 'trainctl[mcp]'"
        ) from None
    return int(module.run(c, host=c.host_opt, allow=allow))


@cli.command()
@click.argument("action", required=False, type=click.Choice(["list", "resume"]), default="list")
@json_opt
@pass_ctx
def queue(c: Invocation, action: str, as_json: bool) -> int:
    """Show the queued jobs, first queued first, and what each waits for.

    \b
    `trainctl queue resume` gives every queued job without a waiter a new one: after a
    reboot the queue is still on disk but nothing dispatches it until this runs (or the
    next `trainctl start`). Put it in a @reboot crontab or a user unit to dispatch on boot.
    """
    return int(verbs.load("queue").run(c, action, as_json=as_json))


@cli.command()
@click.option(
    "--older-than",
    metavar="DURATION",
    required=True,
    help="Remove the jobs whose run ended more than this long ago (e.g. 7d, 12h).",
)
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@json_opt
@pass_ctx
def prune(c: Invocation, older_than: str, dry_run: bool, as_json: bool) -> int:
    """Remove every finished job that ended more than --older-than ago.

    Jobs with anything still running, and jobs whose state cannot be trusted, are left
    alone. Their logs go with them.
    """
    return int(verbs.load("prune").run(c, older_than=older_than, dry_run=dry_run, as_json=as_json))


@cli.command()
@click.argument("name")
@click.option("--pid", type=int, metavar="PID", help="PID's session and every descendant.")
@click.option(
    "--tmux",
    metavar="TARGET",
    help="The process tree of each pane of a tmux session, session:window or %pane.",
)
@click.option("--tmux-socket", metavar="PATH", help="The tmux server's socket (tmux -S).")
@click.option("--gpu", metavar="INDEX[,INDEX...]", help="Every process holding those GPUs.")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="A spec key for the adopted run (repeatable), e.g. --set checkpoint=out/ckpt.pt "
    "--set progress_regex='iter (?P<step>\\d+)' --set grace=2m: then `stop --at "
    "next-checkpoint`, the checkpoint guard and progress work for it. Not argv, cwd or env "
    "(read from the process), nor name, backend, gpus or tty.",
)
@click.option("--dry-run", is_flag=True, help="Show the members that would be adopted; stop.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask (needed off a terminal).")
@json_opt
@pass_ctx
def adopt(
    c: Invocation,
    name: str,
    pid: int | None,
    tmux: str | None,
    tmux_socket: str | None,
    gpu: str | None,
    sets: tuple[str, ...],
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> int:
    """Take over a run trainctl did not start (a tmux pane, a nohup'd process) as job NAME;
    without --pid or --tmux, give a lost job (its supervisor gone) a new supervisor.

    It shows the processes it found first (pid, command, how), and refuses, changing
    nothing, another user's process, PID 1, a kernel thread, the tmux server, your own
    shell or its ancestors, sshd, or a member of another trainctl job. A supervisor then
    watches them (in their own cgroup where the host allows it), and `stop`, `status`,
    `logs` and `restart` work as for any job; the exit code of an adopted main is unknown.
    """
    return int(
        verbs.load("adopt").run(
            c,
            name,
            pid=pid,
            tmux=tmux,
            tmux_socket=tmux_socket,
            gpu=gpu,
            sets=sets,
            dry_run=dry_run,
            yes=yes,
            as_json=as_json,
        )
    )


@cli.command()
@json_opt
@pass_ctx
def doctor(c: Invocation, as_json: bool) -> int:
    """Report what decides whether jobs survive logout and stop cleanly on this host.

    Init (systemd or not), logind's KillUserProcesses and KillExcludeUsers, linger, the
    live jobs' systemd scopes and their delegation, the cgroup mode, pidfd. Changes
    nothing; exit 1 when something would make jobs die at logout or stop unreliably.
    """
    return int(verbs.load("doctor").run(c, as_json=as_json))


@cli.command()
@click.option(
    "--check",
    is_flag=True,
    help="Connect to each host: reachable, trainctl found, version compatible.",
)
@json_opt
def hosts(check: bool, as_json: bool) -> int:
    """List the host aliases of hosts.toml (and check them with --check).

    \b
    hosts.toml lives in the config dir (~/.config/trainctl/hosts.toml, or $TRAINCTL_HOSTS);
    conf/hosts.example.toml documents every key.
    """
    return int(verbs.load("hosts").run(Invocation(), check=check, as_json=as_json))


# `trainctl --help` lists each verb with its line from the verb table: one place for it.
for _name, _command in cli.commands.items():
    _command.short_help = verbs.VERBS[_name].summary


def _refuse_empty(param: click.Parameter, inner: Any) -> Any:
    """A parameter callback that refuses an empty value before ``inner`` sees it.

    An empty name, path, host or duration is a slip (an unset shell variable, ``--name
    "$NAME"``), never a choice: `start --name ''` once named the job after its command.
    """

    def check(ctx: click.Context, p: click.Parameter, value: Any) -> Any:
        values = value if isinstance(value, tuple) else (value,)
        if any(v == "" for v in values):
            shown = max(p.opts, key=len) if isinstance(p, click.Option) else p.human_readable_name
            raise click.BadParameter("an empty value; give one or leave it out", param_hint=shown)
        return inner(ctx, p, value) if inner is not None else value

    return check


# Every text parameter of every verb (and the global ones) refuses '' in one place; a
# job's own argv (UNPROCESSED: `python -c ''` is the job's business) is left alone.
for _command in [cli, *cli.commands.values()]:
    for _param in _command.params:
        if _param.type is click.STRING or isinstance(_param.type, click.Path):
            _param.callback = _refuse_empty(_param, _param.callback)


GLOBAL_OPTIONS = {"--home": "DIR", "--host": "HOST"}


def _no_such_option(e: click.exceptions.NoSuchOption) -> str:
    """One style for every unknown option (`no such option: --x; did you mean --y?`), and
    a global option given after the verb is told where it goes."""
    flag = e.option_name.split("=", 1)[0]
    verb = e.ctx.info_name if e.ctx is not None else "VERB"
    if flag in GLOBAL_OPTIONS:
        return (
            f"{flag} is a global option: it goes before the verb "
            f"(trainctl {flag} {GLOBAL_OPTIONS[flag]} {verb} ...)"
        )
    close = list(e.possibilities or [])[:1]  # click's, closest first
    return f"no such option: {flag}" + (f"; did you mean {close[0]}?" if close else "")


def main(argv: list[str] | None = None) -> int:
    """Run click on ``argv``; map every error to one line and an exit code (returned)."""
    try:
        rv = cli.main(args=argv, prog_name="trainctl", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:  # a bare `trainctl`: help, not an error
        click.echo(e.ctx.get_help() if e.ctx else str(e))
        rv = ExitCode.OK
    except click.exceptions.Abort:
        rv = exit_for_exception(KeyboardInterrupt())
    except click.exceptions.NoSuchOption as e:
        click.echo(f"trainctl: error: {_no_such_option(e)}", err=True)
        rv = ExitCode.USAGE
    except click.exceptions.ClickException as e:  # UsageError included
        click.echo(f"trainctl: error: {e.format_message()}", err=True)
        rv = ExitCode.USAGE
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001  (every error: the one mapping)
        rv = exit_for_exception(e)
    return int(rv) if isinstance(rv, int) else 0
