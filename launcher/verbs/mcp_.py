"""`trainctl mcp`: trainctl's verbs as MCP tools, for coding agents, over stdio.

Built on the official MCP Python SDK (``pip install 'trainctl[mcp]'``; 2.x, whose server
is ``mcp.server.mcpserver.MCPServer``). Each tool returns the very document the verb's
``--json`` prints: locally the verb runs in this process (the same operations, no new
interpreter per call); with ``--host`` it runs as ``trainctl --host HOST VERB --json``,
the CLI's own ssh path. Read-only unless ``--allow`` names ``stop``, ``restart``, ``deploy`` or
``start``; no tool takes a pid, a signal number or a shell string, and every tool that
changes something names a job.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from trainctl.launcher import inputs, verbs
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.ops.jobs import stop_under_way
from trainctl.supervisor.errors import ConfigError, TrainctlError
from trainctl.supervisor.model import state

from . import Invocation

MUTATING = ("stop", "restart", "start", "deploy")
MAX_LOG_LINES = 500
MAX_LOG_BYTES = 64 << 10  # what job_logs returns at most: an agent's context is not a disk
MAX_LINE_CHARS = 2000

INSTRUCTIONS = """\
trainctl runs and stops multi-process GPU training jobs (torchrun, DDP, DataLoader
workers, helpers that setsid away). Use these tools to look at jobs and, when the user
allowed it, to stop, restart or start them.

Never use `kill`, `pkill`, `killall` or `kill -9` on training processes, and never send
Ctrl-C to the tmux pane a job runs in. A training job is a tree of processes: a kill of
one pid misses its workers, which keep the GPUs; `pkill -f python` also kills unrelated
work (other users' jobs, your own tools, this server). trainctl's stop signals every
process of the job and nothing else, gives it its grace period to checkpoint, escalates,
and proves the GPUs were released. Look first: `job_status`, then `plan_stop` (it names
the newest checkpoint and its age), then `stop_job`.
"""


def parse_allow(raw: str | None) -> frozenset[str]:
    """``--allow stop,restart`` -> the mutating tools this server may run."""
    return inputs.parse_allow(raw, MUTATING)


class Tools:
    """The verbs behind the tools: in this process, or on ``host`` over ssh."""

    def __init__(self, inv: Invocation, host: str | None, allowed: frozenset[str]) -> None:
        self.inv, self.host, self.allowed = inv, host, allowed

    def verb(self, name: str, cli: list[str], local: Callable[[Invocation], int]) -> str:
        """Run one verb with --json: its document as the CLI prints it (one text content,
        a list too: the SDK would split a returned list into items), or a ToolError."""
        return json.dumps(self.doc(name, cli, local), indent=2, default=str)

    def doc(self, name: str, cli: list[str], local: Callable[[Invocation], int]) -> Any:
        """Run one verb with --json; its document, or a ToolError with its one line."""
        if self.host is not None:
            return self.remote(name, cli)
        got: list[Any] = []  # the verb's documents, as values: nothing printed, nothing parsed
        inv = Invocation(self.inv.home_opt, docs=got)  # a fresh one: the config is read anew
        try:
            code = local(inv)
        except TrainctlError as e:
            raise ToolError(str(e)) from None
        if not got:
            raise ToolError(f"{name} printed no document (exit {code})")
        return got[0] if len(got) == 1 else got

    def remote(self, name: str, cli: list[str]) -> Any:
        home = ["--home", self.inv.home_opt] if self.inv.home_opt else []
        argv = [sys.executable, "-m", "trainctl.launcher", *home, "--host", self.host or ""]
        done = subprocess.run(
            [*argv, name, *cli, "--json"], capture_output=True, text=True, check=False
        )
        try:
            return json.loads(done.stdout)
        except ValueError:
            line = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise ToolError(line.removeprefix("trainctl: error: ")) from None

    @staticmethod
    def checked(name: str) -> str:
        """A job name, checked before anything touches the file system or a host: the
        one line `invalid job name …` for `../x`, a NUL byte, 65 characters, …"""
        try:
            return state.check_name(name)
        except ConfigError as e:
            raise ToolError(str(e)) from None

    def refuse_unless(self, what: str) -> None:
        if what not in self.allowed:
            raise ToolError(
                f"{what}_job is not allowed on this server: the user starts it with "
                f"`trainctl mcp --allow {what}` to let an agent {what} jobs"
            )


def build(tools: Tools) -> MCPServer[Any]:
    """The server and its tools."""
    server: MCPServer[Any] = MCPServer(
        "trainctl", instructions=INSTRUCTIONS, version=_version(), log_level="WARNING"
    )
    _read_tools(server, tools)
    _changing_tools(server, tools)
    return server


# (tool, verb, description): each returns the verb's --json document, nothing changed
WHOLE_HOME = (
    ("list_jobs", "list", "Every job of the home: state, run, main pid, members, last line."),
    ("gpus", "gpus", "Every GPU: its lease (which job), memory, and who is on it."),
    ("doctor", "doctor", "What decides here whether jobs survive logout and stop cleanly."),
)
ONE_JOB = (
    (
        "job_status",
        "status",
        "One job's status: state, run, pids, members, GPUs, newest checkpoint, progress, why "
        "it ended, its place in the queue. Read this before stopping a job.",
    ),
    ("job_ps", "ps", "A job's live process tree, and what a stop would do to each."),
    (
        "job_history",
        "history",
        "A job's lineage, a run a row: when, how long, its code (commit, dirty), its newest "
        "step, how it ended, and the deploys and rollbacks that touched it.",
    ),
    (
        "job_report",
        "report",
        "A job's goodput: productive time against wall time since its first start, the lost "
        "time by cause (start-up, restore, checkpoint saves, steps redone, down, stalled, "
        "deploys, queued) and each interruption with its cost.",
    ),
    (
        "job_stack",
        "stack",
        "The Python stack of every process of a job, grouped (py-spy): what a hung or slow "
        "run is doing. Changes nothing; the job keeps running.",
    ),
)


def _read_tools(server: MCPServer[Any], tools: Tools) -> None:
    """The tools that only look (always there)."""
    v = verbs.load

    def home_tool(verb: str) -> Callable[[], str]:
        return lambda: tools.verb(verb, [], lambda i: v(verb).run(i, as_json=True))

    def job_tool(verb: str) -> Callable[[str], str]:
        def tool(name: str) -> str:
            tools.checked(name)
            return tools.verb(verb, [name], lambda i: v(verb).run(i, name, as_json=True))

        return tool

    for tool, verb, about in WHOLE_HOME:
        server.add_tool(home_tool(verb), name=tool, description=about)
    for tool, verb, about in ONE_JOB:
        server.add_tool(job_tool(verb), name=tool, description=about)

    @server.tool(
        description=f"The last `lines` lines of a job's log (at most {MAX_LOG_LINES}, and "
        f"at most {MAX_LOG_BYTES // 1024} KiB: the oldest lines go first when over)."
    )
    def job_logs(name: str, lines: int = 100) -> str:
        tools.checked(name)
        if not 1 <= lines <= MAX_LOG_LINES:
            raise ToolError(f"lines must be 1..{MAX_LOG_LINES}, got {lines}")
        doc = tools.doc(
            "logs",
            [name, "-n", str(lines)],
            lambda i: v("logs").run(i, name, lines=str(lines), as_json=True),
        )
        return json.dumps(_capped(doc), indent=2)

    @server.tool(
        description="What stopping a job would do, changing nothing: each member and when it "
        "gets the signal, the launchers, the newest checkpoint and its age, the GPUs."
    )
    def plan_stop(name: str) -> str:
        tools.checked(name)
        return tools.verb(
            "stop",
            [name, "--dry-run"],
            lambda i: v("stop").run(i, name, dry_run=True, as_json=True),
        )


def _changing_tools(server: MCPServer[Any], tools: Tools) -> None:
    """The tools that change something: each refuses unless --allow names it."""
    v = verbs.load

    @server.tool(
        description="Stop every process of a job and nothing else: its stop signal, its grace "
        "to checkpoint, then SIGKILL; proves every process gone and the GPUs released. Use "
        "this, never kill or pkill. Reports progress while the job uses its grace. Only on a "
        "server started with --allow stop."
    )
    async def stop_job(name: str, ctx: Context) -> str:
        tools.checked(name)
        tools.refuse_unless("stop")
        if tools.host is not None:
            doc = await anyio.to_thread.run_sync(tools.remote, "stop", [name])
            return json.dumps(doc, indent=2)
        return await _stop_with_progress(tools, name, ctx)

    @server.tool(
        description="Stop a job (verified), then start its spec again: after a code change. "
        "Only on a server started with --allow restart."
    )
    async def restart_job(name: str) -> str:
        tools.checked(name)
        tools.refuse_unless("restart")
        return await anyio.to_thread.run_sync(
            tools.verb, "restart", [name], lambda i: v("restart").run(i, name, as_json=True)
        )

    _deploy_and_start_tools(server, tools)


def _deploy_and_start_tools(server: MCPServer[Any], tools: Tools) -> None:
    """The changing tools that bring code in: deploy and start (refused unless --allow)."""
    v = verbs.load

    @server.tool(
        description="Bring the code on disk into a running job: a fresh checkpoint, the "
        "verified stop, the new code resuming from it, a gate on its progress (health, e.g. "
        "'10m'), and a rollback to the previous code if the gate fails. Returns the deploy's "
        "report. Only on a server started with --allow deploy."
    )
    async def deploy_job(name: str, health: str | None = None) -> str:
        tools.checked(name)
        tools.refuse_unless("deploy")
        cli = [name, *(["--health", health] if health else [])]
        return await anyio.to_thread.run_sync(
            tools.verb,
            "deploy",
            cli,
            lambda i: v("deploy").run(i, [name], health=health, as_json=True),
        )

    @server.tool(
        description="Start a job, detached: `argv` is the command as a list of words (no "
        "shell), or give `spec_file` (a job spec TOML). Only on a server started with "
        "--allow start."
    )
    async def start_job(
        name: str,
        argv: list[str] | None = None,
        spec_file: str | None = None,
        cwd: str | None = None,
        gpus: str | None = None,
    ) -> str:
        tools.checked(name)
        tools.refuse_unless("start")
        if not argv and not spec_file:
            raise ToolError("give argv (the command as a list) or spec_file")
        cli = [*(["-c", spec_file] if spec_file else []), "--name", name]
        cli += [*(["--cwd", cwd] if cwd else []), *(["--gpus", gpus] if gpus else [])]
        cli += ["--", *(argv or [])]
        flags = v("start").StartFlags(
            name=name, spec_file=spec_file, cwd=cwd, gpus=gpus, argv=tuple(argv or ())
        )
        return await anyio.to_thread.run_sync(
            tools.verb, "start", cli, lambda i: v("start").run(i, flags, as_json=True)
        )


async def _stop_with_progress(tools: Tools, name: str, ctx: Context) -> str:
    """The stop in a worker thread; meanwhile, progress through the grace, twice a second."""
    jdir = state.job_dir(Invocation(tools.inv.home_opt).home, name)
    result: list[str | ToolError] = []
    done = anyio.Event()

    async def stop() -> None:
        try:
            result.append(
                await anyio.to_thread.run_sync(
                    tools.verb, "stop", [name], lambda i: v_stop(i, name)
                )
            )
        except ToolError as e:
            result.append(e)
        done.set()

    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(stop)
        while not done.is_set():
            with anyio.move_on_after(0.5):
                await done.wait()
            going = stop_under_way(jdir) if not done.is_set() else None
            if going is not None:
                took, left = time.monotonic() - t0, max(0.0, going.grace_left_s)
                await ctx.report_progress(took, took + left, f"{left:.0f} s of grace left")
    if isinstance(result[0], ToolError):
        raise result[0]
    return result[0]


def v_stop(inv: Invocation, name: str) -> int:
    """`stop NAME --json`, as the verb runs it (dequeue, checkpoint look, report)."""
    return int(verbs.load("stop").run(inv, name, as_json=True))


def _capped(doc: Any) -> Any:
    """Keep the newest lines that fit MAX_LOG_BYTES, each cut to MAX_LINE_CHARS."""
    if not isinstance(doc, dict) or not isinstance(doc.get("lines"), list):
        return doc
    kept: list[str] = []
    size = 0
    for raw in reversed(doc["lines"]):
        line = str(raw)[:MAX_LINE_CHARS]
        size += len(line.encode()) + 1
        if size > MAX_LOG_BYTES:
            break
        kept.append(line)
    kept.reverse()
    return {**doc, "lines": kept, "truncated": len(kept) < len(doc["lines"])}


def _version() -> str:
    try:
        return version("trainctl")
    except PackageNotFoundError:
        return "0"


def run(inv: Invocation, *, host: str | None = None, allow: str | None = None) -> int:
    """Serve MCP over stdio until the client hangs up."""
    server = build(Tools(inv, host, parse_allow(allow)))
    server.run("stdio")
    return ExitCode.OK
