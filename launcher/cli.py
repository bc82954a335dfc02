"""The `trainctl` command line: click declarations only; operations live in api/views."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import click

from trainctl.supervisor.errors import ConfigError, TrainctlError
from trainctl.supervisor.spec import BACKENDS

from . import __version__
from .config import Config, load_config, resolve_home
from .exitcodes import ExitCode, exit_code_for


class Ctx:
    """Per-invocation context: the config and the resolved home."""

    def __init__(self, home: str | None) -> None:
        self._home = home
        self._cfg: Config | None = None

    @property
    def cfg(self) -> Config:
        """Return the loaded config."""
        if self._cfg is None:
            self._cfg = load_config()
        return self._cfg

    @property
    def home(self) -> Path:
        """Return the resolved TRAINCTL_HOME (reading the config only if it must)."""
        return resolve_home(self._home, self._cfg)


pass_ctx = click.make_pass_decorator(Ctx)
json_opt = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


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
    del host  # --host is served before click runs (launcher/remote.py); `hosts` is local
    ctx.obj = Ctx(home)


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
@click.option(
    "--grace",
    metavar="SECONDS",
    help="Seconds between stop signal and SIGKILL [default from config: 60].",
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
@click.option("--follow", "-f", is_flag=True, help="Then stream the log; Ctrl-C only detaches.")
@json_opt
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@pass_ctx
def start(
    c: Ctx,
    name: str | None,
    spec_file: str | None,
    sets: tuple[str, ...],
    cwd: str | None,
    env: tuple[str, ...],
    grace: str | None,
    stop_signal: str | None,
    stop_order: str | None,
    gpus: str | None,
    share: bool,
    force: bool,
    backend: str | None,
    nodes: int | None,
    gpus_per_node: int | None,
    partition: str | None,
    time_limit: str | None,
    sbatch_args: tuple[str, ...],
    follow: bool,
    as_json: bool,
    argv: tuple[str, ...],
) -> int:
    """Start ARGV (or the spec's argv) as job NAME, detached; return once main has exec'd.

    \b
    Examples:
      trainctl start --name llama --grace 120 -- torchrun --nproc-per-node 8 train.py
      trainctl start -c conf/jobs/demo.toml --set max_restarts=5
    """
    from trainctl.supervisor.forest import parse_order  # noqa: PLC0415

    from . import render  # noqa: PLC0415
    from .inputs import parse_env, parse_seconds, parse_signal  # noqa: PLC0415
    from .specfile import load_spec_file, parse_sets  # noqa: PLC0415
    from .start import GpuRequest, resolve_spec, start_job  # noqa: PLC0415

    _refuse_unknown_option(argv)
    values: dict[str, Any] = load_spec_file(spec_file) if spec_file else {}
    values.update(parse_sets(sets))
    flags: dict[str, Any] = {
        "name": name,
        "argv": list(argv) or None,
        "cwd": os.path.abspath(os.path.expanduser(cwd)) if cwd else None,
        "grace": None if grace is None else parse_seconds(grace, "--grace"),
        "stop_signal": None if stop_signal is None else parse_signal(stop_signal),
        "stop_order": None if stop_order is None else str(parse_order(stop_order, "--stop-order")),
        "gpus": gpus,
        "share": share or None,
        "force": force or None,
        "backend": backend,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "partition": partition,
        "time": time_limit,
        "sbatch_args": list(sbatch_args) or None,
    }
    if nodes is not None and nodes < 1:
        raise ConfigError("--nodes must be >= 1")
    values.update({k: v for k, v in flags.items() if v is not None})
    values["env"] = {**values.get("env", {}), **parse_env(env)}
    if (values.get("share") or values.get("force")) and not values.get("gpus"):
        raise ConfigError("--share and --force only make sense with --gpus")
    from . import backends  # noqa: PLC0415

    backends.backend(values.get("backend", "local")).check_values(values)
    spec = resolve_spec(values, c.cfg, os.path.abspath(spec_file) if spec_file else None)
    request = (
        GpuRequest(values["gpus"], share=bool(values.get("share")), force=bool(values.get("force")))
        if values.get("gpus")
        else None
    )
    res = start_job(c.home, spec, c.cfg, request)
    if as_json:
        render.emit_json(dataclasses.asdict(res))
    else:
        render.start(res)
    if follow:
        return _follow(c, spec.name, Path(res.log))
    return ExitCode.OK


def _follow(c: Ctx, name: str, path: Path) -> int:
    from . import render, views  # noqa: PLC0415

    if path.exists():
        render.write(path.read_text(errors="replace"))
    try:
        for chunk in views.follow(c.home, name, path, c.cfg.follow_poll_s):
            render.write(chunk)
    except KeyboardInterrupt:
        click.echo(f"\ndetached; {name} keeps running (trainctl stop {name})", err=True)
    return ExitCode.OK


_ckpt_opts = [
    click.option(
        "--checkpoint",
        "ask_checkpoint",
        is_flag=True,
        help="First send the checkpoint signal (spec checkpoint_signal, default USR2) "
        "to the job processes that catch it, and wait for a new checkpoint.",
    ),
    click.option(
        "--checkpoint-timeout",
        metavar="DURATION",
        default="10m",
        show_default=True,
        help="How long --checkpoint waits for the new checkpoint.",
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


def ckpt_options(f: Any) -> Any:
    """Add the checkpoint options shared by stop and restart."""
    for opt in reversed(_ckpt_opts):
        f = opt(f)
    return f


def _tail_of(lines: str | None, follow: bool, configured: int) -> int | None:
    """`-n N|all` -> how many last lines to print (None: all)."""
    if lines is None:
        return 10 if follow else (configured or None)  # config: 0 = the whole log
    if lines.strip().lower() == "all":
        return None
    try:
        n = int(lines)
    except ValueError:
        raise ConfigError(f"-n expects a number of lines or `all`, got {lines!r}") from None
    if n < 0:
        raise ConfigError("-n must be >= 0")
    return n


def _refuse_unknown_option(argv: tuple[str, ...]) -> None:
    """`start --gracee 5 -- cmd`: a misspelt option, not a command named `--gracee`.

    start passes unknown options through to the job (its argv follows the options, with
    or without `--`), so a typo would otherwise surface as "command not found". A job's
    command never starts with `-`, so such an argv[0] is our usage error.
    """
    if not argv or not argv[0].startswith("-") or argv[0] == "-":
        return
    import difflib  # noqa: PLC0415

    known = [o for p in start.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
    flag = argv[0].split("=", 1)[0]
    close = difflib.get_close_matches(flag, known, n=1)
    hint = f"; did you mean {close[0]}?" if close else " (see trainctl start --help)"
    raise click.UsageError(f"no such option: {flag}{hint}")


def _prepare(
    c: Ctx, name: str, ask: bool, timeout: str, within: str | None, force: bool, as_json: bool
) -> dict[str, Any]:
    from .inputs import parse_duration  # noqa: PLC0415
    from .stop import prepare_stop  # noqa: PLC0415

    return prepare_stop(
        c.home,
        name,
        checkpoint=ask,
        checkpoint_timeout_s=parse_duration(timeout, "--checkpoint-timeout"),
        require_within_s=None
        if within is None
        else parse_duration(within, "--require-checkpoint-within"),
        force=force,
        say=(lambda _l: None) if as_json else click.echo,
    )


@cli.command()
@click.argument("name")
@click.option("--grace", metavar="SECONDS", help="Override the job's grace period.")
@click.option(
    "--order",
    metavar="ORDER",
    help="Who gets the stop signal when: tree (top of the process tree first, a child once "
    "its parent exited; launchers such as torchrun are skipped for their workers), all "
    "(everyone at once), main (main, then the rest once it exited) [default: the job's "
    "stop_order, else tree].",
)
@click.option("--main-only", is_flag=True, help="The same as --order main.")
@click.option(
    "--gpu-timeout",
    metavar="SECONDS",
    help="How long to wait for the job's GPUs to be released [default from config: 30].",
)
@ckpt_options
@json_opt
@pass_ctx
def stop(
    c: Ctx,
    name: str,
    grace: str | None,
    order: str | None,
    main_only: bool,
    gpu_timeout: str | None,
    ask_checkpoint: bool,
    checkpoint_timeout: str,
    require_checkpoint_within: str | None,
    force: bool,
    as_json: bool,
) -> int:
    """Stop every process of job NAME and nothing else; exit 0 only if none survives.

    Prints the newest checkpoint first (when the spec names a `checkpoint` glob). Also
    exits non-zero when the job's GPUs did not return to their start-time memory use
    within --gpu-timeout, naming who still holds them.
    """
    from . import render  # noqa: PLC0415
    from .inputs import parse_seconds  # noqa: PLC0415
    from .stop import stop_exit_code, stop_job, stop_order_of  # noqa: PLC0415

    grace_s = None if grace is None else parse_seconds(grace, "--grace")
    gpu_s = None if gpu_timeout is None else parse_seconds(gpu_timeout, "--gpu-timeout")
    how = stop_order_of(order, main_only=main_only)
    pre = _prepare(
        c, name, ask_checkpoint, checkpoint_timeout, require_checkpoint_within, force, as_json
    )
    from trainctl.supervisor.state import job_dir  # noqa: PLC0415

    from .live import run_with_feedback  # noqa: PLC0415

    res = run_with_feedback(
        job_dir(c.home, name),
        name,
        lambda: stop_job(
            c.home, name, grace_s=grace_s, order=how, gpu_timeout_s=gpu_s, force=force
        ),
        enabled=not as_json,
    )
    if isinstance(res, int):
        return res  # Ctrl-C: said what happens to the stop
    render.stop_doc(res, pre) if as_json else render.stop(res)
    return stop_exit_code(res)


@cli.command()
@click.argument("name")
@click.option("--grace", metavar="SECONDS", help="Override the job's grace period.")
@ckpt_options
@json_opt
@pass_ctx
def restart(
    c: Ctx,
    name: str,
    grace: str | None,
    ask_checkpoint: bool,
    checkpoint_timeout: str,
    require_checkpoint_within: str | None,
    force: bool,
    as_json: bool,
) -> int:
    """Stop job NAME (verified), then start its recorded spec again with the code on disk.

    The same GPUs are bound again. Refuses to relaunch while anything of the old run
    survives or its GPUs are still held.
    """
    from . import render  # noqa: PLC0415
    from .inputs import parse_seconds  # noqa: PLC0415
    from .start import restart_job  # noqa: PLC0415

    grace_s = None if grace is None else parse_seconds(grace, "--grace")
    pre = _prepare(
        c, name, ask_checkpoint, checkpoint_timeout, require_checkpoint_within, force, as_json
    )
    stopped, started = restart_job(c.home, name, c.cfg, grace_s=grace_s)
    if as_json:
        render.emit_json(
            {
                "checkpoint": pre,
                "stop": {"via": stopped.via, "ok": stopped.ok, "report": stopped.report},
                "start": {"run": started.run, "main_pid": started.main_pid, "log": started.log},
            }
        )
    else:
        render.stop(stopped)
        render.start(started)
    return ExitCode.OK


@cli.command()
@click.argument("name", required=False)
@json_opt
@pass_ctx
def status(c: Ctx, name: str | None, as_json: bool) -> int:
    """Show job NAME's phase, pids, uptime, members and last log line (all jobs if no NAME).

    Exit code: 0 running, 3 not running (stopped/exited/failed), 4 supervisor lost.
    """
    from . import render, views  # noqa: PLC0415

    if name is None:
        return _list(c, as_json)
    s = views.job_status(c.home, name)
    render.status_doc(s) if as_json else render.status(s)
    return views.status_exit_code(s)


# `list` shows a finished job for this long after it ended; `list --all` shows every job.
RECENT_S = 7 * 24 * 3600


def _list(c: Ctx, as_json: bool, show_all: bool = False) -> int:
    import time  # noqa: PLC0415

    from . import render, views  # noqa: PLC0415

    rows = views.all_statuses(c.home, brief=not as_json)  # the table shows no training view
    if not show_all:
        cutoff = time.time() - RECENT_S
        kept = [r for r in rows if isinstance(r, tuple) or (r.ended_at or time.time()) >= cutoff]
        if len(kept) < len(rows) and not as_json:
            click.echo(f"({len(rows) - len(kept)} finished more than 7 days ago: list --all)")
        rows = kept
    if as_json:
        render.emit_json(
            [
                r.to_doc()
                if not isinstance(r, tuple)
                else {"name": r[0], "state": "unknown", "error": r[1]}
                for r in rows
            ]
        )
    else:
        render.job_table(rows)
    return ExitCode.OK


@cli.command(name="list")
@click.option("--all", "show_all", is_flag=True, help="Also jobs that ended over 7 days ago.")
@json_opt
@pass_ctx
def list_(c: Ctx, show_all: bool, as_json: bool) -> int:
    """List the jobs with their phase, run, main pid, members and last log line.

    Jobs that ended more than 7 days ago are left out (a line says how many) unless --all.
    """
    return _list(c, as_json, show_all)


@cli.command()
@click.argument("name")
@json_opt
@pass_ctx
def ps(c: Ctx, name: str, as_json: bool) -> int:
    """Show job NAME's live process tree; members outside main's tree are marked escaped."""
    from . import render, views  # noqa: PLC0415

    rows = views.job_ps(c.home, name)
    if as_json:
        render.emit_json([{k: getattr(r, k) for k in r.__slots__} for r in rows])
    else:
        unit = views.job_unit(c.home, name)
        if unit:
            click.echo(f"unit {unit}")
        render.ps(rows, views.job_cwd(c.home, name))
    return ExitCode.OK


@cli.command()
@click.option(
    "--interval",
    default="1s",
    metavar="DURATION",
    show_default=True,
    help="How often the screen refreshes.",
)
@click.option("--once", is_flag=True, help="Print one frame as plain text and exit.")
@pass_ctx
def top(c: Ctx, interval: str, once: bool) -> int:
    """A live full-screen view of every job and GPU; q quits.

    Each job shows its phase, processes, uptime, and its progress (step, metric
    sparkline, rate, ETA) or else its last log line; each GPU its memory, utilisation,
    lease and holders. Works over --host (ssh gives it a terminal).
    """
    from . import top as top_view  # noqa: PLC0415
    from .inputs import parse_duration  # noqa: PLC0415

    every = parse_duration(interval, "--interval")
    if every < 0.1:
        raise ConfigError("--interval must be at least 0.1s")
    if once:
        top_view.print_once(c.home)
    elif not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise ConfigError("top needs a terminal; use `top --once`, `list` or `status --json`")
    else:
        top_view.run(c.home, every)
    return ExitCode.OK


@cli.command()
@json_opt
@pass_ctx
def gpus(c: Ctx, as_json: bool) -> int:
    """Show every GPU: memory, utilisation, the job leasing it, and who is on it.

    Each process is owned by a job (found by its marker), `foreign` (no marker), or
    `orphan` (the marker of a job that is no longer running). Without an NVIDIA driver it
    prints one line and exits 0.
    """
    from trainctl.supervisor.gpu import NoDriverError  # noqa: PLC0415

    from . import render  # noqa: PLC0415
    from .gpus import gpu_views  # noqa: PLC0415

    try:
        views = gpu_views(c.home)
    except NoDriverError as e:
        render.emit_json({"gpus": [], "error": str(e)}) if as_json else click.echo(str(e))
        return ExitCode.OK
    render.emit_json([v.to_doc() for v in views]) if as_json else render.gpus(views)
    return ExitCode.OK


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
    "lines",
    default=None,
    metavar="N|all",
    help="Print the last N lines, or all [default: all; with -f, the last 10].",
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
@pass_ctx
def logs(
    c: Ctx, name: str, follow: bool, lines: str | None, run: int | None, node: str | None
) -> int:
    """Print the log (stdout+stderr) of job NAME.

    `-n N` reads only the end of the file, however big the log is. `-f` starts with the
    last 10 lines (`-n all` for everything) and follows across restarts and rotations.
    A multi-node Slurm job has one log per node: the first node's by default, the others
    with `--node NODE` (`status` lists the nodes).
    """
    from . import render, views  # noqa: PLC0415

    tail = _tail_of(lines, follow, c.cfg.tail_lines)
    path, text = views.log_lines(c.home, name, run, tail, node=node)
    render.write("".join(text))
    if follow:
        try:
            for chunk in views.follow(c.home, name, path, c.cfg.follow_poll_s):
                render.write(chunk)
        except KeyboardInterrupt:
            pass
    return ExitCode.OK


@cli.command()
@click.argument("name")
@click.option("--timeout", metavar="SECONDS", help="Give up after this long (exit 124).")
@pass_ctx
def wait(c: Ctx, name: str, timeout: str | None) -> int:
    """Wait until job NAME's run ends; exit with the job's exit code (128+N for signal N)."""
    from .inputs import parse_seconds  # noqa: PLC0415
    from .jobs import wait_job  # noqa: PLC0415

    timeout_s = None if timeout is None else parse_seconds(timeout, "--timeout")
    try:
        st = wait_job(c.home, name, timeout_s)
    except TimeoutError as e:
        click.echo(f"trainctl: {e}", err=True)
        return ExitCode.TIMEOUT
    return st.exit_code if st.exit_code is not None else ExitCode.OK


@cli.command()
@click.argument("name")
@click.option(
    "--force",
    is_flag=True,
    help="Also remove a job whose state file is corrupt (deletes files only; signals nothing).",
)
@pass_ctx
def rm(c: Ctx, name: str, force: bool) -> int:
    """Remove finished job NAME: its state, events and logs."""
    from .jobs import remove_job  # noqa: PLC0415

    path = remove_job(c.home, name, force=force)
    click.echo(f"removed {name} ({path})")
    return ExitCode.OK


@cli.command()
@json_opt
@pass_ctx
def doctor(c: Ctx, as_json: bool) -> int:
    """Report what decides whether jobs survive logout and stop cleanly on this host.

    Init (systemd or not), logind's KillUserProcesses and KillExcludeUsers, linger, the
    live jobs' systemd scopes and their delegation, the cgroup mode, pidfd. Changes
    nothing; exit 1 when something would make jobs die at logout or stop unreliably.
    """
    from . import render  # noqa: PLC0415
    from .doctor import run_doctor  # noqa: PLC0415

    checks = run_doctor(c.home)
    render.doctor(checks, as_json=as_json)
    return ExitCode.OK if all(ch.ok for ch in checks) else ExitCode.FAILED


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
    from . import render  # noqa: PLC0415
    from .remote import check_host, hosts_path, load_hosts  # noqa: PLC0415

    aliases = load_hosts()
    rows = []
    for h in aliases.values():
        row: dict[str, object] = {
            "name": h.name,
            "target": h.target,
            "port": h.port,
            "prefix": " ".join(h.prefix),
            "trainctl": h.trainctl,
            "home": h.home,
        }
        if check:
            row.update(check_host(h))
        rows.append(row)
    if as_json:
        render.emit_json(rows)
    elif not rows:
        click.echo(f"no host aliases ({hosts_path()} does not define any)")
    else:
        render.hosts(rows)
    failed = check and any(not r.get("trainctl") or not r.get("compatible") for r in rows)
    return ExitCode.REMOTE if failed else ExitCode.OK


def internal_error() -> int:
    import os  # noqa: PLC0415  (error path only)
    import tempfile  # noqa: PLC0415
    import traceback  # noqa: PLC0415

    fd, path = tempfile.mkstemp(prefix="trainctl-crash-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(traceback.format_exc())
    click.echo(f"trainctl: internal error (traceback in {path}); please report it", err=True)
    return ExitCode.INTERNAL


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point: map every error to one line and an exit code."""
    try:
        rv = cli.main(args=argv, prog_name="trainctl", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:  # a bare `trainctl`: help, not an error
        click.echo(e.ctx.get_help() if e.ctx else str(e))
        rv = ExitCode.OK
    except click.exceptions.UsageError as e:
        click.echo(f"trainctl: error: {e.format_message()}", err=True)
        rv = ExitCode.USAGE
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("trainctl: interrupted", err=True)
        rv = ExitCode.INTERRUPTED
    except TrainctlError as e:
        click.echo(f"trainctl: error: {e}", err=True)
        rv = exit_code_for(e)
    except click.exceptions.ClickException as e:
        click.echo(f"trainctl: error: {e.format_message()}", err=True)
        rv = ExitCode.USAGE
    except OSError as e:
        if e.errno is not None and e.filename is not None:
            click.echo(f"trainctl: error: {e.filename}: {e.strerror}", err=True)
            rv = ExitCode.FAILED
        else:
            rv = internal_error()
    except Exception:  # noqa: BLE001  (last resort: never show a traceback to a user)
        rv = internal_error()
    sys.exit(int(rv) if isinstance(rv, int) else 0)
