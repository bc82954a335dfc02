"""The verb table: one module per verb, loaded only when its verb runs.

Each verb module has one ``run(inv, ...) -> int`` that both the click callback
(``cli.py``) and the fast path (``main.py``) call: it calls operations (``ops/``),
renders their records (``render``) and returns the exit code. A new verb is one module
here plus one entry in :data:`VERBS` and its click declaration in ``cli.py``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from trainctl.launcher import render  # every verb prints through it: loaded here costs none
from trainctl.launcher.config import Config, load_config, resolve_home
from trainctl.supervisor.records import field, record


@record(frozen=True)
class Verb:
    """One verb: the module that runs it and the line `trainctl --help` shows."""

    module: str
    summary: str


VERBS: dict[str, Verb] = {
    "start": Verb("start", "Start a job detached, in its own session, on the GPUs given."),
    "stop": Verb("stop", "Stop every process of a job and nothing else; prove it."),
    "restart": Verb("restart", "Stop a job (verified), then start its spec again."),
    "deploy": Verb("deploy", "Bring new code into a running job: checkpoint, gate, rollback."),
    "history": Verb("history", "One row per run of a job: code, end, deploys, rollbacks."),
    "report": Verb("report", "Goodput: productive time, lost time by cause, interruptions."),
    "status": Verb("status", "Show one job's phase, pids, members and last log line."),
    "list": Verb("list_", "List the jobs: phase, run, main pid, members, last log line."),
    "ps": Verb("ps", "Show a job's live process tree."),
    "stack": Verb("stack", "Show the Python stack of every process of a job, grouped."),
    "top": Verb("top", "A live full-screen view of every job and GPU."),
    "gpus": Verb("gpus", "Show every GPU, its lease and who is on it."),
    "logs": Verb("logs", "Print (and follow) a job's log."),
    "attach": Verb("attach", "Type into a --tty job's terminal (pdb, a prompt); detach: C-\\ d."),
    "wait": Verb("wait", "Wait until a job's run ends; exit with its exit code."),
    "rm": Verb("rm", "Remove finished jobs."),
    "prune": Verb("prune", "Remove the jobs that ended more than a given time ago."),
    "queue": Verb("queue", "Show the queued jobs in order; `queue resume` after a reboot."),
    "web": Verb("web", "A local web page of the runs: charts, log tail, stop timelines."),
    "mcp": Verb("mcp_", "Serve trainctl's verbs as MCP tools over stdio (coding agents)."),
    "adopt": Verb("adopt", "Take over a run trainctl did not start (tmux pane, nohup)."),
    "doctor": Verb(
        "doctor", "Report what decides whether jobs survive logout and stop cleanly here."
    ),
    "hosts": Verb("hosts", "List (and check) the host aliases of hosts.toml."),
}


def load(name: str) -> ModuleType:
    """Import the module of verb ``name`` (the first use of a verb pays for its imports)."""
    return importlib.import_module(f"{__name__}.{VERBS[name].module}")


@record()
class Invocation:
    """What every verb gets: the global options, and the config read at most once."""

    home_opt: str | None = None
    _cfg: Config | None = field(default=None, repr=False)
    # --host, for the one verb that serves it itself (`mcp`: each tool call goes there)
    host_opt: str | None = None
    # the --json documents, kept here instead of printed: MCP, the web page's actions and
    # `stop A B --json` take a verb's documents as values (None: print each)
    docs: list[Any] | None = field(default=None, repr=False)

    def reply(self, doc: Any) -> None:
        """Hand over one --json document: kept in ``docs`` when the caller asked, else
        printed (the command line)."""
        if self.docs is not None:
            self.docs.append(doc)
            return
        render.emit_json(doc)

    def keeping(self, docs: list[Any]) -> Invocation:
        """The same invocation (home, config, host), its documents kept in ``docs``."""
        return Invocation(self.home_opt, self._cfg, self.host_opt, docs)

    @property
    def cfg(self) -> Config:
        """The loaded config."""
        if self._cfg is None:
            self._cfg = load_config()
        return self._cfg

    @property
    def home(self) -> Path:
        """The resolved TRAINCTL_HOME (reading the config only if it must)."""
        return resolve_home(self.home_opt, self._cfg)
