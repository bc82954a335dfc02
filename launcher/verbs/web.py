"""`trainctl web`: a local web page for the runs (launcher/web/), read-only by default."""

from __future__ import annotations

import contextlib
import io
import ipaddress
import secrets
import socket
import webbrowser
from collections.abc import Callable
from typing import Any

from trainctl.launcher import render, verbs
from trainctl.launcher.exitcodes import ExitCode, exit_code_for
from trainctl.launcher.inputs import parse_allow
from trainctl.launcher.web import app
from trainctl.supervisor.errors import ConfigError, TrainctlError
from trainctl.supervisor.records import JsonObject

from . import Invocation

ACTIONS = ("stop", "restart", "deploy")


def _listen(bind: str, port: int) -> socket.socket:
    """The listening socket, bound here so that --port 0 can say which port it got."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(bind).version == 6 else socket.AF_INET
    except ValueError:
        raise ConfigError(
            f"--bind: {bind!r} is not an IP address (127.0.0.1, ::1, 0.0.0.0)"
        ) from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port: {port} is not a port (0-65535; 0 picks a free one)")
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {bind} port {port}: {e.strerror}") from None
    sock.listen(64)
    return sock


def run(
    inv: Invocation,
    *,
    port: int = 8765,
    bind: str = "127.0.0.1",
    allow: str | None = None,
    open_browser: bool = False,
) -> int:
    """Serve the pages until Ctrl-C."""
    allowed = parse_allow(allow, ACTIONS)
    sock = _listen(bind, port)
    port = sock.getsockname()[1]
    token = secrets.token_urlsafe(24)
    shown = "127.0.0.1" if ipaddress.ip_address(bind).is_unspecified else bind
    url = f"http://{'[' + shown + ']' if ':' in shown else shown}:{port}/?token={token}"
    render.line(url)
    if not ipaddress.ip_address(bind).is_loopback:
        render.line(
            f"listening on {bind}: anyone who can reach port {port} still needs the token "
            "in the URL above; keep it secret"
        )
    if allowed:
        render.line(f"actions allowed: {', '.join(sorted(allowed))}")
    cfg = app.WebConfig(
        inv.home, token, app.allowed_hosts(bind, port), allowed, act=in_process(inv.home_opt)
    )
    if open_browser:
        with contextlib.suppress(webbrowser.Error):
            webbrowser.open(url)
    app.serve(cfg, sock)
    return ExitCode.OK


def in_process(home_opt: str | None) -> Callable[[str, str], JsonObject]:
    """The page's actions, run in the server's process by the verbs' own code (as `trainctl
    mcp` runs its tools): each in a fresh invocation, its text to a sink of its own (never
    the server's stdout), its --json document kept, and any error as its one line."""

    def act(what: str, name: str) -> JsonObject:
        runs: dict[str, Callable[[Invocation], int]] = {
            "stop": lambda i: verbs.load("stop").run(i, name, as_json=True),
            "restart": lambda i: verbs.load("restart").run(i, name, as_json=True),
            "deploy": lambda i: verbs.load("deploy").run(i, [name], as_json=True),
        }
        text = io.StringIO()  # the verb's own lines go here, never to the server's stdout
        docs: list[Any] = []  # its --json documents, as values
        with render.to(text):
            try:
                code = runs[what](Invocation(home_opt, docs=docs))
                error = None
            except TrainctlError as e:
                code, error = int(exit_code_for(e)), str(e)
        return {
            "ok": code == 0,
            "exit_code": code,
            "error": error,
            "report": docs[0] if len(docs) == 1 else docs or None,
        }

    return act
