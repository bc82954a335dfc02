"""`trainctl web`: a local web page for the runs (launcher/web/), read-only by default."""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import socket
import webbrowser

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.inputs import parse_allow
from trainctl.launcher.web import app
from trainctl.supervisor.errors import ConfigError

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
    cfg = app.WebConfig(inv.home, token, app.allowed_hosts(bind, port), allowed)
    if open_browser:
        with contextlib.suppress(webbrowser.Error):
            webbrowser.open(url)
    app.serve(cfg, sock)
    return ExitCode.OK
